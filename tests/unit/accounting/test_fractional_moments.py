"""The fractional-order moment bound (accounting/rdp_moments.py) against exact moments."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from dpfl.accounting.rdp_gaussian import poisson_subsampled_gaussian_rdp
from dpfl.accounting.rdp_moments import fractional_moment_log_bound

ALPHAS = (1.1, 1.5, 2.3, 2.5, 3.7, 6.3, 9.9)


def _log_moment(x: np.ndarray, w: np.ndarray, a: float) -> float:
    return float(special.logsumexp(a * np.log(x), b=w))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_never_below_the_exact_moment_of_a_discrete_law(seed: int) -> None:
    """Random laws on [1 − γ, ∞) with mean 1 (the shape of 1 − γ + γL), exact integer moments."""
    rng = np.random.default_rng(seed)
    gamma = float(rng.choice([0.01, 0.1, 0.5, 0.9]))
    lower = 1.0 - gamma
    k = int(rng.integers(2, 7))
    x = lower + rng.exponential(0.3, size=k) * rng.choice([0.1, 1.0, 5.0], size=k)
    w = rng.dirichlet(np.ones(k))
    # shift one atom so that the mean is exactly 1 (keeps every atom ≥ lower)
    x = lower + (x - lower) * (1.0 - lower) / float(np.sum(w * (x - lower)))
    assert float(np.sum(w * x)) == pytest.approx(1.0, rel=1e-12)
    for a in ALPHAS:
        n = math.floor(a)
        moments = {j: _log_moment(x, w, j) for j in range(2, n + 7)}
        bound = fractional_moment_log_bound(a, lower, moments)
        assert bound >= _log_moment(x, w, a) - 1e-12
        # the bound is also usable with looser inputs (monotone in the moments)
        looser = fractional_moment_log_bound(a, lower, {j: v * 1.1 for j, v in moments.items()})
        assert looser >= _log_moment(x, w, a) - 1e-12


@pytest.mark.parametrize(("q", "z"), [(0.05, 0.8), (0.01, 1.0), (0.3, 1.54), (0.9, 2.0)])
def test_subsampled_gaussian_exact_moments(q: float, z: float) -> None:
    """Fed the exact integer moments of the subsampled Gaussian (MTZ 2019), the bound is never
    below its exact fractional-order moment and beats the convexity interpolation at small α."""
    ints = tuple(float(j) for j in range(2, 18))
    curve = poisson_subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=z, orders=ints)
    cgf = {int(a): float((a - 1) * r) for a, r in zip(ints, curve, strict=True)}
    for a in (1.3, 2.5, 3.5, 6.5):
        n = math.floor(a)
        bound = fractional_moment_log_bound(a, 1 - q, {j: cgf[j] for j in range(2, n + 7)})
        exact = (a - 1) * float(
            poisson_subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=z, orders=(a,))[0]
        )
        assert bound >= exact * (1 - 1e-9)
        if a < 3:
            t = a - n
            interpolated = (1 - t) * cgf.get(n, 0.0) + t * cgf[n + 1]
            assert bound < interpolated


def test_refuses_what_it_cannot_bound() -> None:
    assert fractional_moment_log_bound(2.5, 0.9, {2: 0.1}) == math.inf  # no moment above α
    assert fractional_moment_log_bound(2.5, 0.0, {2: 0.1, 3: 0.3}) == math.inf  # lower must be > 0
    assert fractional_moment_log_bound(2.5, 0.9, {2: 0.1, 3: math.inf}) == math.inf
