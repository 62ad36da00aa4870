"""The f-DP one-run bound (``dpfl.accounting.audit_fdp``): the recursion on hand-checked cases,
nesting of the hypotheses, the GDP-to-ε conversion, and Monte-Carlo checks that a true μ (or ε)
is rejected no more often than 1 − confidence while the bound stays informative."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpfl.accounting import GaussianEvent, InvalidParameterError
from dpfl.accounting.audit import epsilon_lower_bound, guess_from_scores
from dpfl.accounting.audit_fdp import (
    fdp_epsilon_lower_bound,
    gdp_delta,
    gdp_epsilon,
    gdp_lower_from_scores,
    gdp_mu_lower_bound,
    minimal_guess_mass,
)
from dpfl.accounting.tight import tight_epsilon


def _identity(y: np.ndarray) -> np.ndarray:
    return np.asarray(y, dtype=np.float64)


def test_recursion_on_two_canaries_of_a_perfectly_private_mechanism() -> None:
    # F⁻¹(y) = y (0-GDP): two right guesses out of two have probability exactly 1/4.
    # α = 1/2: A=1/2, B=0 → (1, 1/2) → (1, 1): mass 2 > r/m = 1, rejected (1/4 < 1/2).
    assert minimal_guess_mass(_identity, 1, m=2, r=2, v=2, alpha=0.5)[0] == pytest.approx(2.0)
    # α = 1/4: (1/4, 0) → (1/2, 1/4) → (1/2, 1/2): mass 1 = r/m, not rejected (tight).
    assert minimal_guess_mass(_identity, 1, m=2, r=2, v=2, alpha=0.25)[0] == pytest.approx(1.0)


def test_hypotheses_are_nested_and_the_bound_grows_with_correct_guesses() -> None:
    mus = np.linspace(0.0, 3.0, 31)

    def inverse(y: np.ndarray) -> np.ndarray:
        from scipy.special import ndtr, ndtri

        return np.asarray(ndtr(ndtri(np.clip(y, 0, 1)) - mus), dtype=np.float64)

    mass = minimal_guess_mass(inverse, mus.size, m=2000, r=400, v=330, alpha=0.05)
    assert all(a >= b - 1e-15 for a, b in itertools.pairwise(mass))  # stronger claim, more mass
    values = [gdp_mu_lower_bound(m=2000, r=400, v=v, confidence=0.95) for v in (200, 260, 300, 350)]
    assert values[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("mu", [0.3, 1.0, 2.5])
def test_gdp_epsilon_is_the_exact_gaussian_profile(mu: float) -> None:
    delta = 1e-5
    eps = gdp_epsilon(mu, delta)
    assert gdp_delta(mu, eps) <= delta < gdp_delta(mu, eps * (1 - 1e-6))
    # μ-GDP is the Gaussian mechanism of sensitivity μ and std 1 (the analytic profile)
    exact = tight_epsilon(GaussianEvent(sigma=1.0, sensitivity=mu), delta=delta).epsilon
    assert eps == pytest.approx(exact, rel=1e-3)


def test_bad_input_is_named() -> None:
    with pytest.raises(InvalidParameterError, match="v ≤ guesses r"):
        gdp_mu_lower_bound(m=10, r=5, v=6, confidence=0.95)
    with pytest.raises(InvalidParameterError, match="confidence"):
        gdp_mu_lower_bound(m=10, r=5, v=4, confidence=1.0)
    with pytest.raises(InvalidParameterError, match="delta"):
        fdp_epsilon_lower_bound(m=10, r=5, v=4, delta=1.0, confidence=0.9)
    with pytest.raises(InvalidParameterError, match="mu"):
        gdp_epsilon(-1.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="guess count"):
        gdp_lower_from_scores(
            [0.1, 0.2], [True, False], delta=1e-5, confidence=0.9, guess_counts=[3]
        )


@pytest.mark.parametrize(("mu", "r"), [(1.0, 100), (2.0, 100)])
def test_false_positive_rate_on_the_gaussian_mechanism(mu: float, r: int) -> None:
    """Canary i shifts its own coordinate of N(0, I) by μ: exactly μ-GDP per canary."""
    rng = np.random.default_rng(20240601)
    m, trials, confidence = 1000, 300, 0.95
    lowers = []
    for _ in range(trials):
        included = rng.random(m) < 0.5
        scores = rng.normal(size=m) + mu * included
        outcome = guess_from_scores(scores, included, positive=(r + 1) // 2, negative=r // 2)
        lowers.append(gdp_mu_lower_bound(m=m, r=r, v=outcome.correct, confidence=confidence))
    assert np.mean(np.asarray(lowers) > mu) <= 1 - confidence
    assert float(np.median(lowers)) > 0.4 * mu  # informative, not vacuous


def test_gdp_bound_catches_a_mechanism_leakier_than_claimed() -> None:
    # canaries shifted by 2 while the claim would be μ = 1: the audit rejects μ = 1
    rng = np.random.default_rng(7)
    m = 2000
    included = rng.random(m) < 0.5
    scores = rng.normal(size=m) + 2.0 * included
    bound = gdp_lower_from_scores(
        scores, included, delta=1e-5, confidence=0.95, guess_counts=[100, 400]
    )
    assert bound.mu_lower > 1.0
    assert bound.epsilon_lower == pytest.approx(gdp_epsilon(bound.mu_lower, 1e-5))
    assert bound.best in bound.candidates


@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_eps_delta_family_keeps_its_level_on_randomized_response(eps: float) -> None:
    rng = np.random.default_rng(11)
    m, trials = 1000, 200
    q = 1 / (1 + math.exp(-eps))
    exceed = 0
    for _ in range(trials):
        included = rng.random(m) < 0.5
        told = np.where(rng.random(m) < q, included, ~included)
        scores = told + 1e-3 * rng.random(m)  # ties broken at random, not by the bits
        outcome = guess_from_scores(scores, included, positive=m // 2, negative=m - m // 2)
        exceed += (
            fdp_epsilon_lower_bound(m=m, r=m, v=outcome.correct, delta=0.0, confidence=0.95) > eps
        )
    assert exceed / trials <= 0.05


def test_eps_delta_family_is_close_to_the_steinke_nasr_jagielski_bound() -> None:
    for r, v in ((500, 430), (1000, 800), (200, 190)):
        snj = epsilon_lower_bound(m=10_000, r=r, v=v, delta=1e-5, confidence=0.95)
        fdp = fdp_epsilon_lower_bound(m=10_000, r=r, v=v, delta=1e-5, confidence=0.95)
        assert fdp == pytest.approx(snj, rel=0.05)
