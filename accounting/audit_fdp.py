"""One-run auditing against a trade-off curve (f-DP) instead of a single (ε, δ) pair.

Same guessing game as :mod:`dpfl.accounting.audit`; the conversion is the f-DP one-run bound
(Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run"), for two families:
μ-GDP (:func:`gdp_mu_lower_bound`, then ε at δ by :func:`gdp_epsilon`) and (ε, δ)-DP
(:func:`fdp_epsilon_lower_bound`). Pure math; every hypothesis grid is processed as one vector.
Theorem and proof: docs/audit.md#a-tighter-conversion-the-f-dp-one-run-bound-accountingaudit_fdppy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr, ndtr, ndtri

from .audit import GuessOutcome, guess_from_scores
from .errors import InvalidParameterError

__all__ = [
    "MAX_GDP_MU",
    "GdpAuditBound",
    "fdp_epsilon_lower_bound",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_lower_from_scores",
    "gdp_mu_lower_bound",
    "minimal_guess_mass",
]

FloatArray = npt.NDArray[np.float64]
#: Inverse blow-up functions of a family of hypotheses, one per entry of the parameter vector.
InverseBlowUp = Callable[[FloatArray], FloatArray]

#: μ_L is never reported above this (μ = 40 is far beyond any ε a ledger charges).
MAX_GDP_MU = 40.0
#: Relative slack on the mass comparison, so that float rounding never decides a rejection.
_MASS_SLACK = 1e-9


def _check(m: int, r: int, v: int, alpha: float) -> None:
    for name, value in (("m", m), ("r", r), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise InvalidParameterError(f"{name} must be a non-negative integer, got {value!r}")
    if not v <= r <= m or r < 1:
        raise InvalidParameterError(
            f"need correct guesses v ≤ guesses r ≤ canaries m and r ≥ 1, got v={v}, r={r}, m={m}"
        )
    if not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise InvalidParameterError(f"the level must lie in (0, 1), got {alpha!r}")


def minimal_guess_mass(
    inverse: InverseBlowUp, size: int, *, m: int, r: int, v: int, alpha: float
) -> FloatArray:
    """For each of ``size`` hypotheses, the least normalised guess mass ``(1/m)·r·P`` that an
    f-DP mechanism needs for P[W ≥ v] ≥ ``alpha`` (docs/audit.md, the f-DP one-run theorem).

    ``inverse(y)`` is ``F⁻¹(y)`` for the blow-up ``F = 1 − f`` of each hypothesis (a vector of
    ``size``). The hypothesis is rejected at level ``alpha`` where the result exceeds ``r/m``.

    Raises:
        InvalidParameterError: counts out of order, or a level outside (0, 1).
    """
    _check(m, r, v, alpha)
    correct = np.full(size, alpha * v / m)  # A_v: correct-guess mass at W ≥ v
    wrong = np.full(size, alpha * (r - v) / m)  # B_{v+1}: wrong-guess mass at W ≥ v
    for i in range(v - 1, -1, -1):
        needed = np.maximum(wrong, inverse(correct))
        grown = needed - wrong
        if not np.any(grown > 0.0):
            break  # a fixed point: nothing changes at any lower level either
        # capped at 2 > r/m: a capped hypothesis is rejected either way, and floats stay finite
        correct = np.minimum(correct + (i / (r - i)) * grown, 2.0)
        wrong = np.minimum(needed, 2.0)
    return np.asarray(correct + wrong, dtype=np.float64)


def _rejected(
    inverse: InverseBlowUp, params: FloatArray, *, m: int, r: int, v: int, alpha: float
) -> npt.NDArray[np.bool_]:
    mass = minimal_guess_mass(inverse, params.size, m=m, r=r, v=v, alpha=alpha)
    return np.asarray(mass > (r / m) * (1.0 + _MASS_SLACK), dtype=np.bool_)


def _largest_rejected_prefix(
    make_inverse: Callable[[FloatArray], InverseBlowUp],
    *,
    high: float,
    m: int,
    r: int,
    v: int,
    alpha: float,
) -> float:
    """The largest parameter p on a two-level grid of [0, high] such that every grid point up to
    p is rejected (0 when the first is not). The hypotheses are nested (a smaller parameter is
    a stronger claim), so rejection at p implies rejection at every smaller parameter; the grid
    value returned is one that was itself checked."""
    grid = np.linspace(0.0, high, 257)
    rejected = _rejected(make_inverse(grid), grid, m=m, r=r, v=v, alpha=alpha)
    if not rejected[0]:
        return 0.0
    k = int(np.argmin(rejected)) - 1 if not rejected.all() else grid.size - 1
    if k == grid.size - 1:
        return float(grid[-1])
    fine = np.linspace(grid[k], grid[k + 1], 65)
    fine_rejected = _rejected(make_inverse(fine), fine, m=m, r=r, v=v, alpha=alpha)
    j = int(np.argmin(fine_rejected)) - 1 if not fine_rejected.all() else fine.size - 1
    return float(fine[max(j, 0)])


def _gdp_inverse(mus: FloatArray) -> InverseBlowUp:
    """F⁻¹_μ(y) = Φ(Φ⁻¹(y) − μ), the inverse of the Gaussian blow-up Φ(Φ⁻¹(x) + μ)."""

    def inverse(y: FloatArray) -> FloatArray:
        return np.asarray(ndtr(ndtri(np.clip(y, 0.0, 1.0)) - mus), dtype=np.float64)

    return inverse


def gdp_mu_lower_bound(*, m: int, r: int, v: int, confidence: float) -> float:
    """μ_L: "μ-GDP" is rejected at level ``1 − confidence`` for every μ ∈ [0, μ_L].

    Raises:
        InvalidParameterError: bad counts or confidence.
    """
    if not (isinstance(confidence, int | float) and 0.0 < confidence < 1.0):
        raise InvalidParameterError(f"confidence must lie in (0, 1), got {confidence!r}")
    return _largest_rejected_prefix(
        _gdp_inverse, high=MAX_GDP_MU, m=m, r=r, v=v, alpha=1.0 - confidence
    )


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth & Su 2022)."""
    if mu <= 0.0:
        return 0.0
    upper = float(ndtr(-epsilon / mu + mu / 2.0))
    log_lower = float(log_ndtr(-epsilon / mu - mu / 2.0))
    return max(0.0, upper - math.exp(epsilon + log_lower))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The least ε with δ(ε) ≤ ``delta`` for μ-GDP (bisection on the decreasing δ(ε); the
    upper end of the final bracket, so never below the exact value).

    Raises:
        InvalidParameterError: μ < 0 or δ outside (0, 1).
    """
    if not (math.isfinite(mu) and mu >= 0.0):
        raise InvalidParameterError(f"mu must be a finite number >= 0, got {mu!r}")
    if not 0.0 < delta < 1.0:
        raise InvalidParameterError(f"delta must lie in (0, 1), got {delta!r}")
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    low, high = 0.0, 1.0
    while gdp_delta(mu, high) > delta:
        low, high = high, 2.0 * high
    for _ in range(100):
        mid = (low + high) / 2.0
        if gdp_delta(mu, mid) > delta:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return high


def _dp_inverse(delta: float) -> Callable[[FloatArray], InverseBlowUp]:
    """F⁻¹ of f_{ε,δ}: max(0, (y − δ)e^{−ε}, 1 − δ − e^ε(1 − y)), one ε per entry."""

    def make(epsilons: FloatArray) -> InverseBlowUp:
        def inverse(y: FloatArray) -> FloatArray:
            y = np.clip(y, 0.0, 1.0)
            low = (y - delta) * np.exp(-epsilons)
            high = 1.0 - delta - np.exp(epsilons) * (1.0 - y)
            return np.asarray(np.maximum(0.0, np.maximum(low, high)), dtype=np.float64)

        return inverse

    return make


def fdp_epsilon_lower_bound(*, m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """ε_L: "(ε, δ)-DP" (f = f_{ε,δ}) is rejected at level ``1 − confidence`` for every ε in
    [0, ε_L], through the f-DP recursion (the same claim as the Steinke–Nasr–Jagielski bound).

    Raises:
        InvalidParameterError: bad counts, δ or confidence.
    """
    if not (isinstance(confidence, int | float) and 0.0 < confidence < 1.0):
        raise InvalidParameterError(f"confidence must lie in (0, 1), got {confidence!r}")
    if not 0.0 <= delta < 1.0:
        raise InvalidParameterError(f"delta must lie in [0, 1), got {delta!r}")
    return _largest_rejected_prefix(
        _dp_inverse(delta), high=64.0, m=m, r=r, v=v, alpha=1.0 - confidence
    )


@dataclass(frozen=True, slots=True)
class GdpAuditBound:
    """The μ-GDP audit's result.

    Attributes:
        mu_lower: μ_L at ``confidence`` (Bonferroni over the candidate guess counts).
        epsilon_lower: ε of μ_L-GDP at ``delta`` (:func:`gdp_epsilon`).
        confidence: the overall confidence.
        delta: the δ at which μ_L is expressed as ε.
        best: the guesses that gave μ_L (the first candidate when μ_L = 0).
        candidates: every candidate's outcome, in the order tried.
    """

    mu_lower: float
    epsilon_lower: float
    confidence: float
    delta: float
    best: GuessOutcome
    candidates: tuple[GuessOutcome, ...]


def gdp_lower_from_scores(
    scores: npt.ArrayLike,
    included: npt.ArrayLike,
    *,
    delta: float,
    confidence: float,
    guess_counts: Sequence[int],
) -> GdpAuditBound:
    """μ_L (and its ε at δ) from the auditor's per-canary scores, guessing as
    :func:`dpfl.accounting.audit.epsilon_lower_from_scores` does: each candidate r of
    ``guess_counts`` (fixed in advance) guesses ⌈r/2⌉ "in" at the top and ⌊r/2⌋ "out" at the
    bottom, at level ``(1 − confidence)/K`` for K candidates.

    Raises:
        InvalidParameterError: bad scores, counts, δ or confidence.
    """
    s = np.asarray(scores, dtype=np.float64)
    m = int(s.size)
    counts = tuple(guess_counts)
    if not counts:
        raise InvalidParameterError("need at least one candidate number of guesses")
    for r in counts:
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= m:
            raise InvalidParameterError(f"guess count {r!r} must be an integer in [1, {m}]")
    if not (isinstance(confidence, int | float) and 0.0 < confidence < 1.0):
        raise InvalidParameterError(f"confidence must lie in (0, 1), got {confidence!r}")
    per_test = 1.0 - (1.0 - confidence) / len(counts)
    outcomes = []
    best_mu, best = -1.0, None
    for r in counts:
        outcome = guess_from_scores(s, included, positive=(r + 1) // 2, negative=r // 2)
        outcomes.append(outcome)
        mu = gdp_mu_lower_bound(m=m, r=outcome.guesses, v=outcome.correct, confidence=per_test)
        if mu > best_mu:
            best_mu, best = mu, outcome
    assert best is not None
    return GdpAuditBound(
        mu_lower=best_mu,
        epsilon_lower=gdp_epsilon(best_mu, delta),
        confidence=confidence,
        delta=delta,
        best=best,
        candidates=tuple(outcomes),
    )
