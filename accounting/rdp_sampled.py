"""RDP curves of a mechanism applied to a random sample: Poisson and without replacement.

What the sampling events (:class:`~dpfl.accounting.events.PoissonSampledEvent`,
:class:`~dpfl.accounting.events.SampledWithoutReplacementEvent`) compute from their inner event:
a composition of Gaussians is accounted as one subsampled Gaussian (the same reduction
dp_accounting makes); any other inner event through its integer-order curve and the general
bounds of :mod:`dpfl.accounting.rdp_subsampling`. Events that carry their own neighbouring
relation (voting) are refused: they are never subsampled.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import UnsupportedEventError
from .event_protocol import DpEvent, FloatArray, Orders
from .rdp import cached_curve
from .rdp_gaussian import poisson_subsampled_gaussian_rdp
from .rdp_moments import fractional_moment_log_bound
from .rdp_subsampling import (
    integer_orders_needed,
    interpolate_fractional,
    poisson_general_rdp,
    poisson_symmetric_rdp,
    without_replacement_gaussian_rdp,
    without_replacement_general_rdp,
)

__all__ = ["check_sampled_inner", "poisson_sampled_rdp", "without_replacement_rdp"]

#: The moment bound is evaluated at fractional orders below this (the grid's fractional part).
_MOMENT_MAX_ORDER = 11.0
#: Integer moments used above the order: ⌊α⌋ + 1 ... ⌊α⌋ + 6.
_MOMENT_EXTRA = 6


def check_sampled_inner(wrapper: str, inner: DpEvent) -> None:
    """Refuse a sampled event whose inner event carries its own neighbouring relation.

    Raises:
        UnsupportedEventError: naming the wrapper and the refused part.
    """
    voting = inner.unsampleable_part()
    if voting is not None:
        raise UnsupportedEventError(
            f"{wrapper} cannot wrap {type(voting).__name__}: voting events carry "
            "their own neighbouring relation (agent or instance level) and are never subsampled"
        )


def _integer_curve(event: DpEvent, top: int) -> FloatArray:
    """Inner RDP at orders 0..top (entries 0 and 1 unused, set to 0)."""
    inner = np.zeros(top + 1, dtype=np.float64)
    inner[2:] = cached_curve(event, tuple(float(m) for m in range(2, top + 1)))
    return inner


def poisson_sampled_rdp(
    wrapper: str, sampling_rate: float, inner_event: DpEvent, orders: Orders
) -> FloatArray:
    """RDP of ``inner_event`` on a Poisson sample at ``sampling_rate`` (add/remove one record)."""
    check_sampled_inner(wrapper, inner_event)
    if sampling_rate >= 1.0:
        return np.array(cached_curve(inner_event, orders))
    rho = inner_event.gaussian_coefficient()
    if rho is not None:
        if rho == 0.0:
            return np.zeros(len(orders))
        return poisson_subsampled_gaussian_rdp(
            sampling_rate=sampling_rate,
            noise_multiplier=1.0 / math.sqrt(2.0 * rho),
            orders=orders,
        )
    top = integer_orders_needed(orders)
    inner = _integer_curve(inner_event, top)
    # A bare integer shift of a symmetric noise (a Skellam release) has symmetric pairs, so the
    # exact remove-direction expansion bounds both directions (poisson_symmetric_rdp).
    symmetric = inner_event.symmetric_shift
    cache: dict[int, float] = {1: 0.0}

    def cgf(m: int) -> float:
        if m not in cache:
            bound = poisson_general_rdp(sampling_rate, inner, m)
            if symmetric:
                bound = min(bound, poisson_symmetric_rdp(sampling_rate, inner, m))
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
            k = fractional_moment_log_bound(float(a), 1.0 - sampling_rate, moments)
            if math.isfinite(k):
                out[i] = min(out[i], max(k, 0.0) / (a - 1.0))
    return out


def without_replacement_rdp(
    wrapper: str, population: int, sample_size: int, inner_event: DpEvent, orders: Orders
) -> FloatArray:
    """RDP of ``inner_event`` on a uniform sample of ``sample_size`` out of ``population``
    (replace one record)."""
    check_sampled_inner(wrapper, inner_event)
    if sample_size == population:  # no sampling: the inner mechanism itself
        return np.array(cached_curve(inner_event, orders))
    rho = inner_event.gaussian_coefficient()
    top = integer_orders_needed(orders)
    wanted = sorted({m for a in orders for m in (math.floor(a), math.ceil(a)) if m >= 2} | {2})
    if rho is not None:
        if rho == 0.0:
            return np.zeros(len(orders))
        values = without_replacement_gaussian_rdp(
            population=population,
            sample_size=sample_size,
            noise_multiplier=1.0 / math.sqrt(2.0 * rho),
            alphas=wanted,
        )
        table = dict(zip(wanted, values.tolist(), strict=True))
    else:
        inner = _integer_curve(inner_event, top)
        ratio = sample_size / population
        table = {m: without_replacement_general_rdp(ratio, inner, m) for m in wanted}

    def cgf(m: int) -> float:
        return 0.0 if m == 1 else (m - 1) * table[m]

    return interpolate_fractional(cgf, orders)
