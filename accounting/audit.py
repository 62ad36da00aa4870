"""One-run privacy auditing: from correct guesses about random canaries to a lower bound on ε.

Steinke, Nasr & Jagielski 2023 ("Privacy auditing with one (1) training run"): ε_lower is the
largest ε whose (ε, δ)-DP hypothesis, and that of every smaller ε, is rejected at level
1 − confidence given v correct guesses out of r. Binomial tails are summed exactly in log space
so that far tails are not lost to cancellation. Theorem and proof:
docs/audit.md#from-guesses-to-ε-accountingauditpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import gammaln, logsumexp

from .errors import InvalidParameterError

__all__ = [
    "AuditBound",
    "GuessOutcome",
    "audit_p_value",
    "binomial_log_pmf",
    "binomial_tail",
    "default_guess_counts",
    "epsilon_lower_bound",
    "epsilon_lower_from_scores",
    "guess_from_scores",
    "planned_guess_count",
]

#: Width of the ε grid on which the p-value envelope is checked (then refined by bisection).
_GRID_STEP = 1.0 / 32.0
#: ε_lower is never reported above this (a mechanism that leaks everything; the search stops).
MAX_AUDIT_EPSILON = 64.0


def _check_counts(m: int, r: int, v: int) -> None:
    for name, value in (("m", m), ("r", r), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise InvalidParameterError(f"{name} must be a non-negative integer, got {value!r}")
    if not v <= r <= m:
        raise InvalidParameterError(
            f"need correct guesses v ≤ guesses r ≤ canaries m, got v={v}, r={r}, m={m}"
        )


def _check_probability(name: str, value: float, *, open_low: bool, open_high: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidParameterError(f"{name} must be a finite number, got {value!r}")
    low_ok = value > 0 if open_low else value >= 0
    high_ok = value < 1 if open_high else value <= 1
    if not (low_ok and high_ok):
        raise InvalidParameterError(f"{name} must lie in [0, 1] (open where needed), got {value}")


def binomial_log_pmf(n: int, q: float) -> npt.NDArray[np.float64]:
    """``log P[Binomial(n, q) = k]`` for k = 0..n, exact up to float rounding (log space)."""
    k = np.arange(n + 1, dtype=np.float64)
    log_choose = gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)
    if q <= 0.0:
        out = np.full(n + 1, -np.inf)
        out[0] = 0.0
        return out
    if q >= 1.0:
        out = np.full(n + 1, -np.inf)
        out[n] = 0.0
        return out
    return np.asarray(log_choose + k * math.log(q) + (n - k) * math.log1p(-q), dtype=np.float64)


def binomial_tail(n: int, q: float, u: int) -> float:
    """``P[Binomial(n, q) ≥ u]``, summed over the tail's own terms (no 1 − cdf cancellation)."""
    if u <= 0:
        return 1.0
    if u > n:
        return 0.0
    log_pmf = binomial_log_pmf(n, q)
    return float(min(1.0, math.exp(float(logsumexp(log_pmf[u:])))))


def _tails(n: int, q: float) -> npt.NDArray[np.float64]:
    """``P[Binomial(n, q) ≥ u]`` for u = 0..n+1 (reverse cumulative sums of the pmf)."""
    log_pmf = binomial_log_pmf(n, q)
    reverse = np.logaddexp.accumulate(log_pmf[::-1])[::-1]
    tails = np.minimum(1.0, np.exp(reverse))
    return np.concatenate([tails, [0.0]])


def _q(epsilon: float) -> float:
    """Accuracy of ε-DP randomized response, e^ε/(1+e^ε)."""
    return 1.0 / (1.0 + math.exp(-epsilon))


def _delta_term(tails_high: npt.NDArray[np.float64], low_at_v: float, v: int) -> float:
    """``max_{1≤i≤v} (tails_high[v−i] − low_at_v)/i`` (0 when v = 0)."""
    if v == 0:
        return 0.0
    i = np.arange(1, v + 1, dtype=np.float64)
    gaps = np.maximum(tails_high[v - np.arange(1, v + 1)] - low_at_v, 0.0)
    return float(np.max(gaps / i))


def audit_p_value(*, m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The p-value of "(ε, δ)-DP" after v correct out of r guesses on m canaries.

    Raises:
        InvalidParameterError: counts out of order, ε < 0, δ outside [0, 1].
    """
    _check_counts(m, r, v)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise InvalidParameterError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    _check_probability("delta", delta, open_low=False, open_high=False)
    tails = _tails(r, _q(epsilon))
    p = tails[v] + 2.0 * m * delta * _delta_term(tails, float(tails[v]), v)
    return float(min(1.0, p))


def _envelope(m: int, r: int, v: int, delta: float, low: float, high: float) -> float:
    """An upper bound on :func:`audit_p_value` for EVERY ε in [low, high].

    Binomial(r, q) grows stochastically with q, so on the cell β_ε(v) ≤ β_high(v) and
    β_ε(v−i) − β_ε(v) ≤ β_high(v−i) − β_low(v)."""
    tails_high = _tails(r, _q(high))
    tails_low_v = float(_tails(r, _q(low))[v])
    p = tails_high[v] + 2.0 * m * delta * _delta_term(tails_high, tails_low_v, v)
    return float(min(1.0, p))


def epsilon_lower_bound(*, m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """The largest ε_L such that "(ε, δ)-DP" is rejected at level ``1 − confidence`` for every
    ε in [0, ε_L] (0 when even ε = 0 is not rejected).

    Every ε of [0, ε_L] is covered, not only grid points: the grid's cells are checked with
    :func:`_envelope`, an upper bound on the p-value over the whole cell, and the last cell is
    refined by bisection on the same envelope. So if the mechanism is (ε*, δ)-DP, ε_L > ε*
    implies the test at ε* rejected, which has probability ≤ 1 − confidence.

    Raises:
        InvalidParameterError: bad counts, δ, or a confidence outside (0, 1).
    """
    _check_counts(m, r, v)
    _check_probability("delta", delta, open_low=False, open_high=False)
    _check_probability("confidence", confidence, open_low=True, open_high=True)
    alpha = 1.0 - confidence
    if audit_p_value(m=m, r=r, v=v, epsilon=0.0, delta=delta) >= alpha:
        return 0.0
    low = 0.0
    while low < MAX_AUDIT_EPSILON:
        high = low + _GRID_STEP
        if _envelope(m, r, v, delta, low, high) >= alpha:
            break
        low = high
    else:
        return MAX_AUDIT_EPSILON
    # [0, low] is covered; find the largest x in [low, low + step] with envelope(low, x) < α.
    good, bad = low, low + _GRID_STEP
    for _ in range(30):
        mid = (good + bad) / 2.0
        if _envelope(m, r, v, delta, low, mid) < alpha:
            good = mid
        else:
            bad = mid
    return good


@dataclass(frozen=True, slots=True)
class GuessOutcome:
    """One set of guesses: r guesses (``positive`` "in", the rest "out"), v of them correct."""

    guesses: int
    positive: int
    correct: int


def guess_from_scores(
    scores: npt.ArrayLike, included: npt.ArrayLike, *, positive: int, negative: int
) -> GuessOutcome:
    """Guess "in" for the ``positive`` highest scores and "out" for the ``negative`` lowest,
    abstain on the rest; count the correct guesses against ``included``.

    Ties are broken by index (stable sort), never by the inclusion bits.

    Raises:
        InvalidParameterError: shapes differ, or more guesses than canaries.
    """
    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    if s.ndim != 1 or s.shape != inc.shape:
        raise InvalidParameterError("scores and inclusion bits must be vectors of one length")
    if not np.isfinite(s).all():
        raise InvalidParameterError("scores must be finite")
    if positive < 0 or negative < 0 or positive + negative > s.size:
        raise InvalidParameterError(f"{positive} + {negative} guesses do not fit {s.size} canaries")
    order = np.argsort(-s, kind="stable")
    top = order[:positive]
    bottom = order[s.size - negative :] if negative else order[:0]
    correct = int(inc[top].sum()) + int((~inc[bottom]).sum())
    return GuessOutcome(guesses=positive + negative, positive=positive, correct=correct)


def default_guess_counts(m: int) -> tuple[int, ...]:
    """Candidate numbers of guesses, fixed before any output is seen: about m/100 to m, split
    evenly between "in" and "out" guesses."""
    if m < 1:
        raise InvalidParameterError(f"need at least one canary, got m={m}")
    fractions = (0.01, 0.03, 0.1, 0.3, 1.0)
    counts = sorted({max(1, round(f * m)) for f in fractions})
    return tuple(counts)


@dataclass(frozen=True, slots=True)
class AuditBound:
    """The audit's result.

    Attributes:
        epsilon_lower: ε_L at ``confidence`` (Bonferroni over the candidate guess counts).
        confidence: the overall confidence.
        delta: the δ of the tested hypotheses.
        canaries: m.
        best: the guesses that gave ε_L (the first candidate when ε_L = 0).
        candidates: every candidate's outcome, in the order tried.
    """

    epsilon_lower: float
    confidence: float
    delta: float
    canaries: int
    best: GuessOutcome
    candidates: tuple[GuessOutcome, ...]


def epsilon_lower_from_scores(
    scores: npt.ArrayLike,
    included: npt.ArrayLike,
    *,
    delta: float,
    confidence: float,
    guess_counts: Sequence[int] | None = None,
) -> AuditBound:
    """ε_L from the auditor's per-canary scores (higher = more likely included).

    Each candidate r of ``guess_counts`` (fixed in advance; default
    :func:`default_guess_counts`) guesses ⌈r/2⌉ "in" at the top and ⌊r/2⌋ "out" at the bottom,
    and is tested at level ``(1 − confidence)/K`` for K candidates (union bound), so the maximum
    over candidates holds at ``confidence`` overall.

    Raises:
        InvalidParameterError: bad scores, counts, δ or confidence.
    """
    s = np.asarray(scores, dtype=np.float64)
    m = int(s.size)
    counts = tuple(default_guess_counts(m) if guess_counts is None else guess_counts)
    if not counts:
        raise InvalidParameterError("need at least one candidate number of guesses")
    for r in counts:
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= m:
            raise InvalidParameterError(f"guess count {r!r} must be an integer in [1, {m}]")
    _check_probability("confidence", confidence, open_low=True, open_high=True)
    per_test = 1.0 - (1.0 - confidence) / len(counts)
    outcomes = []
    best_eps, best = -1.0, None
    for r in counts:
        outcome = guess_from_scores(s, included, positive=(r + 1) // 2, negative=r // 2)
        outcomes.append(outcome)
        eps = epsilon_lower_bound(
            m=m, r=outcome.guesses, v=outcome.correct, delta=delta, confidence=per_test
        )
        if eps > best_eps:
            best_eps, best = eps, outcome
    assert best is not None
    return AuditBound(
        epsilon_lower=best_eps,
        confidence=confidence,
        delta=delta,
        canaries=m,
        best=best,
        candidates=tuple(outcomes),
    )


def planned_guess_count(
    *,
    m: int,
    shift_over_std: float,
    delta: float,
    confidence: float,
    lower_bound: Callable[[int, int, int], float] | None = None,
) -> int:
    """The number of guesses to make, chosen BEFORE any output is seen, from the public plan.

    For canaries whose score is ``N(shift, 1)`` when included and ``N(0, 1)`` when not (Dirac
    canaries under Gaussian-like noise: ``shift_over_std`` = the canary's amplitude over the
    summed noise std), the expected outcome of each candidate r is put into
    :func:`epsilon_lower_bound` (or ``lower_bound(m, r, v)``, any bound that grows with its
    result, e.g. the μ of :func:`dpfl.accounting.audit_fdp.gdp_mu_lower_bound`) and the best r
    is returned. Using it needs no union bound: the choice depends on the plan only, never on
    the canaries' scores.

    Raises:
        InvalidParameterError: m < 2 or a shift that is not a positive finite number.
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    if m < 2:
        raise InvalidParameterError(f"need at least two canaries, got m={m}")
    if not (math.isfinite(shift_over_std) and shift_over_std > 0):
        raise InvalidParameterError(f"shift_over_std must be positive, got {shift_over_std!r}")
    best_r, best_eps = m, -1.0
    fractions = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
    for fraction in fractions:
        half = max(1, round(fraction * m / 2))
        if 2 * half > m:
            half = m // 2
        share = half / m

        def excess(t: float, share: float = share) -> float:
            return float(0.5 * norm.sf(t - shift_over_std) + 0.5 * norm.sf(t) - share)

        t = brentq(excess, -40.0, 40.0 + shift_over_std)
        precision = 0.5 * float(norm.sf(t - shift_over_std)) / share
        r = 2 * half
        v = min(r, math.floor(precision * r))
        if lower_bound is None:
            eps = epsilon_lower_bound(m=m, r=r, v=v, delta=delta, confidence=confidence)
        else:
            eps = lower_bound(m, r, v)
        if eps > best_eps:
            best_r, best_eps = r, eps
    return best_r
