"""The tight path is an upper bound: checked against exact profiles computed independently."""

from __future__ import annotations

import math

import pytest
from scipy import optimize, stats

from dpfl.accounting import (
    ComposedEvent,
    DataDependentVotingEvent,
    GaussianEvent,
    InvalidParameterError,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    UnsupportedEventError,
    VotingEvent,
    compute_epsilon,
    gaussian_epsilon,
    supports_tight,
    tight_epsilon,
)

# ----------------------------------------------------------- independent exact profiles


def _exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """Balle & Wang 2018, Thm. 8, written with scipy.stats.norm (no shared code)."""

    def gap(eps: float) -> float:
        d = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        return float(d - delta)

    if gap(0.0) <= 0:
        return 0.0
    return float(optimize.brentq(gap, 0.0, 200.0, xtol=1e-13))


def _exact_subsampled_step_epsilon(q: float, z: float, delta: float) -> float:
    """ε(δ) of ONE Poisson-subsampled Gaussian step, both directions, in closed form.

    P = (1−q)·N(0, z²) + q·N(1, z²), Q = N(0, z²); the loss log(p/q) is increasing in x.
    """
    norm = stats.norm

    def profile(eps: float) -> float:
        x1 = z * z * math.log((math.exp(eps) - (1 - q)) / q) + 0.5
        d1 = (1 - q) * norm.sf(x1 / z) + q * norm.sf((x1 - 1) / z) - math.exp(eps) * norm.sf(x1 / z)
        d2 = 0.0
        if math.exp(-eps) > 1 - q:
            x2 = z * z * math.log((math.exp(-eps) - (1 - q)) / q) + 0.5
            d2 = norm.cdf(x2 / z) - math.exp(eps) * (
                (1 - q) * norm.cdf(x2 / z) + q * norm.cdf((x2 - 1) / z)
            )
        return max(d1, d2)

    return float(optimize.brentq(lambda e: profile(e) - delta, 1e-12, 100.0, xtol=1e-13))


# ----------------------------------------------------------------------- tests


@pytest.mark.parametrize("mu", [0.05, 0.5, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_analytic_gaussian_matches_the_independent_profile(mu: float, delta: float) -> None:
    ours = gaussian_epsilon(mu, delta)
    exact = _exact_gaussian_epsilon(mu, delta)
    assert ours >= exact - 1e-12
    assert ours == pytest.approx(exact, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("sigma", "count"), [(1.0, 1), (4.0, 10), (20.0, 100), (0.8, 3)])
def test_pld_is_never_below_the_exact_gaussian(sigma: float, count: int) -> None:
    event = SelfComposedEvent(GaussianEvent(sigma=sigma, sensitivity=1.0), count)
    exact = _exact_gaussian_epsilon(math.sqrt(count) / sigma, 1e-5)
    pld = tight_epsilon(event, delta=1e-5, force_pld=True)
    assert pld.method == "pld"
    assert exact <= pld.epsilon <= exact * 1.02 + 1e-3
    analytic = tight_epsilon(event, delta=1e-5)
    assert analytic.method == "analytic_gaussian"
    assert analytic.epsilon == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize(("q", "z"), [(0.01, 0.8), (0.1, 1.0), (0.5, 2.0), (0.02, 0.5)])
def test_pld_of_one_subsampled_step_is_never_below_the_exact_profile(q: float, z: float) -> None:
    exact = _exact_subsampled_step_epsilon(q, z, 1e-5)
    got = tight_epsilon(PoissonSampledEvent(q, GaussianEvent.from_multiplier(z)), delta=1e-5)
    assert got.method == "pld"
    assert exact <= got.epsilon <= exact * 1.05 + 2e-3


def test_composed_pld_lies_between_an_optimistic_fine_grid_and_rdp() -> None:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    q, z, steps = 0.01, 1.0, 1000
    event = SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent.from_multiplier(z)), steps)
    optimistic = (
        pld_lib.from_gaussian_mechanism(
            z, sampling_prob=q, value_discretization_interval=1e-4, pessimistic_estimate=False
        )
        .self_compose(steps)
        .get_epsilon_for_delta(1e-5)
    )
    report = compute_epsilon(event, delta=1e-5)
    assert report.method == "pld"
    assert report.tight_epsilon is not None
    assert report.rdp_epsilon is not None
    assert optimistic <= report.tight_epsilon <= report.rdp_epsilon
    assert report.tight_epsilon <= optimistic * 1.03


def test_heterogeneous_composition_is_grouped_and_bounded() -> None:
    a = PoissonSampledEvent(0.01, GaussianEvent.from_multiplier(1.0))
    b = PoissonSampledEvent(0.05, GaussianEvent(sigma=3.0, sensitivity=2.0))
    event = ComposedEvent(
        (SelfComposedEvent(a, 300), SelfComposedEvent(b, 100), GaussianEvent(50.0))
    )
    report = compute_epsilon(event, delta=1e-6)
    assert report.tight_epsilon is not None
    assert report.rdp_epsilon is not None
    assert report.tight_epsilon <= report.rdp_epsilon
    # Composing more can only cost more.
    more = compute_epsilon(ComposedEvent((event, a)), delta=1e-6)
    assert more.epsilon >= report.epsilon


def test_voting_tight_is_the_exact_gaussian() -> None:
    event = VotingEvent(queries=100, sigma=40.0, level="instance")  # sensitivity √2 per query
    got = tight_epsilon(event, delta=1e-5)
    assert got.method == "analytic_gaussian"
    assert got.epsilon == pytest.approx(_exact_gaussian_epsilon(math.sqrt(2 * 100) / 40.0, 1e-5))


def test_compute_epsilon_reports_which_method_won() -> None:
    sgm = SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent.from_multiplier(1.0)), 10000)
    r = compute_epsilon(sgm, delta=1e-5)
    assert r.method == "pld"
    assert r.epsilon == r.tight_epsilon
    assert r.order is not None
    assert r.rdp_epsilon is not None
    assert r.epsilon < r.rdp_epsilon
    only_rdp = compute_epsilon(sgm, delta=1e-5, tight=False)
    assert only_rdp.method == "rdp"
    assert only_rdp.tight_epsilon is None
    assert set(r.to_json()) == {
        "epsilon",
        "delta",
        "method",
        "order",
        "rdp_epsilon",
        "tight_epsilon",
    }
    sk = compute_epsilon(
        ComposedEvent(
            (SkellamEvent(mu=1e4, l1_sensitivity=50.0, l2_sensitivity=10.0, dimension=100),) * 2
        ),
        delta=1e-5,
    )
    assert sk.method == "analytic_gaussian"  # a dominating Gaussian per release
    assert sk.tight_epsilon is not None
    wor = compute_epsilon(
        SampledWithoutReplacementEvent(100, 10, GaussianEvent(2.0, 2.0)), delta=1e-5
    )
    assert wor.method == "rdp"
    gauss = compute_epsilon(GaussianEvent(sigma=5.0), delta=1e-5)
    assert gauss.method == "analytic_gaussian"
    assert gauss.rdp_epsilon is not None
    assert gauss.epsilon < gauss.rdp_epsilon


def test_data_dependent_report_is_flagged() -> None:
    dd = DataDependentVotingEvent(
        (0.9,) * 20, num_agents=100, num_classes=10, sigma=2.0, s=1.0, level="agent"
    )
    r = compute_epsilon(dd, delta=1e-5)
    assert r.data_dependent
    assert not compute_epsilon(VotingEvent(20, 2.0, "agent"), delta=1e-5).data_dependent


def test_unsupported_and_bad_inputs() -> None:
    one = SkellamEvent(mu=10.0, l1_sensitivity=1.0, l2_sensitivity=1.0, dimension=1)
    assert supports_tight(PoissonSampledEvent(0.1, one))  # a bare release is dominated
    sampled_skellams = PoissonSampledEvent(0.1, ComposedEvent((one, one)))
    assert not supports_tight(sampled_skellams)
    with pytest.raises(UnsupportedEventError, match="ComposedEvent"):
        tight_epsilon(sampled_skellams, delta=1e-5)
    with pytest.raises(UnsupportedEventError, match="VotingEvent"):
        compute_epsilon(PoissonSampledEvent(0.1, VotingEvent(1, 1.0, "agent")), delta=1e-5)
    with pytest.raises(InvalidParameterError):
        compute_epsilon(GaussianEvent(1.0), delta=0.0)
    with pytest.raises(InvalidParameterError):
        tight_epsilon(GaussianEvent(1.0), delta=1e-5, value_discretization_interval=0.0)


def test_tight_path_is_skipped_for_enormous_epsilon() -> None:
    from dpfl.accounting.report import TIGHT_MAX_RDP_EPSILON

    r = compute_epsilon(
        SelfComposedEvent(PoissonSampledEvent(0.5, GaussianEvent.from_multiplier(0.3)), 1000),
        delta=1e-5,
    )
    assert r.rdp_epsilon is not None
    assert r.rdp_epsilon > TIGHT_MAX_RDP_EPSILON
    assert r.tight_epsilon is None
    assert r.method == "rdp"
    # below the threshold the PLD is used however large ε is (its grid follows ε)
    big = compute_epsilon(
        SelfComposedEvent(PoissonSampledEvent(0.5, GaussianEvent.from_multiplier(0.5)), 1000),
        delta=1e-5,
    )
    assert big.rdp_epsilon is not None
    assert 64 < big.rdp_epsilon < TIGHT_MAX_RDP_EPSILON
    assert big.method == "pld"
    assert big.tight_epsilon is not None
    assert big.tight_epsilon < big.rdp_epsilon
    # the exact Gaussian profile needs no grid and is always used
    g = compute_epsilon(GaussianEvent(sigma=0.01), delta=1e-5)
    assert g.rdp_epsilon is not None
    assert g.rdp_epsilon > TIGHT_MAX_RDP_EPSILON
    assert g.method == "analytic_gaussian"


def test_adaptive_grid_follows_small_epsilon() -> None:
    """q = 0.001, z = 4, 100 steps: a fixed 1e-3 step gives ~0.011 where the limit is ~0.006."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    from dpfl.accounting.tight import adaptive_pld_epsilon

    q, z, steps = 0.001, 4.0, 100
    event = SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent.from_multiplier(z)), steps)
    fine = (
        pld_lib.from_gaussian_mechanism(z, sampling_prob=q, value_discretization_interval=5e-7)
        .self_compose(steps)
        .get_epsilon_for_delta(1e-5)
    )
    got = tight_epsilon(event, delta=1e-5)
    assert fine * (1 - 1e-9) <= got.epsilon <= fine * 1.01
    assert got.interval is not None
    assert got.interval < 1e-4 * 1.0  # far below the old fixed step
    # without a hint it starts coarse and still gets there; every grid tried is a bound
    adaptive = adaptive_pld_epsilon(event, delta=1e-5)
    assert len(adaptive.tried) > 2
    assert adaptive.epsilon == min(e for _, e in adaptive.tried)
    assert fine * (1 - 1e-9) <= adaptive.epsilon <= fine * 1.01


@pytest.mark.parametrize(
    "event",
    [
        GaussianEvent(sigma=1e-300),
        PoissonSampledEvent(0.1, GaussianEvent(sigma=1e-300)),
        VotingEvent(queries=10, sigma=1e-300, level="agent"),
    ],
)
def test_vanishing_noise_reads_infinity_instead_of_raising(event: object) -> None:
    """A coefficient that overflows is no finite ε (the ledger reads every stored event)."""
    from dpfl.accounting import DpEvent

    assert isinstance(event, DpEvent)
    report = compute_epsilon(event, delta=1e-5)
    assert report.epsilon == math.inf
    assert gaussian_epsilon(math.inf, 1e-5) == math.inf
