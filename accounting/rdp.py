"""RDP curves of every event on a grid of orders, and the conversion RDP → (ε, δ).

Pure functions; the stateful accountant (:mod:`dpfl.accounting.accountant`) is a thin wrapper.
Composition is addition of curves (Mironov 2017, Prop. 1). Curves are cached per (event, orders):
events are immutable values, so equal events share a curve, which is what makes composing 10⁴
heterogeneous events cheap (the ledger's pattern). Every curve is an upper bound on the RDP of the
event at each order; ``inf`` means no finite bound is known there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from .errors import InvalidParameterError, UnsupportedEventError
from .events import (
    ComposedEvent,
    DataDependentVotingEvent,
    DpEvent,
    GaussianEvent,
    NoPrivacyEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
)
from .orders import ORDERS, validate_orders
from .rdp_gaussian import poisson_subsampled_gaussian_rdp
from .rdp_mechanisms import data_dependent_voting_rdp, skellam_rdp, voting_rdp
from .rdp_moments import fractional_moment_log_bound
from .rdp_subsampling import (
    integer_orders_needed,
    interpolate_fractional,
    poisson_general_rdp,
    poisson_symmetric_rdp,
    without_replacement_gaussian_rdp,
    without_replacement_general_rdp,
)

__all__ = [
    "clear_rdp_cache",
    "epsilon_from_rdp",
    "epsilon_from_rdp_plain",
    "gaussian_coefficient",
    "rdp_curve",
    "supports_rdp",
]

FloatArray = NDArray[np.float64]


def gaussian_coefficient(event: DpEvent) -> float | None:
    """ρ if ``event`` is a composition of Gaussian mechanisms (RDP exactly ``ρ·α``), else None.

    Gaussians composed on the same data are one Gaussian mechanism with
    ``(Δ/σ)²_eff = Σ (Δ_i/σ_i)²``, which is what lets a sampled composition of Gaussians be
    accounted as one subsampled Gaussian (the same reduction dp_accounting makes). Voting events
    are excluded on purpose: they carry their own neighbouring relation.
    """
    if isinstance(event, GaussianEvent):
        return 0.5 * (event.sensitivity / event.sigma) ** 2
    if isinstance(event, NoPrivacyEvent):
        return 0.0
    if isinstance(event, SelfComposedEvent):
        inner = gaussian_coefficient(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, ComposedEvent):
        total = 0.0
        for e in event.events:
            c = gaussian_coefficient(e)
            if c is None:
                return None
            total += c
        return total
    return None


def _contains_voting(event: DpEvent) -> DpEvent | None:
    if isinstance(event, VotingEvent | DataDependentVotingEvent):
        return event
    if isinstance(event, PoissonSampledEvent | SampledWithoutReplacementEvent | SelfComposedEvent):
        return _contains_voting(event.event)
    if isinstance(event, ComposedEvent):
        for e in event.events:
            found = _contains_voting(e)
            if found is not None:
                return found
    return None


def _check_sampled_inner(event: PoissonSampledEvent | SampledWithoutReplacementEvent) -> None:
    voting = _contains_voting(event.event)
    if voting is not None:
        raise UnsupportedEventError(
            f"{type(event).__name__} cannot wrap {type(voting).__name__}: voting events carry "
            "their own neighbouring relation (agent or instance level) and are never subsampled"
        )


def _integer_curve(event: DpEvent, top: int) -> FloatArray:
    """Inner RDP at orders 0..top (entries 0 and 1 unused, set to 0)."""
    inner = np.zeros(top + 1, dtype=np.float64)
    inner[2:] = _cached_curve(event, tuple(float(m) for m in range(2, top + 1)))
    return inner


def _poisson(event: PoissonSampledEvent, orders: tuple[float, ...]) -> FloatArray:
    _check_sampled_inner(event)
    if event.sampling_rate >= 1.0:
        return np.array(_cached_curve(event.event, orders))
    rho = gaussian_coefficient(event.event)
    if rho is not None:
        if rho == 0.0:
            return np.zeros(len(orders))
        return poisson_subsampled_gaussian_rdp(
            sampling_rate=event.sampling_rate,
            noise_multiplier=1.0 / math.sqrt(2.0 * rho),
            orders=orders,
        )
    top = integer_orders_needed(orders)
    inner = _integer_curve(event.event, top)
    # A bare Skellam release is an integer shift of a symmetric noise: its pairs are symmetric,
    # so the exact remove-direction expansion bounds both directions (poisson_symmetric_rdp).
    symmetric = isinstance(event.event, SkellamEvent)
    cache: dict[int, float] = {1: 0.0}

    def cgf(m: int) -> float:
        if m not in cache:
            bound = poisson_general_rdp(event.sampling_rate, inner, m)
            if symmetric:
                bound = min(bound, poisson_symmetric_rdp(event.sampling_rate, inner, m))
            cache[m] = (m - 1) * bound
        return cache[m]

    out = interpolate_fractional(cgf, orders)
    if symmetric:
        # Fractional orders: the moment bound of rdp_moments on X = 1 − γ + γL (E_Q[X] = 1,
        # X ≥ 1 − γ, E_Q[X^j] ≤ e^{cgf(j)}) bounds the remove direction at real α, and the
        # symmetric lemma makes it bound the add direction too; the min with the interpolation.
        for i, a in enumerate(orders):
            if float(a).is_integer() or a >= _MOMENT_MAX_ORDER:
                continue
            n = math.floor(a)
            moments = {m: cgf(m) for m in range(2, min(top, n + _MOMENT_EXTRA) + 1)}
            k = fractional_moment_log_bound(float(a), 1.0 - event.sampling_rate, moments)
            if math.isfinite(k):
                out[i] = min(out[i], max(k, 0.0) / (a - 1.0))
    return out


#: The moment bound is evaluated at fractional orders below this (the grid's fractional part).
_MOMENT_MAX_ORDER = 11.0
#: Integer moments used above the order: ⌊α⌋ + 1 ... ⌊α⌋ + 6.
_MOMENT_EXTRA = 6


def _without_replacement(
    event: SampledWithoutReplacementEvent, orders: tuple[float, ...]
) -> FloatArray:
    _check_sampled_inner(event)
    if event.sample_size == event.population:  # no sampling: the inner mechanism itself
        return np.array(_cached_curve(event.event, orders))
    rho = gaussian_coefficient(event.event)
    top = integer_orders_needed(orders)
    wanted = sorted({m for a in orders for m in (math.floor(a), math.ceil(a)) if m >= 2} | {2})
    if rho is not None:
        if rho == 0.0:
            return np.zeros(len(orders))
        values = without_replacement_gaussian_rdp(
            population=event.population,
            sample_size=event.sample_size,
            noise_multiplier=1.0 / math.sqrt(2.0 * rho),
            alphas=wanted,
        )
        table = dict(zip(wanted, values.tolist(), strict=True))
    else:
        inner = _integer_curve(event.event, top)
        table = {m: without_replacement_general_rdp(event.sampling_ratio, inner, m) for m in wanted}

    def cgf(m: int) -> float:
        return 0.0 if m == 1 else (m - 1) * table[m]

    return interpolate_fractional(cgf, orders)


def _compute(event: DpEvent, orders: tuple[float, ...]) -> FloatArray:
    a = np.asarray(orders, dtype=np.float64)
    if isinstance(event, NoPrivacyEvent):
        return np.zeros_like(a)
    if isinstance(event, GaussianEvent):
        return 0.5 * (event.sensitivity / event.sigma) ** 2 * a
    if isinstance(event, SelfComposedEvent):
        if event.count == 0:
            return np.zeros_like(a)
        return event.count * _cached_curve(event.event, orders)
    if isinstance(event, ComposedEvent):
        total = np.zeros_like(a)
        for e in event.events:
            total = total + _cached_curve(e, orders)
        return total
    if isinstance(event, PoissonSampledEvent):
        return _poisson(event, orders)
    if isinstance(event, SampledWithoutReplacementEvent):
        return _without_replacement(event, orders)
    if isinstance(event, SkellamEvent):
        return skellam_rdp(event, orders)
    if isinstance(event, VotingEvent):
        return voting_rdp(event, orders)
    if isinstance(event, DataDependentVotingEvent):
        return data_dependent_voting_rdp(event, orders)
    raise UnsupportedEventError(f"no RDP bound for event {type(event).__name__}")


@functools.lru_cache(maxsize=4096)
def _cached_curve(event: DpEvent, orders: tuple[float, ...]) -> FloatArray:
    try:
        out = np.asarray(_compute(event, orders), dtype=np.float64)
    except ArithmeticError:
        # Overflow or division by zero only happens when the noise is vanishingly small next to
        # the sensitivity (e.g. sigma = 1e-200): the true divergence is then astronomically large,
        # and +inf at every order is the only bound that is certainly not below it.
        out = np.full(len(orders), np.inf)
    out = np.where(np.isnan(out), np.inf, out)  # never let a NaN read as "no cost"
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _orders_key(orders: tuple[float, ...]) -> tuple[float, ...]:
    return validate_orders(orders)


def clear_rdp_cache() -> None:
    """Forget every cached curve (benchmarks measure cold computations with it)."""
    _cached_curve.cache_clear()


def _key(orders: Sequence[float]) -> tuple[float, ...]:
    return _orders_key(tuple(float(a) for a in orders))


def rdp_curve(event: DpEvent, orders: Sequence[float] = ORDERS) -> FloatArray:
    """The RDP upper bound of ``event`` at each order.

    Args:
        event: any dpfl privacy event.
        orders: strictly increasing orders > 1 (default: the ledger's grid :data:`ORDERS`).

    Returns:
        A new float64 array of the same length as ``orders``; ``inf`` where no finite bound is
        known. Curves of equal events are cached, so repeated calls are cheap.

    Raises:
        UnsupportedEventError: if a part of ``event`` has no RDP bound (naming it).
        InvalidParameterError: on a bad grid of orders.
    """
    if not isinstance(event, DpEvent):
        raise UnsupportedEventError(f"not a dpfl privacy event: {type(event).__name__}")
    return np.array(_cached_curve(event, _key(orders)))


def supports_rdp(event: DpEvent) -> bool:
    """Whether :func:`rdp_curve` accounts for ``event`` (a structural dry run; no computation)."""
    if isinstance(
        event,
        NoPrivacyEvent | GaussianEvent | SkellamEvent | VotingEvent | DataDependentVotingEvent,
    ):
        return True
    if isinstance(event, SelfComposedEvent):
        return supports_rdp(event.event)
    if isinstance(event, ComposedEvent):
        return all(supports_rdp(e) for e in event.events)
    if isinstance(event, PoissonSampledEvent | SampledWithoutReplacementEvent):
        return _contains_voting(event.event) is None and supports_rdp(event.event)
    return False


def _check_conversion_inputs(
    curve: Sequence[float] | FloatArray, delta: float, orders: Sequence[float]
) -> tuple[FloatArray, FloatArray]:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise InvalidParameterError(f"delta must be a number in (0, 1), got {delta!r}")
    a = np.asarray(_key(orders), dtype=np.float64)
    r = np.asarray(curve, dtype=np.float64)
    if r.shape != a.shape:
        raise InvalidParameterError(f"the curve has {r.size} values but there are {a.size} orders")
    if np.isnan(r).any():
        raise InvalidParameterError("the RDP curve contains NaN")
    return a, np.maximum(r, 0.0)


def epsilon_from_rdp(
    curve: Sequence[float] | FloatArray, *, delta: float, orders: Sequence[float] = ORDERS
) -> tuple[float, float]:
    """The smallest ε over the orders, with the improved conversion, and the order achieving it.

    Balle, Barthe, Gaboardi, Hsu & Sato 2020 ("Hypothesis Testing Interpretations and Rényi
    Differential Privacy", AISTATS), Theorem 21: an (α, r)-RDP mechanism is (ε, δ)-DP with

        ε = r + log((α−1)/α) − (log δ + log α)/(α−1),

    never larger than Mironov's ``r + log(1/δ)/(α−1)``. Also, by Bretagnolle–Huber
    (``TV ≤ √(1 − e^{−KL})`` and ``D_α ≥ KL``), ε = 0 already holds when ``δ ≥ √(1 − e^{−r})``.
    The result is clamped at 0 (ε is never negative).

    Args:
        curve: RDP values at ``orders``.
        delta: δ in (0, 1).
        orders: the grid of the curve (default :data:`ORDERS`).

    Returns:
        ``(epsilon, order)``; ``(inf, nan)`` if every order is infinite.

    Raises:
        InvalidParameterError: on δ outside (0, 1) or a curve that does not match the orders.
    """
    a, r = _check_conversion_inputs(curve, delta, orders)
    with np.errstate(invalid="ignore", over="ignore"):
        eps = r + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
        eps = np.where(np.isfinite(r), eps, np.inf)
        eps = np.where(delta * delta + np.expm1(-r) > 0.0, 0.0, eps)
    i = int(np.argmin(eps))
    if not np.isfinite(eps[i]):
        return math.inf, math.nan
    return max(0.0, float(eps[i])), float(a[i])


def epsilon_from_rdp_plain(
    curve: Sequence[float] | FloatArray, *, delta: float, orders: Sequence[float] = ORDERS
) -> tuple[float, float]:
    """Mironov 2017, Prop. 3: ``ε = min_α r(α) + log(1/δ)/(α−1)``, and the optimal order.

    Kept as the reference the improved conversion is tested against (it is never smaller).
    """
    a, r = _check_conversion_inputs(curve, delta, orders)
    eps = np.where(np.isfinite(r), r + math.log(1.0 / delta) / (a - 1.0), np.inf)
    i = int(np.argmin(eps))
    if not np.isfinite(eps[i]):
        return math.inf, math.nan
    return float(eps[i]), float(a[i])
