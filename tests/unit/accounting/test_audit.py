"""The one-run audit bound (``dpfl.accounting.audit``): exact tails, monotonicity, and a
Monte-Carlo check that it rejects a true ε no more often than 1 − confidence."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from dpfl.accounting import InvalidParameterError
from dpfl.accounting.audit import (
    audit_p_value,
    binomial_tail,
    epsilon_lower_bound,
    epsilon_lower_from_scores,
    guess_from_scores,
    planned_guess_count,
)


@pytest.mark.parametrize(("n", "q", "u"), [(10, 0.5, 7), (500, 0.73, 400), (2000, 0.6, 1500)])
def test_binomial_tail_matches_scipy(n: int, q: float, u: int) -> None:
    assert binomial_tail(n, q, u) == pytest.approx(float(binom.sf(u - 1, n, q)), rel=1e-9)


def test_binomial_tail_far_tail_is_not_lost() -> None:
    # P[Bin(1000, 0.5) = 1000] = 2^-1000: 1 - cdf would give 0.
    assert binomial_tail(1000, 0.5, 1000) == pytest.approx(2.0**-1000, rel=1e-9)


def test_p_value_at_delta_zero_is_the_binomial_tail() -> None:
    q = 1 / (1 + math.exp(-1.0))
    p = audit_p_value(m=100, r=100, v=80, epsilon=1.0, delta=0.0)
    assert p == pytest.approx(float(binom.sf(79, 100, q)), rel=1e-9)


def test_delta_term_is_the_maximum_over_i() -> None:
    m, r, v, eps, delta = 1000, 200, 150, 0.5, 1e-4
    q = 1 / (1 + math.exp(-eps))
    tail = [float(binom.sf(u - 1, r, q)) for u in range(v + 1)]
    term = max((tail[v - i] - tail[v]) / i for i in range(1, v + 1))
    expected = tail[v] + 2 * m * delta * term
    p = audit_p_value(m=m, r=r, v=v, epsilon=eps, delta=delta)
    assert p == pytest.approx(expected, rel=1e-9)


def test_lower_bound_grows_with_correct_guesses_and_shrinks_with_delta_and_confidence() -> None:
    values = [
        epsilon_lower_bound(m=1000, r=1000, v=v, delta=0, confidence=0.95)
        for v in (500, 550, 600, 700, 800, 900, 990)
    ]
    assert values[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(values))
    base = epsilon_lower_bound(m=1000, r=1000, v=800, delta=0.0, confidence=0.95)
    with_delta = epsilon_lower_bound(m=1000, r=1000, v=800, delta=1e-4, confidence=0.95)
    stricter = epsilon_lower_bound(m=1000, r=1000, v=800, delta=0.0, confidence=0.99)
    assert with_delta < base
    assert stricter < base


def test_lower_bound_is_below_the_empirical_accuracy_and_near_it_for_many_guesses() -> None:
    # 7300 correct of 10000 is the accuracy of 1-DP randomized response: ε_L just below 1.
    eps = epsilon_lower_bound(m=10_000, r=10_000, v=7300, delta=0.0, confidence=0.95)
    assert 0.9 < eps < 1.0
    # at ε_L the hypothesis is rejected, a little above it is not
    assert audit_p_value(m=10_000, r=10_000, v=7300, epsilon=eps, delta=0.0) < 0.05
    assert audit_p_value(m=10_000, r=10_000, v=7300, epsilon=eps + 0.01, delta=0.0) >= 0.05


def test_bad_input_is_named() -> None:
    with pytest.raises(InvalidParameterError, match="v ≤ guesses r"):
        epsilon_lower_bound(m=10, r=5, v=6, delta=0, confidence=0.95)
    with pytest.raises(InvalidParameterError, match="confidence"):
        epsilon_lower_bound(m=10, r=5, v=5, delta=0, confidence=1.0)
    with pytest.raises(InvalidParameterError, match="delta"):
        audit_p_value(m=10, r=5, v=5, epsilon=1.0, delta=2.0)
    with pytest.raises(InvalidParameterError, match="do not fit"):
        guess_from_scores([1.0, 2.0], [True, False], positive=2, negative=1)


def test_guesses_are_counted_from_both_ends() -> None:
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    included = [True, False, True, False, False, True]
    outcome = guess_from_scores(scores, included, positive=2, negative=2)
    # "in" for 5, 4 (one right), "out" for 1, 0 (one right)
    assert (outcome.guesses, outcome.correct) == (4, 2)


def _randomized_response(eps: float, m: int, rng: np.random.Generator) -> tuple:
    included = rng.random(m) < 0.5
    keep = rng.random(m) < 1 / (1 + math.exp(-eps))
    reported = np.where(keep, included, ~included)
    # scores: the reported bit plus a tie-breaking jitter independent of the inclusion bits
    return reported.astype(float) + 0.01 * rng.random(m), included


@pytest.mark.slow
@pytest.mark.parametrize(("eps", "delta"), [(1.0, 0.0), (2.0, 1e-5)])
def test_false_positive_rate_is_at_most_one_minus_confidence(eps: float, delta: float) -> None:
    """Randomized response is exactly ε-DP (so (ε, δ)-DP): the audit may claim more than ε in
    at most 5 % of runs at confidence 0.95. With every canary guessed the bound is nearly
    tight, so the rate is close to 5 %, which also shows the bound is not vacuous."""
    rng = np.random.default_rng(20230508)
    m, trials, confidence = 400, 400, 0.95
    above = 0
    lowers = []
    for _ in range(trials):
        scores, included = _randomized_response(eps, m, rng)
        bound = epsilon_lower_from_scores(
            scores, included, delta=delta, confidence=confidence, guess_counts=[m]
        )
        lowers.append(bound.epsilon_lower)
        above += bound.epsilon_lower > eps
    rate = above / trials
    # binomial(400, 0.05) exceeds 0.075 with probability < 1 %
    assert rate <= 0.075
    assert float(np.median(lowers)) > 0.6 * eps  # the audit is not vacuous


@pytest.mark.slow
def test_bonferroni_candidates_keep_the_overall_confidence() -> None:
    rng = np.random.default_rng(7)
    above = 0
    for _ in range(200):
        scores, included = _randomized_response(1.0, 300, rng)
        bound = epsilon_lower_from_scores(scores, included, delta=0.0, confidence=0.9)
        above += bound.epsilon_lower > 1.0
        assert len(bound.candidates) == 5
    assert above / 200 <= 0.1 + 0.05


def test_planned_guess_count_beats_guessing_everything_on_gaussian_canaries() -> None:
    m, shift = 4000, 0.5
    r = planned_guess_count(m=m, shift_over_std=shift, delta=1e-5, confidence=0.95)
    assert 2 <= r < m
    rng = np.random.default_rng(3)
    planned, everything = [], []
    for _ in range(5):
        included = rng.random(m) < 0.5
        scores = shift * included + rng.normal(size=m)
        for counts, out in (([r], planned), ([m], everything)):
            bound = epsilon_lower_from_scores(
                scores, included, delta=1e-5, confidence=0.95, guess_counts=counts
            )
            out.append(bound.epsilon_lower)
    assert np.mean(planned) > np.mean(everything)
