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
from typing import Any

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
#: The largest window scanned, in points: about 5 s at μ = 10¹¹ (a shift of 4·10⁶ units added).
_MAX_WINDOW = 1 << 24
#: Points per chunk of the scan (a few MB of float64 whatever the window).
_CHUNK = 1 << 16
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


@dataclass(slots=True)
class _Scan:
    """What the scan from the far end keeps: the running sum ``total`` of the masses of ``s``
    and above, the probit ``below`` of the last threshold done (the lowest s so far), and the
    maxima of the drops, of the condition factor ``Φ(g)/φ(g)`` and of ``|g|``."""

    total: float = 0.0
    below: float = math.nan
    drop: float = -math.inf
    condition: float = 0.0
    size: float = 0.0

    def take(self, log_survival: Any) -> None:
        """Probits of the survival values of the next thresholds down (as logs, highest s
        first): their drops (the first against ``below``), condition factors and sizes."""
        import numpy as np

        probit = special.ndtri_exp(log_survival)
        ladder = probit if math.isnan(self.below) else np.concatenate(([self.below], probit))
        drop = np.max(ladder[1:] - ladder[:-1]) if ladder.size > 1 else -math.inf
        factor = np.exp(log_survival + 0.5 * probit * probit + 0.5 * math.log(2.0 * math.pi))
        # np.max keeps a NaN (Python's max may drop it), so the rate's finiteness check sees it
        self.drop = float(np.max((self.drop, drop)))
        self.condition = float(np.max((self.condition, np.max(factor))))
        self.size = float(np.max((self.size, np.max(np.abs(probit)))))
        self.below = float(probit[-1])


def _scan(mu: float, window: int, last: int) -> _Scan:
    """Probits of ``S(s) = P(Sk(μ) ≥ s)`` for ``s = window … 1``, chunk by chunk from ``last``
    down: each chunk's masses are added to the running sum in the same order as one cumulative
    sum over the whole range (the sum carried into a chunk is its first term), so every S is
    the same float64 sequential sum of at most ``last`` positive terms whatever the chunking.

    Raises:
        TightPathError: a mass is not a number, or ``S(window)`` (the smallest survival used)
            is not resolved above the mass left out of the sums.
    """
    import numpy as np

    scan = _Scan()
    hi = last
    while hi >= 1:
        lo = max(1, hi - _CHUNK + 1)
        log_mass = log_ive(np.arange(hi, lo - 1, -1), 2.0 * mu)
        if np.isnan(log_mass).any():
            raise TightPathError(f"a Skellam mass of mu = {mu:g} is not a number")
        sums = np.cumsum(np.concatenate(([scan.total], np.exp(log_mass))))[1:]
        scan.total = float(sums[-1])
        if lo <= window:
            inside = sums[max(0, hi - window) :]  # S(s) for s = min(hi, window) … lo
            if hi >= window:
                _check_resolved(mu, last, float(inside[0]))
            scan.take(np.log(inside))
        hi = lo - 1
    return scan


def _check_resolved(mu: float, last: int, smallest: float) -> None:
    """Refuse a smallest survival value that the mass left out of the sums (the tail past
    ``last``, Chernoff, and masses lost to underflow) could move by more than e^{-70}."""
    left_out = max(_log_chernoff(mu, last + 1.0), math.log(last) - 1074.0 * math.log(2.0))
    if not smallest > 0.0 or left_out > math.log(smallest) - 70.0:
        raise TightPathError(f"the Skellam survival of mu = {mu:g} is not resolved in float64")


@functools.lru_cache(maxsize=32)
def skellam_domination(mu: float, max_shift: int) -> SkellamDomination:
    """``m₁`` and ``η`` for ``Sk(mu)`` with integer shifts of at most ``max_shift`` per
    coordinate: every pair ``(Sk(μ) + k, Sk(μ))`` with ``1 ≤ k ≤ max_shift`` is
    Blackwell-dominated by ``((1 − η)·N(k·m₁, 1) ⊕ η·⊤, (1 − η)·N(0, 1) ⊕ η·⊥)``.

    ``m₁`` is the largest drop ``g(s − 1) − g(s)`` over ``1 ≤ s ≤ H`` (the drops are symmetric
    about s = 1), plus a bound on its floating-point error; ``η`` is the Chernoff bound on
    ``P(Sk(μ) ≥ H − max_shift)``. The window is scanned in chunks (:func:`_scan`), so memory
    stays a few MB whatever μ.

    Raises:
        TightPathError: the window would exceed 2^24 points, or a mass is not a number.
    """
    import numpy as np

    span = _window_span(mu)
    window = span + max_shift
    last = window + math.ceil(_SUM_EXTRA_SDS * math.sqrt(2.0 * mu)) + 64
    if last > _MAX_WINDOW:
        raise TightPathError(
            f"the Skellam domination of mu = {mu:g} needs {last} points "
            f"(at most {_MAX_WINDOW} are scanned)"
        )
    scan = _scan(mu, window, last)
    # S(0) = (1 + P(0))/2 by symmetry; g(0) closes the drops at s = 1
    mass0 = float(np.exp(log_ive(np.zeros(1), 2.0 * mu))[0])
    scan.take(np.array([math.log(0.5 + 0.5 * mass0)]))
    # float error of a drop: two probits, each from a sequential sum of n ≤ last ≤ 2^24 positive
    # terms, relative error ≤ γ_{n−1} ≤ n·2^-53 (as n² ≤ 2^53) plus the masses' error, times the
    # probit's condition dg/dlog S = Φ(g)/φ(g) (at most its largest value here, 1 % added), plus
    # ndtri's few ulps of |g|
    sum_error = last * 2.0**-53 + _MASS_RELATIVE_ERROR
    condition = 1.01 * scan.condition
    margin = 2.0 * condition * sum_error + 8.0 * 2.0**-52 * scan.size
    rate = scan.drop + margin
    if not math.isfinite(rate) or rate <= 0.0:
        raise TightPathError(f"the Skellam domination of mu = {mu:g} is not finite")
    slack = min(1.0, math.exp(_log_chernoff(mu, float(span))))
    return SkellamDomination(rate=rate, slack=max(slack, 2.0**-1000), window=window)
