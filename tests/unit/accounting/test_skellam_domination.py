"""The Gaussian domination of multi-coordinate Skellam against exact privacy profiles.

Exact references: the Skellam pmf from its Bessel power series in log space (independent of
the scipy/Olver masses the implementation uses), on a window of ±W per coordinate whose outside
mass is added to every exact δ (so the reference is an upper bound on the true δ, never below
it). ``δ(ε)`` of a product pair is summed over every joint outcome of the window, in both
directions. Every admissible integer shift v (‖v‖₁ ≤ Δ₁, ‖v‖₂ ≤ Δ₂) is covered: each is the
image of its sorted absolute values under a permutation of coordinates and sign flips, which
are bijections of the outputs (the noise is i.i.d. and symmetric) and leave δ(ε) unchanged.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from numpy.typing import NDArray
from scipy import special

from dpfl.accounting import (
    ComposedEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
)
from dpfl.accounting import skellam_domination as domination
from dpfl.accounting.bessel import log_ive
from dpfl.accounting.errors import TightPathError, UnsupportedEventError
from dpfl.accounting.skellam_domination import skellam_domination
from dpfl.accounting.tight import gaussian_delta, tight_epsilon, tight_method

Array = NDArray[np.float64]
EPSILONS = np.linspace(0.0, 6.0, 601)
#: Float error of an exact reference δ (a difference of two sums of up to 10^5 masses).
SUM_ERROR = 1e-12


def _logpmf(mu: float, half: int) -> Array:
    """``log P[Sk(mu) = k]`` for k = −half..half, from the Bessel series."""
    n = np.abs(np.arange(-half, half + 1)).astype(np.float64)[:, None]
    m = np.arange(int(4 * mu + 120), dtype=np.float64)[None, :]
    terms = (2 * m + n) * math.log(mu) - special.gammaln(m + 1) - special.gammaln(m + n + 1)
    out: Array = special.logsumexp(terms, axis=1) - 2 * mu
    return out


def _profile(log_p: Array, log_q: Array, epsilons: Array) -> Array:
    """``Σ (P − e^ε Q)_+`` over the given outcomes, at each ε."""
    loss = log_p - log_q
    order = np.argsort(-loss)
    p = np.exp(log_p[order])
    q = np.exp(log_q[order])
    cum_p = np.concatenate(([0.0], np.cumsum(p)))
    cum_q = np.concatenate(([0.0], np.cumsum(q)))
    count = np.searchsorted(-loss[order], -epsilons, side="left")  # outcomes with loss > ε
    out: Array = np.maximum(0.0, cum_p[count] - np.exp(epsilons) * cum_q[count])
    return out


def _joint(one: Array, shift: tuple[int, ...], half: int) -> tuple[Array, Array, float]:
    """Log masses of ``Sk⊗d + shift`` and ``Sk⊗d`` on the window's joint outcomes (those the
    shifted window still covers), and the mass of both laws outside them."""
    d = len(shift)
    idx = np.arange(-half, half + 1)
    grids = np.meshgrid(*([idx] * d), indexing="ij")
    inside = np.ones(grids[0].shape, dtype=bool)
    log_q = np.zeros(grids[0].shape)
    log_p = np.zeros(grids[0].shape)
    for axis, k in enumerate(shift):
        x = grids[axis]
        inside &= np.abs(x - k) <= half
        log_q += one[np.clip(x + half, 0, 2 * half)]
        log_p += one[np.clip(x - k + half, 0, 2 * half)]
    lp, lq = log_p[inside], log_q[inside]
    outside = max(0.0, 1.0 - float(np.exp(lp).sum()), 1.0 - float(np.exp(lq).sum()))
    return lp, lq, outside


def _admissible(d: int, l1: int, l2: float) -> set[tuple[int, ...]]:
    """Every nonzero integer v with ‖v‖₁ ≤ l1 and ‖v‖₂ ≤ l2, as sorted absolute values."""
    out = set()
    for v in itertools.product(range(-l1, l1 + 1), repeat=d):
        if any(v) and sum(map(abs, v)) <= l1 and sum(x * x for x in v) <= l2 * l2 + 1e-12:
            out.add(tuple(sorted(map(abs, v), reverse=True)))
    return out


CASES = [
    (0.05, 2, 2, math.sqrt(2.0)),
    (0.5, 1, 2, 2.0),
    (0.5, 2, 2, math.sqrt(2.0)),
    (2.0, 2, 3, math.sqrt(5.0)),
    (2.0, 3, 3, math.sqrt(3.0)),
    (3.0, 3, 3, 3.0),
    (3.0, 2, 4, math.sqrt(8.0)),
]


def _worst_margins(mu: float, d: int, l1: int, l2: float, scale: float) -> list[float]:
    """For every admissible v: min over ε of (bound − exact) in both directions, where the bound
    is the Gaussian of ``scale·m₁·‖v‖₂`` plus the split-off mass ``d·η``."""
    dom = skellam_domination(mu, l1)
    half = 22 if mu <= 2.0 else 28
    one = _logpmf(mu, half)
    margins = []
    for v in sorted(_admissible(d, l1, l2)):
        lp, lq, outside = _joint(one, v, half)
        m = scale * dom.rate * math.sqrt(sum(x * x for x in v))
        bound = np.array([gaussian_delta(e, m) for e in EPSILONS]) + d * dom.slack
        remove = _profile(lp, lq, EPSILONS) + outside
        add = _profile(lq, lp, EPSILONS) + outside
        margins.append(float(np.min(bound - np.maximum(remove, add))))
    return margins


@pytest.mark.parametrize(("mu", "d", "l1", "l2"), CASES)
def test_dominating_gaussian_is_above_every_admissible_shift(
    mu: float, d: int, l1: int, l2: float
) -> None:
    margins = _worst_margins(mu, d, l1, l2, 1.0)
    assert margins
    assert min(margins) >= -SUM_ERROR


def test_the_check_has_teeth_and_the_bound_is_tight_in_one_coordinate() -> None:
    # one coordinate, shift 1: the Gaussian touches the Skellam curve at the worst threshold
    assert min(_worst_margins(0.5, 1, 1, 1.0, 1.0)) < 1e-4
    # 1 % less m₁ is violated there, and 3 % less in three coordinates
    assert min(_worst_margins(0.5, 1, 1, 1.0, 0.99)) < -1e-6
    assert min(_worst_margins(2.0, 3, 3, math.sqrt(3.0), 0.97)) < -1e-6


def test_same_variance_gaussian_is_not_a_bound_at_small_mu() -> None:
    """The tempting claim "Skellam is dominated by the Gaussian of the same variance" is false:
    at μ = 0.5, shift 1, the exact δ exceeds the Gaussian's of ratio 1/√(2μ)."""
    mu = 0.5
    one = _logpmf(mu, 22)
    lp, lq, _outside = _joint(one, (1,), 22)
    exact = _profile(lp, lq, EPSILONS)
    gauss = np.array([gaussian_delta(e, 1.0 / math.sqrt(2 * mu)) for e in EPSILONS])
    assert np.max(exact - gauss) > 1e-3
    assert skellam_domination(mu, 1).rate * math.sqrt(2 * mu) > 1.2


@pytest.mark.parametrize("mu", [0.05, 0.5, 2.0, 3.0, 40.0])
def test_rate_matches_an_independent_computation(mu: float) -> None:
    half = int(20 * math.sqrt(2 * mu)) + 40
    one = _logpmf(mu, half)[half:]  # k = 0..half
    log_s = np.logaddexp.accumulate(one[::-1])[::-1]  # P(X ≥ s), s = 0..half (half-line)
    log_s[0] = math.log(0.5 + 0.5 * math.exp(one[0]))
    probit = special.ndtri_exp(log_s)
    drops = probit[:-1] - probit[1:]
    rate = skellam_domination(mu, 1).rate
    assert rate >= float(np.max(drops))
    assert rate - float(np.max(drops)) < 1e-9
    # slightly above the Gaussian of the same variance, by about 1/(12μ) relatively
    assert 1.0 < rate * math.sqrt(2 * mu) < 1.0 + 1.0 / (6.0 * mu) + 1e-6


@pytest.mark.parametrize(("gamma", "v"), [(0.3, (1, 1)), (0.3, (2, 1)), (0.9, (2, 0))])
def test_subsampled_pair_is_dominated_by_the_subsampled_gaussian(
    gamma: float, v: tuple[int, int]
) -> None:
    mu, half = 2.0, 22
    dom = skellam_domination(mu, 2)
    one = _logpmf(mu, half)
    lp, lq, outside = _joint(one, v, half)
    log_mix = np.logaddexp(math.log1p(-gamma) + lq, math.log(gamma) + lp)
    remove = _profile(log_mix, lq, EPSILONS) + outside
    add = _profile(lq, log_mix, EPSILONS) + outside
    pld = pld_lib.from_gaussian_mechanism(
        standard_deviation=1.0 / (dom.rate * math.hypot(*v)),
        sensitivity=1.0,
        sampling_prob=gamma,
        pessimistic_estimate=True,
        value_discretization_interval=1e-3,
    )
    grid = EPSILONS[::5]
    bound = np.array([pld.get_delta_for_epsilon(float(e)) for e in grid]) + 2 * dom.slack
    exact = np.maximum(remove, add)[::5]
    assert np.min(bound - exact) >= -SUM_ERROR
    assert np.min(bound - exact) < 1e-3  # and close: a real comparison


def test_issue_row_dp_fedavg_default_noise() -> None:
    """q = 0.001, z = 4, 100 rounds, δ = 1e-5, demo sensitivities: the RDP figure is 7.5× the
    tight one, which sits just above the subsampled Gaussian of the same variance."""
    l2, l1, d, z = 1024.6, 26122.0, 650, 4.0
    mu = (z * l2) ** 2 / 2.0
    event = SelfComposedEvent(PoissonSampledEvent(0.001, SkellamEvent(mu, l1, l2, d)), 100)
    report = compute_epsilon(event, delta=1e-5)
    assert report.method == "pld"
    assert report.rdp_epsilon == pytest.approx(0.0450, abs=5e-5)
    gaussian = compute_epsilon(
        SelfComposedEvent(PoissonSampledEvent(0.001, GaussianEvent(z)), 100), delta=1e-5
    ).epsilon
    assert gaussian == pytest.approx(0.00598, abs=5e-6)
    assert gaussian <= report.epsilon <= gaussian * 1.001
    assert report.rdp_epsilon > 7.4 * report.epsilon


def test_unsampled_release_and_dispatch() -> None:
    many = SkellamEvent(mu=100.0, l1_sensitivity=3.0, l2_sensitivity=3.0, dimension=10)
    assert tight_method(many) == "analytic_gaussian"
    dom = skellam_domination(100.0, 3)
    report = compute_epsilon(many, delta=1e-5)
    assert report.rdp_epsilon is not None
    assert report.epsilon < report.rdp_epsilon
    # the Gaussian of m₁·Δ at δ minus the split-off mass, which is negligible
    assert gaussian_delta(report.epsilon, dom.rate * 3.0) + 10 * dom.slack <= 1e-5
    # a bound of L1 below L2 caps the L2 norm too: ‖v‖₂ ≤ ‖v‖₁
    capped = SkellamEvent(mu=100.0, l1_sensitivity=3.0, l2_sensitivity=9.0, dimension=10)
    assert tight_epsilon(capped, delta=1e-5).epsilon == tight_epsilon(many, delta=1e-5).epsilon
    # no integer shift fits below one unit: nothing is released about anyone
    assert tight_epsilon(SkellamEvent(100.0, 0.5, 0.5, 10), delta=1e-5).epsilon == 0.0


def test_rdp_fallback_where_the_domination_cannot_be_computed() -> None:
    # σ of about 7.7·10^5 units: the window needs more than 2^24 points
    noise = SkellamEvent(mu=3e11, l1_sensitivity=5e4, l2_sensitivity=1e4, dimension=100)
    huge = PoissonSampledEvent(0.01, noise)
    with pytest.raises(TightPathError, match="points"):
        tight_epsilon(huge, delta=1e-5)
    report = compute_epsilon(huge, delta=1e-5)
    assert report.method == "rdp_fallback"
    assert report.epsilon == report.rdp_epsilon
    # a sampled composition of Skellam releases keeps RDP (only a bare release is dominated)
    composed = PoissonSampledEvent(0.01, ComposedEvent((SkellamEvent(100.0, 1.0, 1.0, 2),) * 2))
    with pytest.raises(UnsupportedEventError, match="ComposedEvent"):
        tight_epsilon(composed, delta=1e-5)
    assert compute_epsilon(composed, delta=1e-5).method == "rdp"


def _one_shot_rate(mu: float, max_shift: int) -> float:
    """``m₁`` with every point of the window written out at once: one cumulative sum from the
    far end, then the probits, drops and float margin over whole arrays."""
    span = domination._window_span(mu)
    window = span + max_shift
    last = window + math.ceil(domination._SUM_EXTRA_SDS * math.sqrt(2.0 * mu)) + 64
    mass = np.exp(log_ive(np.arange(last + 1), 2.0 * mu))
    survival = np.cumsum(mass[::-1])[::-1][1 : window + 1]
    log_survival = np.concatenate(([math.log(0.5 + 0.5 * float(mass[0]))], np.log(survival)))
    probit = special.ndtri_exp(log_survival)
    factor = np.exp(log_survival + 0.5 * probit * probit + 0.5 * math.log(2.0 * math.pi))
    condition = 1.01 * float(np.max(factor))
    sum_error = last * 2.0**-53 + domination._MASS_RELATIVE_ERROR
    margin = 2.0 * condition * sum_error + 8.0 * 2.0**-52 * float(np.max(np.abs(probit)))
    return float(np.max(probit[:-1] - probit[1:])) + margin


@pytest.mark.parametrize(
    ("mu", "max_shift", "chunk"),
    [
        (0.5, 2, 1 << 16),
        (40.0, 1, 7),  # chunks of 7 points: many chunk boundaries inside the window
        (40.0, 5, 1),
        (1e5, 5, 1000),
        (8.4e6, 26122, 1 << 16),
        (1e8, 4, 1 << 16),  # about 3·10^5 points: several chunks of the default size
    ],
)
def test_chunked_scan_equals_the_one_shot_computation(
    mu: float, max_shift: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan adds the masses in the one-shot cumulative sum's order, so the rate is the same
    float64 number, whatever the chunk size."""
    monkeypatch.setattr(domination, "_CHUNK", chunk)
    skellam_domination.cache_clear()
    try:
        assert skellam_domination(mu, max_shift).rate == _one_shot_rate(mu, max_shift)
    finally:
        skellam_domination.cache_clear()
