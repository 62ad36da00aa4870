"""``compute_epsilon``: every valid upper bound on ε for an event, and the smallest of them.

Invariant: ``EpsilonReport.epsilon`` is the minimum of the bounds that apply (each an upper bound on
the true ε at δ), and ``method`` names the one that achieved it; a path that does not apply
reports ``None`` rather than a guess. A tight path that applies but fails to compute (a
:class:`~dpfl.accounting.errors.TightPathError`) never fails the report: the RDP bound is
reported with method ``"rdp_fallback"`` and the reason in ``tight_error``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidParameterError, TightPathError, UnsupportedEventError
from .events import DpEvent, is_data_dependent
from .orders import ORDERS
from .rdp import epsilon_from_rdp, rdp_curve, supports_rdp
from .tight import tight_epsilon, tight_method

__all__ = ["RDP_FALLBACK_METHOD", "TIGHT_MAX_RDP_EPSILON", "EpsilonReport", "compute_epsilon"]

_log = logging.getLogger(__name__)

#: The kinds of tight-path failure already warned about in this process (figures blanked out).
_warned: set[str] = set()
_WARNED_KINDS = 256  # bounded: past this many kinds, each further kind warns every time
_warned_lock = threading.Lock()
_FIGURE = re.compile(r"\d[\d.]*(?:e[-+]?\d+)?")

#: The PLD is skipped when the RDP bound already exceeds this: its support, hence its cost, grows
#: with ε even on a grid relative to ε, and a tighter figure in that regime changes no decision.
#: (The exact Gaussian profile, which needs no grid, is always computed.)
TIGHT_MAX_RDP_EPSILON = 1000.0
#: ``method`` of a figure that is the RDP bound because the tight path, which applies, failed.
RDP_FALLBACK_METHOD = "rdp_fallback"


@dataclass(frozen=True, slots=True)
class EpsilonReport:
    """The ε of an event at a δ, how it was obtained, and the candidates.

    Attributes:
        epsilon: the smallest valid upper bound.
        delta: the δ it holds at.
        method: ``"rdp"``, ``"pld"`` or ``"analytic_gaussian"``: which bound gave ``epsilon``;
            ``"rdp_fallback"``: the RDP bound, because the tight path applies but failed.
        order: the optimal Rényi order of the RDP bound (None without an RDP bound).
        rdp_epsilon: the RDP bound (improved conversion), or None where RDP does not apply.
        tight_epsilon: the PLD / analytic bound, or None where it does not apply or was not asked.
        data_dependent: True when part of the event used a data-dependent bound: the figure then
            depends on private data and is not a worst-case guarantee.
        tight_error: why the tight path failed (method ``"rdp_fallback"``), else None; not in
            the JSON form.
    """

    epsilon: float
    delta: float
    method: str
    order: float | None
    rdp_epsilon: float | None
    tight_epsilon: float | None
    data_dependent: bool = False
    tight_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form used by the CLI and the REST API (the six documented keys)."""
        return {
            "epsilon": _finite_or_none(self.epsilon),
            "delta": self.delta,
            "method": self.method,
            "order": self.order,
            "rdp_epsilon": _finite_or_none(self.rdp_epsilon),
            "tight_epsilon": _finite_or_none(self.tight_epsilon),
        }


def _finite_or_none(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if math.isfinite(x) else "inf"


def compute_epsilon(
    event: DpEvent,
    *,
    delta: float,
    tight: bool = True,
    orders: Sequence[float] = ORDERS,
    value_discretization_interval: float | None = None,
    shared_grid: bool = True,
) -> EpsilonReport:
    """ε of ``event`` at ``delta``: the min of the RDP bound and (if asked) the tight bound.

    Args:
        event: any dpfl privacy event.
        delta: δ in (0, 1).
        tight: also try the tight path (:func:`dpfl.accounting.tight.tight_epsilon`); it is
            skipped (``tight_epsilon`` None) when it needs a PLD and the RDP ε exceeds
            :data:`TIGHT_MAX_RDP_EPSILON`.
        orders: the RDP grid.
        value_discretization_interval: a fixed PLD grid step; None (default) refines the grid
            relative to ε, starting from the RDP figure
            (:func:`dpfl.accounting.tight.adaptive_pld_epsilon`).
        shared_grid: adaptive PLD steps that are powers of two (see ``tight_epsilon``).

    Returns:
        The :class:`EpsilonReport`.

    A tight path that fails (:class:`~dpfl.accounting.errors.TightPathError`) leaves the RDP
    bound, reported with method :data:`RDP_FALLBACK_METHOD` and the reason in ``tight_error``.

    Raises:
        UnsupportedEventError: if no path accounts for ``event``.
        InvalidParameterError: on δ outside (0, 1).
        TightPathError: the tight path failed and no RDP bound applies.
    """
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise InvalidParameterError(f"delta must be a number in (0, 1), got {delta!r}")
    rdp_eps: float | None = None
    order: float | None = None
    if supports_rdp(event):
        rdp_eps, opt = epsilon_from_rdp(rdp_curve(event, orders), delta=delta, orders=orders)
        order = None if math.isnan(opt) else opt
    tight_eps: float | None = None
    tight_name = ""
    tight_error: str | None = None
    path = tight_method(event) if tight else None
    if path == "pld" and rdp_eps is not None and rdp_eps > TIGHT_MAX_RDP_EPSILON:
        path = None
    if path is not None:
        try:
            result = tight_epsilon(
                event,
                delta=delta,
                value_discretization_interval=value_discretization_interval,
                epsilon_hint=rdp_eps,
                shared_grid=shared_grid,
            )
        except TightPathError as exc:
            if rdp_eps is None:
                raise
            tight_error = str(exc)
            _log_fallback(tight_error)
        else:
            tight_eps, tight_name = result.epsilon, result.method
    if rdp_eps is None and tight_eps is None:
        rdp_curve(event, orders)  # raises an UnsupportedEventError naming the subevent
        raise UnsupportedEventError(f"no accounting path supports {type(event).__name__}")
    if tight_eps is not None and (rdp_eps is None or tight_eps < rdp_eps):
        epsilon, method = tight_eps, tight_name
    else:
        assert rdp_eps is not None
        epsilon, method = rdp_eps, "rdp" if tight_error is None else RDP_FALLBACK_METHOD
    return EpsilonReport(
        epsilon=epsilon,
        delta=float(delta),
        method=method,
        order=order,
        rdp_epsilon=rdp_eps,
        tight_epsilon=tight_eps,
        data_dependent=is_data_dependent(event),
        tight_error=tight_error,
    )


def _log_fallback(reason: str) -> None:
    """Warn once per process for each kind of failure (its figures blanked out), then log at
    debug: a calibration asks for hundreds of ε of nearby events, and one warning per call
    buried the logs. Each report still carries its own reason in ``tight_error``."""
    kind = _FIGURE.sub("#", reason)
    with _warned_lock:
        first = kind not in _warned
        if len(_warned) < _WARNED_KINDS:
            _warned.add(kind)
    level = logging.WARNING if first else logging.DEBUG
    _log.log(level, "tight path failed, the RDP bound is reported: %s", reason)
