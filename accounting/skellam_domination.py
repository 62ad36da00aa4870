"""A Gaussian trade-off curve that dominates the Skellam shift pair, certified per μ.

The pair ``(Sk(μ) + k, Sk(μ))`` has the trade-off curve ``T_k ≥ G_{k·m₁}`` (f-DP, Dong, Roth
& Su 2019) on every threshold test inside a window, where ``m₁`` is the largest one-step drop
of the probit of the Skellam survival function, ``g(s − 1) − g(s)`` with
``g(s) = Φ⁻¹(P(Sk(μ) ≥ s))``; outside the window a mass ``η`` (a Chernoff bound) is split off as
distinguishable. So a d-coordinate release with integer shift v is dominated by the Gaussian
pair of ``μ_G = m₁·‖v‖₂`` with a mass ``d·η`` split off. Proof and checks:
docs/accounting.md#skellam-in-several-coordinates.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from scipy import special

from .bessel import log_ive
from .errors import TightPathError

__all__ = ["SkellamDomination", "skellam_domination"]

#: The window ends where the Chernoff bound on ``P(Sk(μ) ≥ H − K)`` is below ``e^{-300}`` (the
#: split-off mass per coordinate), which keeps every survival value of the window far above the
#: float64 underflow (``e^{-708}``).
_LOG_SLACK = 300.0
#: The survival sums run this many standard deviations (and 64 points) past the window; the mass
#: left out (Chernoff, and underflowed terms) is checked to be below ``e^{-70}`` of the smallest
#: survival value used.
_SUM_EXTRA_SDS = 6.0
#: The largest window written out, in points (as for the one-coordinate PLD).
_MAX_WINDOW = 1 << 21
#: Relative accuracy assumed of each Skellam mass (scipy ``ive`` and Olver's expansion agree with
#: mpmath to about 1e-13; this is ten times that).
_MASS_RELATIVE_ERROR = 1e-12


@dataclass(frozen=True, slots=True)
class SkellamDomination:
    """``m₁`` (per unit of L2 shift) and ``η`` (split-off mass per moved coordinate) for Sk(μ)
    and integer shifts up to ``max_shift`` per coordinate; ``window`` is the last threshold
    checked."""

    rate: float
    slack: float
    window: int


def _log_chernoff(mu: float, k: float) -> float:
    """``log`` of the Chernoff bound ``2·exp(2μ(cosh t − 1) − t·k)``, ``t = asinh(k/(2μ))``, on
    ``P(|Sk(μ)| ≥ k)`` (also bounds the one-sided tail)."""
    t = math.asinh(k / (2.0 * mu))
    return math.log(2.0) + 2.0 * mu * (math.cosh(t) - 1.0) - t * k


def _window_span(mu: float) -> int:
    """An n (grown by 5 % steps from the standard deviation) whose Chernoff bound on
    ``P(Sk(μ) ≥ n)`` is at most ``e^{-300}``."""
    n = max(8, math.ceil(math.sqrt(2.0 * mu)))
    while _log_chernoff(mu, float(n)) > -_LOG_SLACK:
        n = math.ceil(n * 1.05)
    return n


@functools.lru_cache(maxsize=32)
def skellam_domination(mu: float, max_shift: int) -> SkellamDomination:
    """``m₁`` and ``η`` for ``Sk(mu)`` with integer shifts of at most ``max_shift`` per
    coordinate: every pair ``(Sk(μ) + k, Sk(μ))`` with ``1 ≤ k ≤ max_shift`` is
    Blackwell-dominated by ``((1 − η)·N(k·m₁, 1) ⊕ η·⊤, (1 − η)·N(0, 1) ⊕ η·⊥)``.

    ``m₁`` is the largest drop ``g(s − 1) − g(s)`` over ``1 ≤ s ≤ H`` (the drops are symmetric
    about s = 1), plus a bound on its floating-point error; ``η`` is the Chernoff bound on
    ``P(Sk(μ) ≥ H − max_shift)``.

    Raises:
        TightPathError: the window would exceed 2^21 points, or a mass is not a number.
    """
    import numpy as np

    span = _window_span(mu)
    window = span + max_shift
    last = window + math.ceil(_SUM_EXTRA_SDS * math.sqrt(2.0 * mu)) + 64
    if last > _MAX_WINDOW:
        raise TightPathError(
            f"the Skellam domination of mu = {mu:g} needs {last} points "
            f"(at most {_MAX_WINDOW} are written out)"
        )
    log_mass = log_ive(np.arange(last + 1), 2.0 * mu)
    if np.isnan(log_mass).any():
        raise TightPathError(f"a Skellam mass of mu = {mu:g} is not a number")
    mass = np.exp(log_mass)
    # S(s) = P(Sk(μ) ≥ s) for s = 1..window: sums of positive terms from the far end
    survival = np.cumsum(mass[::-1])[::-1][1 : window + 1]
    smallest = float(survival[-1])
    # left out of the sums: the tail past `last` (Chernoff) and masses lost to underflow
    left_out = max(_log_chernoff(mu, last + 1.0), math.log(last) - 1074.0 * math.log(2.0))
    if not smallest > 0.0 or left_out > math.log(smallest) - 70.0:
        raise TightPathError(f"the Skellam survival of mu = {mu:g} is not resolved in float64")
    # S(0) = (1 + P(0))/2 by symmetry; g(s) = Φ⁻¹(S(s)) for s = 0..window
    head = math.log(0.5 + 0.5 * float(mass[0]))
    log_survival = np.concatenate(([head], np.log(survival)))
    probit = special.ndtri_exp(log_survival)
    drops = probit[:-1] - probit[1:]
    # float error of a drop: two probits, each from a sum of ≤ last terms of relative error
    # ≤ (last·2^-53 + mass error), times the probit's condition dg/dlog S = Φ(g)/φ(g) (at most
    # its largest value here, 1 % added), plus ndtri's few ulps of |g|
    condition = 1.01 * float(
        np.max(np.exp(log_survival + 0.5 * probit * probit + 0.5 * math.log(2.0 * math.pi)))
    )
    sum_error = last * 2.0**-53 + _MASS_RELATIVE_ERROR
    margin = 2.0 * condition * sum_error + 8.0 * 2.0**-52 * float(np.max(np.abs(probit)))
    rate = float(np.max(drops)) + margin
    if not math.isfinite(rate) or rate <= 0.0:
        raise TightPathError(f"the Skellam domination of mu = {mu:g} is not finite")
    slack = min(1.0, math.exp(_log_chernoff(mu, float(span))))
    return SkellamDomination(rate=rate, slack=max(slack, 2.0**-1000), window=window)
