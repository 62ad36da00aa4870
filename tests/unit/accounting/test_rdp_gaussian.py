"""The subsampled-Gaussian RDP against Opacus (oracle only) and an mpmath integral."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpfl.accounting import ORDERS, GaussianEvent, PoissonSampledEvent, rdp_curve
from dpfl.accounting.rdp_gaussian import poisson_subsampled_gaussian_rdp

CASES = [(0.01, 1.1), (0.05, 0.8), (0.2, 2.0), (0.5, 0.6), (0.001, 4.0), (0.9, 1.0)]


def _opacus_rdp(q: float, z: float, orders: list[float]) -> np.ndarray:
    analysis = pytest.importorskip("opacus.accountants.analysis.rdp")
    return np.asarray(analysis.compute_rdp(q=q, noise_multiplier=z, steps=1, orders=orders))


@pytest.mark.parametrize(("q", "z"), CASES)
def test_agrees_with_opacus_to_1e9(q: float, z: float) -> None:
    orders = list(ORDERS)
    ours = poisson_subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=z, orders=orders)
    theirs = _opacus_rdp(q, z, orders)
    # Opacus sums log A in log space, whose absolute rounding error (~1e-13) dominates when
    # (α−1)·RDP = log A is tiny; there the mpmath test below is the referee (ours matches it).
    a = np.asarray(orders)
    finite = np.isfinite(theirs)
    assert np.array_equal(finite, np.isfinite(ours))
    precise = finite & ((a - 1.0) * theirs > 1e-3)
    assert precise.sum() >= 3
    np.testing.assert_allclose(ours[precise], theirs[precise], rtol=1e-9, atol=0.0)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-9, atol=1e-11)


def _mpmath_rdp(q: float, z: float, alpha: float) -> float:
    """log(1 + E[(1+y)^α − 1 − α·y])/(α−1) by adaptive mpmath quadrature, 40 digits."""
    mpmath.mp.dps = 40
    q_, z_, a_ = mpmath.mpf(q), mpmath.mpf(z), mpmath.mpf(alpha)

    def integrand(x: mpmath.mpf) -> mpmath.mpf:
        y = q_ * mpmath.expm1((2 * x - 1) / (2 * z_**2))
        density = mpmath.exp(-(x**2) / (2 * z_**2)) / (z_ * mpmath.sqrt(2 * mpmath.pi))
        return density * ((1 + y) ** a_ - 1 - a_ * y)

    cuts = [-mpmath.inf, -3 * z_, 0, mpmath.mpf(0.5), 1, a_, a_ + 3 * z_, mpmath.inf]
    return float(mpmath.log1p(mpmath.quad(integrand, cuts)) / (a_ - 1))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("q", "z", "alpha"),
    [
        (0.01, 1.0, 1.1),
        (0.01, 1.0, 7.3),
        (0.001, 5.0, 1.5),
        (0.2, 0.3, 3.7),
        (0.5, 2.0, 10.9),
        (0.05, 0.8, 2.0),
        (0.05, 0.8, 16.0),
    ],
)
def test_matches_mpmath_integral_and_stays_above_it(q: float, z: float, alpha: float) -> None:
    exact = _mpmath_rdp(q, z, alpha)
    ours = float(
        poisson_subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=z, orders=[alpha])[0]
    )
    assert ours >= exact
    assert ours <= exact * (1 + 1e-9)


def test_fractional_orders_are_below_dp_accounting() -> None:
    """dp_accounting sums |terms| of an alternating series: safe, never below the exact value."""
    rdp_mod = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    orders = [a for a in ORDERS if not float(a).is_integer()]
    for q, z in CASES:
        ours = poisson_subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=z, orders=orders)
        theirs = rdp_mod._compute_rdp_poisson_subsampled_gaussian(q, z, orders)
        assert np.all(ours <= theirs * (1 + 1e-9))


def test_sampling_rate_one_is_the_gaussian() -> None:
    curve = rdp_curve(PoissonSampledEvent(1.0, GaussianEvent(sigma=2.0, sensitivity=0.5)))
    np.testing.assert_allclose(curve, np.asarray(ORDERS) * 0.25**2 / 2)


def test_sensitivity_scales_the_multiplier() -> None:
    a = rdp_curve(PoissonSampledEvent(0.1, GaussianEvent(sigma=3.0, sensitivity=2.0)))
    b = rdp_curve(PoissonSampledEvent(0.1, GaussianEvent.from_multiplier(1.5)))
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_tiny_noise_uses_the_convexity_bound_and_stays_finite() -> None:
    curve = poisson_subsampled_gaussian_rdp(sampling_rate=0.3, noise_multiplier=0.03, orders=ORDERS)
    assert np.all(np.isfinite(curve[:20]))
    assert np.all(np.diff(curve[np.isfinite(curve)]) >= 0)


def test_large_noise_small_rate_keeps_relative_precision() -> None:
    """A = 1 + tiny: the A − 1 formulation keeps every digit (Opacus would not)."""
    q, z = 1e-4, 20.0
    got = poisson_subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=z, orders=[2.0, 32.0])
    # For tiny q, RDP(α) ≈ C(α,2)·q²·(e^{1/z²} − 1)/(α−1) = α·q²·expm1(1/z²)/2
    approx = np.array([2.0, 32.0]) * q * q * math.expm1(1 / z**2) / 2
    np.testing.assert_allclose(got, approx, rtol=1e-3)
    assert got[0] > 0


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    ("q", "z"), [(1e-6, 1.0), (0.01, 100.0), (0.999, 1.0), (0.5, 0.06), (0.9, 0.2)]
)
def test_extreme_parameters_stay_finite_monotone_and_silent(q: float, z: float) -> None:
    curve = poisson_subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=z, orders=ORDERS)
    assert np.all(np.isfinite(curve))
    assert np.all(curve > 0)
    assert np.all(np.diff(curve) >= -1e-12 * curve[1:])
