"""Skellam, voting and subsampling bounds, each against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from dpfl.accounting import (
    ORDERS,
    DataDependentVotingEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SkellamEvent,
    VotingEvent,
    epsilon_from_rdp_plain,
    guaranteed_event,
    rdp_curve,
)
from dpfl.accounting.rdp_gaussian import poisson_subsampled_gaussian_rdp
from dpfl.accounting.rdp_mechanisms import skellam_rdp_integer, voting_rdp_coefficient
from dpfl.accounting.rdp_subsampling import (
    poisson_general_rdp,
    without_replacement_gaussian_rdp,
    without_replacement_general_rdp,
)

# ---------------------------------------------------------------- Skellam


def _skellam_divergence_1d(shift: int, mu: float, alpha: int) -> float:
    """Exact D_α(Sk(mu) + shift ‖ Sk(mu)) with Sk(mu) = Poisson(mu) − Poisson(mu).

    pmf(k) = e^{−2mu}·I_k(2mu) = ive(|k|, 2mu) (scipy's exponentially scaled Bessel function).
    """
    s = math.sqrt(2 * mu)
    k = np.arange(-int(abs(shift) + 40 * s + 40), int(abs(shift) + 40 * s + 40))
    with np.errstate(divide="ignore"):
        lp = np.log(special.ive(np.abs(k - shift), 2 * mu))
        lq = np.log(special.ive(np.abs(k), 2 * mu))
    ok = np.isfinite(lp) & np.isfinite(lq)
    return float(special.logsumexp(alpha * lp[ok] + (1 - alpha) * lq[ok]) / (alpha - 1))


@pytest.mark.parametrize("mu", [0.5, 5.0, 50.0, 5000.0])
@pytest.mark.parametrize("shift", [(1,), (3,), (1, 1, 1, 1), (2, 1), (5, 5, 0)])
def test_skellam_bound_dominates_the_exact_divergence(mu: float, shift: tuple[int, ...]) -> None:
    d = np.asarray(shift)
    event = SkellamEvent(
        mu=mu,
        l1_sensitivity=float(np.abs(d).sum()),
        l2_sensitivity=float(np.sqrt((d**2).sum())),
        dimension=len(shift),
    )
    for alpha in (2, 3, 8, 32):
        # independent coordinates: divergences add
        exact = sum(_skellam_divergence_1d(int(x), mu, alpha) for x in shift)
        assert exact <= skellam_rdp_integer(event, alpha) * (1 + 1e-12)


def test_skellam_tends_to_the_gaussian_of_variance_2mu() -> None:
    orders = np.asarray(ORDERS)
    integer = (orders == np.floor(orders)) & (orders <= 64)
    ratios = []
    for mu in (1e2, 1e4, 1e6):
        event = SkellamEvent(mu=mu, l1_sensitivity=30.0, l2_sensitivity=5.0, dimension=100)
        gaussian = rdp_curve(GaussianEvent(sigma=math.sqrt(2 * mu), sensitivity=5.0))
        curve = rdp_curve(event)
        assert np.all(curve >= gaussian)
        ratios.append(float(np.max(curve[integer] / gaussian[integer])))
    assert ratios[0] > ratios[1] > ratios[2]
    assert ratios[2] < 1 + 1e-4


def test_skellam_formula_and_sensitivity_tightening() -> None:
    mu, alpha = 10.0, 4
    e = SkellamEvent(mu=mu, l1_sensitivity=3.0, l2_sensitivity=2.0, dimension=4)
    v = 2 * mu
    expected = alpha * 4 / (2 * v) + min(((2 * alpha - 1) * 4 + 18) / (4 * v * v), 9 / (2 * v))
    assert skellam_rdp_integer(e, alpha) == pytest.approx(expected, rel=1e-14)
    # L1 above √d·L2 is tightened to √d·L2; L2 above L1 is tightened to L1.
    loose = SkellamEvent(mu=mu, l1_sensitivity=100.0, l2_sensitivity=1.0, dimension=4)
    tight = SkellamEvent(mu=mu, l1_sensitivity=2.0, l2_sensitivity=1.0, dimension=4)
    assert skellam_rdp_integer(loose, alpha) == skellam_rdp_integer(tight, alpha)
    loose2 = SkellamEvent(mu=mu, l1_sensitivity=1.0, l2_sensitivity=9.0, dimension=4)
    tight2 = SkellamEvent(mu=mu, l1_sensitivity=1.0, l2_sensitivity=1.0, dimension=4)
    assert skellam_rdp_integer(loose2, alpha) == skellam_rdp_integer(tight2, alpha)


def test_skellam_fractional_orders_interpolate_the_cgf() -> None:
    e = SkellamEvent(mu=3.0, l1_sensitivity=2.0, l2_sensitivity=1.5, dimension=2)
    curve = rdp_curve(e, orders=[2.0, 2.5, 3.0])
    k2, k3 = 1 * curve[0], 2 * curve[2]
    assert curve[1] == pytest.approx((0.5 * k2 + 0.5 * k3) / 1.5)
    assert rdp_curve(e, orders=[1.5])[0] == pytest.approx(0.5 * k2 / 0.5)


# ---------------------------------------------------------------- voting


def _closed_form(rho: float, delta: float) -> float:
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


@pytest.mark.parametrize(
    ("event", "rho"),
    [
        (VotingEvent(queries=200, sigma=40.0, level="agent"), 200 / (2 * 40.0**2)),
        (VotingEvent(queries=200, sigma=40.0, level="instance"), 200 / 40.0**2),
        (VotingEvent(queries=50, sigma=8.0, level="instance", k=5), 50 / (5 * 8.0**2)),
        (VotingEvent(queries=50, sigma=8.0, level="agent", k=5), 50 / (2 * 8.0**2)),
    ],
)
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_voting_equals_its_closed_form_under_the_plain_conversion(
    event: VotingEvent, rho: float, delta: float
) -> None:
    assert voting_rdp_coefficient(event) == pytest.approx(rho, rel=1e-15)
    # ρ·α + log(1/δ)/(α−1) is minimal at α* = 1 + √(log(1/δ)/ρ): put α* on the grid.
    star = 1 + math.sqrt(math.log(1 / delta) / rho)
    orders = sorted({*ORDERS, star})
    eps, order = epsilon_from_rdp_plain(rdp_curve(event, orders), delta=delta, orders=orders)
    assert order == pytest.approx(star)
    assert eps == pytest.approx(_closed_form(rho, delta), rel=1e-12)
    on_grid, _ = epsilon_from_rdp_plain(rdp_curve(event), delta=delta)
    assert _closed_form(rho, delta) <= on_grid <= 1.01 * _closed_form(rho, delta)


def _dd_single(g: float, n: int, c: int, sigma: float, s: float, alpha: float) -> float:
    """docs/algorithms.md#pate-fl, written out independently."""
    return c * math.exp(-(n**2) * g**2 / (8 * sigma**2)) + math.log1p(
        math.exp(
            (2 * alpha - 1) * sigma**2 / (2 * s**2) - n**2 * g**2 / (16 * sigma**2) + math.log(c)
        )
    ) / (alpha - 1)


def test_data_dependent_is_the_per_query_minimum() -> None:
    margins = (0.9, 0.6, 0.3, 0.0)
    e = DataDependentVotingEvent(
        margins, num_agents=100, num_classes=10, sigma=1.5, s=1.0, level="instance"
    )
    orders = [1.5, 2.0, 5.0, 20.0]
    got = rdp_curve(e, orders)
    independent = np.asarray(orders) / 1.5**2  # instance level, k = 1: α/σ²
    for j, a in enumerate(orders):
        per_query = []
        for g in margins:
            p = 10 * math.exp(-(100**2) * g**2 / (8 * 1.5**2))
            dep = _dd_single(g, 100, 10, 1.5, 1.0, a) if (g > 0 and p < 1) else math.inf
            per_query.append(min(dep, independent[j]))
        assert got[j] == pytest.approx(sum(per_query), rel=1e-12)
    # strong agreement makes the data-dependent charge much smaller than the guarantee
    guaranteed = rdp_curve(guaranteed_event(e), orders)
    assert np.all(got <= guaranteed)
    assert got[0] < 0.5 * guaranteed[0]


def test_data_dependent_falls_back_outside_its_valid_range() -> None:
    """C·exp(−N²γ²/(8σ²)) ≥ 1: the bound is meaningless there, so the guarantee is charged."""
    e = DataDependentVotingEvent(
        (0.05, 0.0), num_agents=10, num_classes=10, sigma=2.0, s=0.5, level="agent"
    )
    assert 10 * math.exp(-(10**2) * 0.05**2 / (8 * 4.0)) >= 1
    np.testing.assert_array_equal(rdp_curve(e), rdp_curve(guaranteed_event(e)))
    assert guaranteed_event(e) == VotingEvent(queries=2, sigma=2.0, level="agent", k=2)


def test_data_dependent_with_sigma_below_s_uses_the_larger_ratio() -> None:
    e = DataDependentVotingEvent(
        (1.0,), num_agents=50, num_classes=3, sigma=0.5, s=1.0, level="agent"
    )
    orders = [2.0]
    got = rdp_curve(e, orders)[0]
    printed = _dd_single(1.0, 50, 3, 0.5, 1.0, 2.0)
    swapped = 3 * math.exp(-(50**2) / (8 * 0.25)) + math.log1p(
        math.exp(3 * (1.0 / 0.25) / 2 - 50**2 / (16 * 0.25) + math.log(3))
    )
    assert got == pytest.approx(min(max(printed, swapped), 2.0 / (2 * 0.25)), rel=1e-12)


# ---------------------------------------------------------------- subsampling


@pytest.mark.parametrize(("q", "z"), [(0.01, 1.0), (0.1, 0.7), (0.3, 2.0)])
def test_general_poisson_bound_dominates_the_exact_gaussian_one(q: float, z: float) -> None:
    top = 64
    inner = np.arange(top + 1) / (2 * z * z)
    exact = poisson_subsampled_gaussian_rdp(
        sampling_rate=q, noise_multiplier=z, orders=range(2, top + 1)
    )
    general = np.array([poisson_general_rdp(q, inner, a) for a in range(2, top + 1)])
    assert np.all(general >= exact * (1 - 1e-9))
    assert general[0] == pytest.approx(exact[0], rel=1e-9)  # Thm. 6 is exact at α = 2


def test_poisson_sampled_skellam_uses_the_general_bound_and_is_below_unsampled() -> None:
    sk = SkellamEvent(mu=50.0, l1_sensitivity=10.0, l2_sensitivity=3.0, dimension=20)
    sampled = rdp_curve(PoissonSampledEvent(0.05, sk))
    assert np.all(sampled <= rdp_curve(sk))
    assert sampled[ORDERS.index(8.0)] < 0.1 * rdp_curve(sk)[ORDERS.index(8.0)]


def _mixture_divergence(gamma: float, a: float, b: float, alpha: int) -> float:
    """D_α((1−γ)N(0,1) + γN(a,1) ‖ (1−γ)N(0,1) + γN(b,1)) on a fine grid."""
    x = np.linspace(-40.0, 40.0 + max(abs(a), abs(b)) * alpha, 400_001)
    step = x[1] - x[0]
    log_phi = -0.5 * x**2 - 0.5 * math.log(2 * math.pi)
    lp = np.logaddexp(
        math.log1p(-gamma) + log_phi,
        math.log(gamma) - 0.5 * (x - a) ** 2 - 0.5 * math.log(2 * math.pi),
    )
    lq = np.logaddexp(
        math.log1p(-gamma) + log_phi,
        math.log(gamma) - 0.5 * (x - b) ** 2 - 0.5 * math.log(2 * math.pi),
    )
    return float((special.logsumexp(alpha * lp + (1 - alpha) * lq) + math.log(step)) / (alpha - 1))


@pytest.mark.parametrize(("n", "m", "z"), [(1000, 50, 0.8), (200, 20, 2.0)])
def test_without_replacement_bound_lies_between_a_witness_pair_and_theorem_9(
    n: int, m: int, z: float
) -> None:
    """z is std / replace-one sensitivity. Witness: one record switches between +Δ/2 and −Δ/2
    (others 0), included with probability γ = m/n: a lower bound on the true RDP."""
    gamma = m / n
    alphas = [2, 3, 5, 8, 12]
    ours = without_replacement_gaussian_rdp(
        population=n, sample_size=m, noise_multiplier=z, alphas=alphas
    )
    inner = np.arange(max(alphas) + 1) / (2 * z * z)
    theorem9 = np.array([without_replacement_general_rdp(gamma, inner, a) for a in alphas])
    for j, a in enumerate(alphas):
        witness = _mixture_divergence(gamma, 0.5 / z, -0.5 / z, a)
        assert witness <= ours[j] <= theorem9[j] * (1 + 1e-12)


def test_dp_accounting_replace_one_semantics_are_pinned() -> None:
    """Upstream issue #378 / PR #464: dp_accounting may start treating the multiplier of a
    GaussianDpEvent under replace-one as relative to the clip norm (halving it internally). We
    pass std / replace-one sensitivity; this pins that its Thm.-27 values stay between the
    witness lower bound and Theorem 9 for exactly that meaning."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    n, m, z = 1000, 50, 1.0
    acc = rdp_privacy_accountant.RdpAccountant(
        orders=[2.0, 4.0, 8.0], neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    acc.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.GaussianDpEvent(z))
    )
    inner = np.arange(9) / (2 * z * z)
    for j, a in enumerate([2, 4, 8]):
        assert _mixture_divergence(m / n, 0.5 / z, -0.5 / z, a) <= acc.rdp[j]
        assert acc.rdp[j] <= without_replacement_general_rdp(m / n, inner, a) * (1 + 1e-12)


def test_uniform_gaussian_full_sample_is_the_replace_one_gaussian() -> None:
    e = SampledWithoutReplacementEvent(100, 100, GaussianEvent(sigma=1.5, sensitivity=2.0))
    np.testing.assert_allclose(rdp_curve(e), np.asarray(ORDERS) * 4 / (2 * 1.5**2), rtol=1e-12)


def test_without_replacement_of_skellam_uses_theorem_9() -> None:
    sk = SkellamEvent(mu=50.0, l1_sensitivity=10.0, l2_sensitivity=3.0, dimension=20)
    curve = rdp_curve(SampledWithoutReplacementEvent(1000, 10, sk))
    assert np.all(curve <= rdp_curve(sk))
    assert np.all(np.isfinite(curve))
