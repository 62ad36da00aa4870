"""The Poisson-subsampled Skellam bound against numerically exact Rényi divergences.

The reference divergences are computed from the Skellam pmf itself, in both directions
(``D_α(mix‖Q)``, "remove", and ``D_α(Q‖mix)``, "add") for 1-D and 2-D shifts, at integer and
fractional orders. The pmf is ``e^{−2μ}·I_|k|(2μ)`` with the Bessel function summed as its
power series in log space (positive terms: no cancellation, no underflow of the far tail, where
``Q^{1−α}`` is huge and dropping an underflowed term would under-state the divergence). The window
is wide enough that the summands at its edges are below 1e−40 of the total and still falling by
more than half per step, which the helper asserts: beyond it they fall faster than geometrically
(the Skellam pmf ratio ``p(k+1)/p(k)`` tends to 0), so the truncation is far below the 1e−9
tolerance of the comparisons.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import special

from dpfl.accounting import (
    ComposedEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
    epsilon_from_rdp,
    rdp_curve,
)
from dpfl.accounting.rdp_gaussian import poisson_subsampled_gaussian_rdp
from dpfl.accounting.rdp_mechanisms import skellam_rdp_integer
from dpfl.accounting.rdp_subsampling import poisson_general_rdp, poisson_symmetric_rdp

Array = NDArray[np.float64]


def _skellam_logpmf(k: NDArray[np.int64], mu: float) -> Array:
    """``log P[Sk(mu) = k]``: ``−2μ + log Σ_m μ^{2m+|k|}/(m!·(m+|k|)!)``."""
    n = np.abs(k).astype(np.float64)[:, None]
    m = np.arange(int(4 * mu + 80), dtype=np.float64)[None, :]
    terms = (2 * m + n) * math.log(mu) - special.gammaln(m + 1) - special.gammaln(m + n + 1)
    out: Array = special.logsumexp(terms, axis=1) - 2 * mu
    return out


def _checked_logsumexp(log_terms: Array) -> float:
    """log Σ exp(terms) over a window, asserting the window's edges are negligible and falling."""
    total = float(special.logsumexp(log_terms))
    for axis in range(log_terms.ndim):
        for edge, inner in ((0, 1), (-1, -2)):
            e = np.take(log_terms, edge, axis=axis)
            i = np.take(log_terms, inner, axis=axis)
            assert np.max(e) < total - 92.0  # < 1e−40 of the sum
            assert np.all(e < i - math.log(2.0))  # still falling by more than half per step
    return total


def _exact_both_directions(
    q: float, mu: float, shift: tuple[int, ...], alphas: list[float]
) -> list[tuple[float, float]]:
    """``[(D_α(mix‖Q), D_α(Q‖mix)) for α]`` with Q = Sk(μ)^d, mix = (1−q)·Q + q·(Q + shift)."""
    s = max(abs(x) for x in shift)
    width = int(max(alphas) * s + 12 * math.sqrt(2 * mu) * math.log(mu + 3) + 60)
    k = np.arange(-width, width + 1)
    lq_1d = _skellam_logpmf(k, mu)
    lq = np.zeros([k.size] * len(shift))
    lp = np.zeros_like(lq)
    for axis, v in enumerate(shift):
        shape = [1] * len(shift)
        shape[axis] = k.size
        lq = lq + lq_1d.reshape(shape)
        lp = lp + _skellam_logpmf(k - v, mu).reshape(shape)
    lm = np.logaddexp(math.log1p(-q) + lq, math.log(q) + lp)
    out = []
    for a in alphas:
        remove = _checked_logsumexp(a * lm + (1 - a) * lq) / (a - 1)
        add = _checked_logsumexp(a * lq + (1 - a) * lm) / (a - 1)
        out.append((remove, add))
    return out


def _event(mu: float, shift: tuple[int, ...]) -> SkellamEvent:
    v = np.asarray(shift, dtype=np.float64)
    return SkellamEvent(
        mu=mu,
        l1_sensitivity=float(np.abs(v).sum()),
        l2_sensitivity=float(np.sqrt((v * v).sum())),
        dimension=len(shift),
    )


ALPHAS = [1.5, 2.0, 2.7, 3.0, 5.0, 6.3, 8.0]


@pytest.mark.slow
@pytest.mark.parametrize("q", [0.01, 0.3, 0.9])
@pytest.mark.parametrize("mu", [0.5, 3.0, 30.0])
@pytest.mark.parametrize("shift", [(1,), (4,), (1, 1), (3, -2)])
def test_bound_is_never_below_the_exact_divergence_in_either_direction(
    q: float, mu: float, shift: tuple[int, ...]
) -> None:
    sampled = PoissonSampledEvent(q, _event(mu, shift))
    bound = rdp_curve(sampled, orders=ALPHAS)
    for a, b, (remove, add) in zip(
        ALPHAS, bound, _exact_both_directions(q, mu, shift, ALPHAS), strict=True
    ):
        assert remove <= b, (a, remove, b)
        assert add <= b, (a, add, b)
        # the lemma behind the bound: for a symmetric pair, add ≤ remove at every order
        assert add <= remove * (1 + 1e-9) + 1e-15, (a, add, remove)


def test_bound_is_the_exact_remove_expansion_when_fed_the_exact_inner_divergences() -> None:
    """With the exact D_j of the shifted pair as ``inner``, the bound equals the exact remove
    divergence at integer orders: the expansion is an identity, not an inequality."""
    q, mu, shift, top = 0.3, 2.0, 2, 8
    k = np.arange(-200, 201)
    lq, lp = _skellam_logpmf(k, mu), _skellam_logpmf(k - shift, mu)
    inner = np.zeros(top + 1)
    for j in range(2, top + 1):
        inner[j] = _checked_logsumexp(j * lp + (1 - j) * lq) / (j - 1)
    exact = _exact_both_directions(q, mu, (shift,), [float(a) for a in range(2, top + 1)])
    for a in range(2, top + 1):
        remove = exact[a - 2][0]
        expansion = poisson_symmetric_rdp(q, inner, a) / (1 + 1e-11)
        assert expansion == pytest.approx(remove, rel=1e-9)


def test_the_add_direction_needs_the_symmetry_hypothesis() -> None:
    """A non-symmetric pair whose add direction exceeds its remove direction: the lemma (and so
    the use of the remove expansion for both directions) really needs the hypothesis."""
    q, alpha = 0.9, 3.0
    p, qq = np.array([0.999, 0.001]), np.array([0.5, 0.5])
    m = (1 - q) * qq + q * p
    remove = math.log(np.sum(m**alpha * qq ** (1 - alpha))) / (alpha - 1)
    add = math.log(np.sum(qq**alpha * m ** (1 - alpha))) / (alpha - 1)
    assert add > remove


@pytest.mark.parametrize("q", [1e-4, 0.05, 0.5, 0.95])
@pytest.mark.parametrize("alpha", [1.01, 1.5, 2.0, 3.7, 10.0, 64.0, 1024.0])
def test_the_symmetrised_difference_is_nonnegative(q: float, alpha: float) -> None:
    """The pointwise inequality of the proof: ψ(a) − b·ψ(t/b) ≥ 0, a = 1−q+qt, b = (1−q)t+q.

    Checked as ``F(1) ≥ F(b)`` with ``F(s) = s·ψ(1 + h/s)``, ``h = q(t−1)`` on t ≥ 1, in the
    normalised form ``1 − F(b)/F(1)`` (no cancellation between huge powers)."""
    t = np.exp(np.linspace(1e-6, 30.0 / max(1.0, math.log2(alpha)), 4001))
    h = q * (t - 1.0)
    b = t - h

    def log_f(s: Array) -> Array:
        log_x = np.log1p(h / s)  # ψ(x) = x^α·(1 − x^{1−2α}) > 0 for x = 1 + h/s > 1
        out: Array = np.log(s) + alpha * log_x + np.log(-np.expm1((1 - 2 * alpha) * log_x))
        return out

    assert np.all(log_f(b) <= log_f(np.ones_like(b)) + 1e-12)


def test_rdp_curve_uses_the_symmetric_bound_only_for_a_bare_skellam_event() -> None:
    sk = SkellamEvent(mu=500.0, l1_sensitivity=40.0, l2_sensitivity=8.0, dimension=30)
    q, top = 0.2, 16
    inner = np.zeros(top + 1)
    inner[2:] = [skellam_rdp_integer(sk, m) for m in range(2, top + 1)]
    orders = [float(a) for a in range(2, top + 1)]
    symmetric = [poisson_symmetric_rdp(q, inner, a) for a in range(2, top + 1)]
    general = [poisson_general_rdp(q, inner, a) for a in range(2, top + 1)]
    got = rdp_curve(PoissonSampledEvent(q, sk), orders=orders)
    np.testing.assert_allclose(got, np.minimum(symmetric, general), rtol=1e-14)
    assert np.all(got[1:] < np.asarray(general[1:]))  # strictly tighter from α = 3 on
    # A composition of Skellam releases on one sample may be adaptive: general bound only.
    composed = rdp_curve(PoissonSampledEvent(q, ComposedEvent((sk, sk))), orders=orders)
    inner2 = 2 * inner
    np.testing.assert_allclose(
        composed, [poisson_general_rdp(q, inner2, a) for a in range(2, top + 1)], rtol=1e-14
    )


def test_large_mu_tends_to_the_exact_subsampled_gaussian_from_above() -> None:
    """The Skellam bound dominates the Gaussian RDP term by term, so the subsampled bound is
    never below the exact subsampled Gaussian of the same variance, and meets it as μ grows."""
    q, orders = 0.3, [float(a) for a in range(2, 65)]
    for mu, tol in ((1e3, 5e-2), (1e6, 1e-4)):
        l2 = math.sqrt(2 * mu) / 1.5  # noise multiplier 1.5
        sk = SkellamEvent(mu=mu, l1_sensitivity=25.0 * l2, l2_sensitivity=l2, dimension=650)
        got = rdp_curve(PoissonSampledEvent(q, sk), orders=orders)
        gauss = poisson_subsampled_gaussian_rdp(
            sampling_rate=q, noise_multiplier=1.5, orders=orders
        )
        assert np.all(got >= gauss)
        assert np.max(got / gauss) < 1 + tol


def test_digits_demo_noise_multiplier() -> None:
    """The demo (q = 0.3, 10 rounds, δ = 1e−5, d = 650, 10 scale bits): z = 1.54 meets ε ≤ 4
    under the new bound, as the subsampled Gaussian's RDP does; the general bound needed
    z ≈ 2.05 (at z = 1.54 it gives ε > 5)."""
    l1, l2, d, q, z, rounds = 26121.904810076725, 1024.5854027599573, 650, 0.3, 1.54, 10
    sk = SkellamEvent(mu=(z * l2) ** 2 / 2, l1_sensitivity=l1, l2_sensitivity=l2, dimension=d)
    event = SelfComposedEvent(PoissonSampledEvent(q, sk), rounds)
    report = compute_epsilon(event, delta=1e-5, tight=False)
    assert 3.9 < report.epsilon <= 4.0
    # the tight path (a dominating Gaussian) reaches the subsampled Gaussian's PLD: 3.52
    tight = compute_epsilon(event, delta=1e-5)
    assert tight.method == "pld"
    assert tight.epsilon == pytest.approx(3.523, abs=2e-3)
    gaussian = compute_epsilon(
        SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent.from_multiplier(z)), rounds),
        delta=1e-5,
        tight=False,
    )
    assert report.epsilon == pytest.approx(gaussian.epsilon, rel=1e-3)

    orders = [float(a) for a in range(2, 65)]
    inner = np.zeros(65)
    inner[2:] = [skellam_rdp_integer(sk, m) for m in range(2, 65)]
    general = [rounds * poisson_general_rdp(q, inner, a) for a in range(2, 65)]
    old, _ = epsilon_from_rdp(general, delta=1e-5, orders=orders)
    assert old > 5.0


def test_fractional_orders_come_close_to_the_gaussian() -> None:
    """q = 0.05, 500 rounds, z = 0.8 (demo sensitivities): the convexity interpolation between
    integer orders gave 14.68 where the subsampled Gaussian's exact RDP gives 13.34; the moment
    bound at fractional orders brings the Skellam figure within 1.5 % of it."""
    l1, l2, d, q, z, rounds = 26121.904810076725, 1024.5854027599573, 650, 0.05, 0.8, 500
    sk = SkellamEvent(mu=(z * l2) ** 2 / 2, l1_sensitivity=l1, l2_sensitivity=l2, dimension=d)
    event = SelfComposedEvent(PoissonSampledEvent(q, sk), rounds)
    report = compute_epsilon(event, delta=1e-5, tight=False)
    gaussian = compute_epsilon(
        SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent.from_multiplier(z)), rounds),
        delta=1e-5,
        tight=False,
    )
    assert report.method == "rdp"
    assert report.order is not None
    assert not float(report.order).is_integer()
    assert gaussian.epsilon <= report.epsilon <= gaussian.epsilon * 1.015
