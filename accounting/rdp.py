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

from .errors import InvalidParameterError, UnsupportedEventError
from .event_protocol import DpEvent, FloatArray, Orders
from .orders import ORDERS, validate_orders

__all__ = [
    "cached_curve",
    "clear_rdp_cache",
    "epsilon_from_rdp",
    "epsilon_from_rdp_plain",
    "gaussian_coefficient",
    "rdp_curve",
    "supports_rdp",
]


def gaussian_coefficient(event: DpEvent) -> float | None:
    """ρ if ``event`` is a composition of Gaussian mechanisms (RDP exactly ``ρ·α``), else None
    (:meth:`DpEvent.gaussian_coefficient`)."""
    return event.gaussian_coefficient()


@functools.lru_cache(maxsize=4096)
def cached_curve(event: DpEvent, orders: Orders) -> FloatArray:
    """The read-only RDP curve of ``event`` at validated ``orders``, shared between equal events
    (composite events read their parts' curves through it)."""
    try:
        out = np.asarray(event.rdp(orders), dtype=np.float64)
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
    cached_curve.cache_clear()


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
    return np.array(cached_curve(event, _key(orders)))


def supports_rdp(event: DpEvent) -> bool:
    """Whether :func:`rdp_curve` accounts for ``event`` (a structural dry run; no computation)."""
    return isinstance(event, DpEvent) and event.supports_rdp()


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
