"""Tight (ε, δ): the exact Gaussian privacy profile, and pessimistic PLD composition.

Compositions of Gaussians on the same data use the closed-form profile (``"analytic_gaussian"``);
Poisson-subsampled Gaussians and one-coordinate Skellam releases use dp_accounting's pessimistic
PLD (``"pld"``) on a grid refined until the remaining excess is small. Each event adds itself to
these parts (:meth:`DpEvent.add_tight_parts`); one that has no tight path is reported by RDP
only. Why each figure is an upper bound: docs/accounting.md#the-tight-path and
docs/accounting.md#the-pld-grid-follows-ε.

A PLD computation that fails raises :class:`~dpfl.accounting.errors.TightPathError` (never an
``IndexError`` of the library, never a figure read off a broken distribution);
:func:`dpfl.accounting.compute_epsilon` then reports the RDP bound (method ``"rdp_fallback"``).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from scipy import optimize, special

from .bessel import log_ive
from .errors import AccountingError, InvalidParameterError, TightPathError, UnsupportedEventError
from .event_protocol import DpEvent, TightParts, flatten_tight
from .skellam_domination import skellam_domination

__all__ = [
    "PLD_RELATIVE_TOLERANCE",
    "PldEpsilon",
    "TightResult",
    "adaptive_pld_epsilon",
    "gaussian_delta",
    "gaussian_epsilon",
    "skellam_pld",
    "skellam_tail_bound",
    "supports_tight",
    "tight_epsilon",
    "tight_method",
]

#: Target of the adaptive grid: the predicted excess of the PLD ε over its fine-grid limit,
#: relative to ε (0.2 %).
PLD_RELATIVE_TOLERANCE = 2e-3
#: Starting grid step without a hint, and the coarsest step ever used.
_COARSE_INTERVAL = 1e-2
_MAX_INTERVAL = 5e-2
#: The finest step the adaptive grid goes to, and its number of refinements (bounded cost).
_MIN_INTERVAL = 1e-7
_MAX_REFINEMENTS = 8


def _parts_of(event: DpEvent) -> TightParts:
    """``event`` flattened by its own :meth:`DpEvent.add_tight_parts`."""
    parts = TightParts()
    flatten_tight(event, 1, parts)
    return parts


@dataclass(frozen=True, slots=True)
class _Resolved:
    """Parts whose Skellam releases are replaced by their dominating Gaussians, and the total
    mass split off from those Gaussians (added to δ)."""

    parts: TightParts
    slack: float


def _resolve(parts: TightParts) -> _Resolved:
    """Replace each Skellam release of ``parts.skellam_gaussian`` by its dominating Gaussian
    (Gaussian RDP ``ρ = (m₁·Δ₂)²/2``, Poisson-subsampled at its rate) and add up the split-off
    masses ``η`` (one per moved coordinate per release). Why this dominates:
    docs/accounting.md#skellam-in-several-coordinates.

    Raises:
        TightPathError: the domination of some μ cannot be computed.
    """
    out = TightParts(parts.rho, Counter(parts.sampled), Counter(parts.skellam))
    slack = 0.0
    for (rate, shift), count in parts.skellam_gaussian.items():
        dom = skellam_domination(shift.mu, shift.max_shift)
        scaled = dom.rate * shift.l2
        rho = 0.5 * scaled * scaled
        if rate >= 1.0 or not math.isfinite(rho):
            out.rho += count * rho
        else:
            out.sampled[(rate, 1.0 / scaled)] += count
        slack += count * shift.dimension * dom.slack
    return _Resolved(out, slack)


#: The split-off mass may take at most this fraction of δ (far below: it is about e^{-300} per
#: coordinate); beyond it the tight path is refused.
_MAX_SLACK_FRACTION = 1e-6


def _delta_after_slack(delta: float, slack: float) -> float:
    """The δ the dominating Gaussians are read at, so that with the split-off mass added the
    total stays ≤ ``delta``: ``delta − slack`` rounded down (one float step below).

    Raises:
        TightPathError: the slack is not negligible next to δ.
    """
    if slack == 0.0:
        return delta
    if not slack <= _MAX_SLACK_FRACTION * delta:
        raise TightPathError(
            f"the Skellam domination splits off a mass {slack:.3g}, not negligible next to "
            f"δ = {delta:g}"
        )
    return math.nextafter(delta - slack, 0.0)


def _unbounded(parts: TightParts) -> bool:
    """Some composed Gaussian has a vanishing noise: no finite ε is claimed (+inf is a bound)."""
    return not math.isfinite(parts.rho) or any(z <= 0.0 for _, z in parts.sampled)


def tight_method(event: DpEvent) -> str | None:
    """``"analytic_gaussian"`` or ``"pld"``: the method :func:`tight_epsilon` would use, or None."""
    try:
        parts = _parts_of(event)
    except UnsupportedEventError:
        return None
    sampled_skellam = any(rate < 1.0 for rate, _ in parts.skellam_gaussian)
    return "pld" if parts.sampled or parts.skellam or sampled_skellam else "analytic_gaussian"


def supports_tight(event: DpEvent) -> bool:
    """Whether :func:`tight_epsilon` accounts for ``event``."""
    return tight_method(event) is not None


def _log_gaussian_delta(eps: float, mu: float) -> float:
    t1 = float(special.log_ndtr(-eps / mu + mu / 2.0))
    t2 = eps + float(special.log_ndtr(-eps / mu - mu / 2.0))
    if t2 >= t1:
        return -math.inf
    return t1 + math.log(-math.expm1(t2 - t1))


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of the Gaussian mechanism with sensitivity/std ratio ``mu`` (Balle & Wang 2018)."""
    return math.exp(_log_gaussian_delta(epsilon, mu))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest ε ≥ 0 with ``δ(ε) ≤ delta`` for the Gaussian with ratio ``mu`` (exact).

    The returned value is checked to satisfy the inequality (not just approximately).
    """
    if mu <= 0.0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    log_delta = math.log(delta)
    if _log_gaussian_delta(0.0, mu) <= log_delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while _log_gaussian_delta(hi, mu) > log_delta:
        hi *= 2.0
    root = float(
        optimize.brentq(
            lambda e: _log_gaussian_delta(e, mu) - log_delta, 0.0, hi, xtol=1e-14, rtol=1e-14
        )
    )
    eps = root
    step = max(1e-13, abs(root) * 1e-12)
    while _log_gaussian_delta(eps, mu) > log_delta:
        eps += step
        step *= 2.0
    return eps


@dataclass(frozen=True, slots=True)
class TightResult:
    """A tight ε and the method that produced it (``"analytic_gaussian"`` or ``"pld"``).

    ``interval`` is the PLD grid step of the returned figure (None for the analytic profile).
    """

    epsilon: float
    method: str
    interval: float | None = None


def _check_delta(delta: float) -> None:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise InvalidParameterError(f"delta must be a number in (0, 1), got {delta!r}")


#: Half-width of the Skellam support written out, in standard deviations; the mass beyond it
#: (bounded by Chernoff) is charged as infinite privacy loss.
_SKELLAM_SUPPORT_SDS = 14.0
#: The largest Skellam support written out, in points per side (2^21: mu up to about 1.1·10^10,
#: i.e. vote noise σ up to about 145 votes of 2^10 units; about 0.3 GB at the limit); a larger
#: one is refused (RDP fallback) rather than filling gigabytes.
_SKELLAM_MAX_HALF_WIDTH = 1 << 21
#: The library's failures inside a PLD computation (empty or degenerate arrays, overflow): turned
#: into :class:`TightPathError`. Our own errors (``InvalidParameterError`` is a ValueError) pass.
_LIBRARY_ERRORS = (IndexError, ValueError, ArithmeticError)


def skellam_tail_bound(mu: float, k: float) -> float:
    """An upper bound on P(|X| ≥ k) for X ~ Sk(mu): twice the Chernoff bound
    ``exp(2·mu·(cosh t − 1) − t·k)`` at its minimiser ``t = asinh(k/(2·mu))`` (the MGF of
    Sk(mu) is ``exp(2·mu·(cosh t − 1))``)."""
    if k <= 0.0:
        return 1.0
    t = math.asinh(k / (2.0 * mu))
    return min(1.0, 2.0 * math.exp(2.0 * mu * (math.cosh(t) - 1.0) - t * k))


def clear_pld_cache() -> None:
    """Forget the cached one-step and per-group PLDs."""
    for cached in (_skellam_losses, skellam_pld, _gaussian_block, _gaussian_step):
        cached.cache_clear()


@functools.lru_cache(maxsize=2)
def _skellam_losses(mu: float, shift: int) -> tuple[Any, Any, float]:
    """``(mass, loss, infinity)`` of ``Sk(mu) + shift`` against ``Sk(mu)``: the masses and
    privacy losses of the outcomes over ±14 standard deviations whose loss is finite, and the
    mass charged as infinite loss. Independent of the grid, so the adaptive grid's refinements
    share one evaluation (two entries are kept)."""
    import numpy as np

    half = math.ceil(_SKELLAM_SUPPORT_SDS * math.sqrt(2.0 * mu)) + shift
    if half > _SKELLAM_MAX_HALF_WIDTH:
        raise TightPathError(
            f"the Skellam PLD of mu = {mu:g} needs {2 * half + 1} support points "
            f"(at most {2 * _SKELLAM_MAX_HALF_WIDTH + 1} are written out)"
        )
    # log P(X = k) for X ~ Sk(mu) at k = 0 .. half + shift (the law is symmetric)
    table = log_ive(np.arange(half + shift + 1), 2.0 * mu)
    if np.isnan(table).any():
        raise TightPathError(
            f"a Skellam mass of mu = {mu:g} is not a number (Bessel function of argument "
            f"{2.0 * mu:g})"
        )
    x = np.arange(-half, half + 1)
    log_mass = table[np.abs(x)]
    # the shifted law puts P(x) on x + shift, where the unshifted law puts P(x + shift)
    with np.errstate(invalid="ignore"):
        loss = log_mass - table[np.abs(x + shift)]
    mass = np.exp(log_mass)
    finite = np.isfinite(loss) & (mass > 0.0)
    infinity = float(mass[~finite & (mass > 0.0)].sum()) + skellam_tail_bound(mu, half + 1.0)
    kept_mass, kept_loss = mass[finite], loss[finite]
    kept_mass.setflags(write=False)
    kept_loss.setflags(write=False)
    return kept_mass, kept_loss, min(1.0, infinity)


@functools.lru_cache(maxsize=64)
def skellam_pld(mu: float, shift: int, interval: float) -> Any:
    """The pessimistic PLD of ``Sk(mu)`` shifted by ``shift`` against ``Sk(mu)`` (integers), on
    a grid of step ``interval``: the exact masses ``e^{−2mu}·I_|k|(2mu)`` (``bessel.log_ive``)
    over ±14 standard deviations, each loss rounded up to the grid, and the Chernoff bound on the
    rest charged as infinite loss. Symmetric: the reflection ``x ↦ shift − x`` swaps the two
    laws. Derivation: docs/accounting.md#skellam-votes-the-pld-of-one-coordinate.

    Raises:
        InvalidParameterError: on a bad ``mu``, ``shift`` or ``interval``.
        TightPathError: a mass is not a number, or the support is too large to write out.
    """
    import numpy as np
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    if shift < 1 or not mu > 0.0 or not interval > 0.0:
        raise InvalidParameterError(
            f"need mu > 0, an integer shift >= 1 and a grid step > 0, got {mu}, {shift}, {interval}"
        )
    mass, loss, infinity = _skellam_losses(float(mu), int(shift))
    index = np.ceil(loss / interval).astype(np.int64)
    keys, where = np.unique(index, return_inverse=True)
    sums = np.bincount(where, weights=mass)
    rounded = dict(zip(keys.tolist(), sums.tolist(), strict=True))
    try:
        return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
            rounded, infinity, interval, pessimistic_estimate=True
        )
    except _LIBRARY_ERRORS as exc:
        raise _library_failure(exc, interval) from exc


def _library_failure(exc: Exception, interval: float) -> TightPathError:
    return TightPathError(
        f"dp_accounting failed on the PLD grid step {interval:.3g}: {type(exc).__name__}: {exc}"
    )


def _pld_epsilon(parts: TightParts, delta: float, interval: float) -> float:
    """ε at ``delta`` of the pessimistic PLD of ``parts`` on a grid of step ``interval``.

    Raises:
        TightPathError: dp_accounting raised one of :data:`_LIBRARY_ERRORS`, or returned NaN.
    """
    try:
        eps = _compose_pld_epsilon(parts, delta, interval)
    except AccountingError:
        raise
    except _LIBRARY_ERRORS as exc:
        raise _library_failure(exc, interval) from exc
    if math.isnan(eps):
        raise TightPathError(f"dp_accounting returned ε = NaN on the PLD grid step {interval:.3g}")
    return max(0.0, eps)


def _compose_pld_epsilon(parts: TightParts, delta: float, interval: float) -> float:
    composed = None
    if parts.rho > 0.0:
        composed = _gaussian_block(1.0, 1.0 / math.sqrt(2.0 * parts.rho), interval, 1)
    for (mu, shift), count in sorted(parts.skellam.items()):
        one = skellam_pld(mu, shift, interval)
        block = one.self_compose(count) if count > 1 else one
        composed = block if composed is None else composed.compose(block)
    for (rate, z), count in sorted(parts.sampled.items()):
        block = _gaussian_block(rate, z, interval, count)
        composed = block if composed is None else composed.compose(block)
    if composed is None:  # nothing private was composed
        return 0.0
    return float(composed.get_epsilon_for_delta(delta))


@functools.lru_cache(maxsize=64)
def _gaussian_block(rate: float, z: float, interval: float, count: int) -> Any:
    """``count`` compositions of the (Poisson-subsampled at ``rate`` < 1) Gaussian of noise
    multiplier ``z``, pessimistic, on the grid ``interval``. Cached: a client's history repeats
    a few events, and a round's commit composes the same groups for many clients and again at
    the next round (the grid steps are powers of two, so consecutive figures share them)."""
    one = _gaussian_step(rate, z, interval)
    return one.self_compose(count) if count > 1 else one


@functools.lru_cache(maxsize=64)
def _gaussian_step(rate: float, z: float, interval: float) -> Any:
    """One step of :func:`_gaussian_block` (its construction dominates the cost of a figure)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    return pld_lib.from_gaussian_mechanism(
        standard_deviation=z,
        sensitivity=1.0,
        sampling_prob=min(1.0, rate),
        pessimistic_estimate=True,
        value_discretization_interval=interval,
    )


def _power_of_two(step: float, *, up: bool) -> float:
    """The nearest power of 2^(1/8) above (``up``) or below ``step`` (a pessimistic PLD is a
    bound at any step; equal steps let figures share their cached blocks; the lattice, 9 %, is
    fine enough to keep the refinement's tightness)."""
    exponent = 8.0 * math.log2(step)
    eighths = math.ceil(exponent - 1e-9) if up else math.floor(exponent + 1e-9)
    return float(2.0 ** (eighths / 8.0))


@dataclass(frozen=True, slots=True)
class PldEpsilon:
    """The adaptive PLD figure: ε (an upper bound), its grid step, and the grids tried."""

    epsilon: float
    interval: float
    tried: tuple[tuple[float, float], ...]


def adaptive_pld_epsilon(
    event: DpEvent, *, delta: float, epsilon_hint: float | None = None
) -> PldEpsilon:
    """Pessimistic PLD ε of ``event`` on a grid refined relative to the ε being computed.

    Starts at ``1e-3·epsilon_hint`` (any upper bound on ε, e.g. the RDP figure) or at 1e-2, then
    refines: from two grids g > g' with figures e ≥ e', the excess of e' over the limit is about
    ``(e − e')/((g/g')² − 1)`` (quadratic convergence); refinement stops once that is
    ≤ :data:`PLD_RELATIVE_TOLERANCE`·e', at the finest step ``1e-7``, or after 8 refinements.
    The smallest figure computed is returned: each one is an upper bound (pessimistic PLD). A
    refinement whose computation fails ends the refinement (the figures already computed stand).

    Raises:
        UnsupportedEventError: naming the part with no PLD path.
        InvalidParameterError: on a bad δ.
        TightPathError: the first grid's computation failed.
    """
    _check_delta(delta)
    resolved = _resolve(_parts_of(event))
    return _adaptive_pld(
        resolved.parts, _delta_after_slack(delta, resolved.slack), epsilon_hint=epsilon_hint
    )


def _adaptive_pld(
    parts: TightParts, delta: float, *, epsilon_hint: float | None, shared_grid: bool = True
) -> PldEpsilon:
    """:func:`adaptive_pld_epsilon` on resolved parts (no Skellam domination left).
    ``shared_grid``: every step a power of two, so that figures of similar histories (a
    client's ledger round after round) share their cached one-step and per-group PLDs."""
    if _unbounded(parts):
        return PldEpsilon(math.inf, _COARSE_INTERVAL, ())
    if epsilon_hint is not None and math.isfinite(epsilon_hint) and epsilon_hint > 0.0:
        interval = min(_MAX_INTERVAL, max(_MIN_INTERVAL, 5e-4 * float(epsilon_hint)))
    else:
        interval = _COARSE_INTERVAL
    if shared_grid:
        interval = _power_of_two(interval, up=True)
    tried = [(interval, _pld_epsilon(parts, delta, interval))]
    ratio = 1.0 / 3.0
    for _ in range(_MAX_REFINEMENTS):
        coarse, coarse_eps = tried[-1]
        # an infinite figure is the PLD's truncated tail charged at +inf above δ: no finer grid
        # changes it (the caller has the RDP figure)
        if coarse_eps == 0.0 or not math.isfinite(coarse_eps) or coarse <= _MIN_INTERVAL:
            break
        fine = max(_MIN_INTERVAL, coarse * ratio)
        if shared_grid:
            fine = _power_of_two(fine, up=False)
        try:
            fine_eps = _pld_epsilon(parts, delta, fine)
        except TightPathError:
            break
        tried.append((fine, fine_eps))
        r = fine / coarse
        excess = abs(coarse_eps - fine_eps) * r * r / (1.0 - r * r)
        if excess <= PLD_RELATIVE_TOLERANCE * fine_eps:
            break
        # quadratic model: the step that would bring the excess to 80 % of the target
        target = 0.8 * PLD_RELATIVE_TOLERANCE * fine_eps
        ratio = min(0.5, max(0.125, math.sqrt(target / excess) if excess > 0.0 else 0.5))
    best_interval, best = min(tried, key=lambda t: (t[1], -t[0]))
    return PldEpsilon(best, best_interval, tuple(tried))


def tight_epsilon(
    event: DpEvent,
    *,
    delta: float,
    value_discretization_interval: float | None = None,
    force_pld: bool = False,
    epsilon_hint: float | None = None,
    shared_grid: bool = True,
) -> TightResult:
    """A tight upper bound on ε at ``delta`` for ``event``.

    Args:
        event: a composition of Gaussian, voting and Poisson-subsampled Gaussian events.
        delta: δ in (0, 1).
        value_discretization_interval: a fixed PLD grid step (pessimistic at any value); None
            (default) chooses it relative to ε (:func:`adaptive_pld_epsilon`).
        force_pld: use the PLD even where the exact Gaussian profile applies (for tests and
            comparisons; never tighter than the exact profile).
        epsilon_hint: an upper bound on ε (e.g. the RDP figure) to start the adaptive grid at.
        shared_grid: adaptive steps that are powers of two (the ledger's figures share cached
            PLDs across rounds and clients).

    Returns:
        The ε and the method.

    Raises:
        UnsupportedEventError: naming the part with no tight path.
        InvalidParameterError: on a bad δ or grid step.
        TightPathError: the PLD computation failed (the caller falls back to another bound).
    """
    _check_delta(delta)
    if value_discretization_interval is not None and not (
        0.0 < value_discretization_interval <= 0.1
    ):
        raise InvalidParameterError("value_discretization_interval must be in (0, 0.1]")
    resolved = _resolve(_parts_of(event))
    parts = resolved.parts
    delta = _delta_after_slack(delta, resolved.slack)
    pld = bool(parts.sampled or parts.skellam)
    if _unbounded(parts):
        return TightResult(math.inf, "pld" if pld else "analytic_gaussian")
    if not pld and not force_pld:
        return TightResult(gaussian_epsilon(math.sqrt(2.0 * parts.rho), delta), "analytic_gaussian")
    if value_discretization_interval is not None:
        interval = float(value_discretization_interval)
        return TightResult(_pld_epsilon(parts, delta, interval), "pld", interval)
    adaptive = _adaptive_pld(parts, delta, epsilon_hint=epsilon_hint, shared_grid=shared_grid)
    return TightResult(adaptive.epsilon, "pld", adaptive.interval)
