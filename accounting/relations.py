"""Neighbouring relations across a client's history: which entries compose directly, and the
conversion that holds for any mix (pure arithmetic).

Composing events (RDP sums, PLD products) is valid only when they are stated for one relation
and unit. :func:`relation_class` names the relation an entry's event is stated for, from the
event's own structure where it says (sampling, voting level) and from its algorithm otherwise;
a history whose entries share one class composes as it is. For a mix,
:func:`replace_one_curve` converts the whole RDP total as if every entry were add/remove, with
RDP's weak triangle inequality (Mironov 2017, Prop. 11): the result bounds "replace one record
of this client" for any mix of relations and units. Derivation and why converting everything is
safe: docs/accounting.md#d-adding-curves-across-jobs-neighbouring-relations.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from .event_protocol import DpEvent
from .events import (
    ComposedEvent,
    DataDependentVotingEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    VotingEvent,
)
from .orders import ORDERS

__all__ = [
    "ADD_REMOVE",
    "EXPONENTS",
    "REPLACE_ONE",
    "relation_class",
    "replace_one_curve",
    "single_relation",
    "upper_envelope_index",
]

#: Replacing one record (or, at agent level, any data set of the agent for any other, which
#: implies it): one class whatever the unit.
REPLACE_ONE = "replace_one"
#: Adding or removing one unit (an agent's contribution, or one record), given as
#: ``"<unit>/add_remove"``; the agent's zero-out (its vector against the zero vector, given its
#: participation) is its add/remove.
ADD_REMOVE = "add_remove"
#: The relation of a bare release, by algorithm (docs/accounting.md, section (d)'s table);
#: sampling and voting events state their own.
_ALGORITHM_RELATIONS: dict[str, str] = {
    "dp-fedavg": f"agent/{ADD_REMOVE}",
    "dp-fed-ls": f"agent/{ADD_REMOVE}",
    "dp-fedsgd": f"record/{ADD_REMOVE}",
    "dp-helmet": REPLACE_ONE,
}
#: Unit of the add/remove relation of a Poisson-sampled event, by algorithm.
_SAMPLED_UNITS: dict[str, str] = {"dp-fedavg": "agent", "dp-fed-ls": "agent", "dp-fedsgd": "record"}
_UNSTATED = "unstated"


def _stated(event: DpEvent, algorithm: str, unit: str | None) -> set[str]:
    """The relation classes the parts of ``event`` state (empty: none says)."""
    if isinstance(event, VotingEvent | DataDependentVotingEvent):
        return {f"agent/{ADD_REMOVE}" if event.level == "agent" else REPLACE_ONE}
    if isinstance(event, SampledWithoutReplacementEvent):
        return {REPLACE_ONE}
    if isinstance(event, PoissonSampledEvent):
        owner = _SAMPLED_UNITS.get(algorithm, unit)
        return {f"{owner}/{ADD_REMOVE}" if owner else f"{_UNSTATED}/{algorithm}"}
    if isinstance(event, SelfComposedEvent):
        return _stated(event.event, algorithm, unit)
    if isinstance(event, ComposedEvent):
        return set().union(*(_stated(e, algorithm, unit) for e in event.events))
    return set()


def relation_class(event: DpEvent, algorithm: str, unit: str | None = None) -> str:
    """The neighbouring relation (and unit) ``event`` is stated for, as charged by
    ``algorithm``: ``"replace_one"``, ``"agent/add_remove"``, ``"record/add_remove"``, or
    ``"unstated/<algorithm>"`` when neither the event nor the algorithm says (never composed
    with anything without conversion). ``unit`` (``"agent"``/``"record"``), where known, states
    a voting release's relation for an algorithm whose Skellam votes do not carry their level."""
    stated = _stated(event, algorithm, unit)
    if len(stated) == 1:
        return stated.pop()
    if stated:
        return f"{_UNSTATED}/{algorithm}"
    if algorithm in _ALGORITHM_RELATIONS:
        return _ALGORITHM_RELATIONS[algorithm]
    if algorithm in ("pate-fl", "private-knn-fl") and unit in ("agent", "record"):
        return f"agent/{ADD_REMOVE}" if unit == "agent" else REPLACE_ONE
    return f"{_UNSTATED}/{algorithm}"


def single_relation(classes: Iterable[str]) -> bool:
    """Whether entries of these classes compose as they are: one class, stated."""
    distinct = set(classes)
    return len(distinct) <= 1 and not any(c.startswith(f"{_UNSTATED}/") for c in distinct)


Curve = npt.NDArray[np.float64]

#: The Hölder exponents p tried at every order (q = p/(p−1)); p = 2 is the classical group-2
#: bound, the others help curves that grow faster or slower than linearly.
EXPONENTS: tuple[float, ...] = (1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)

_GRID = np.asarray(ORDERS, dtype=np.float64)


def upper_envelope_index(orders: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """For each order, the index of the smallest grid order ≥ it (``len(ORDERS)``: none)."""
    return np.searchsorted(_GRID, np.asarray(orders, dtype=np.float64), side="left")


def _at(curve: Curve, orders: npt.NDArray[np.float64]) -> Curve:
    """``curve`` (a non-decreasing bound on the grid) read at off-grid orders: the value at the
    next grid order above, +inf beyond the grid."""
    index = upper_envelope_index(orders)
    padded = np.append(curve, np.inf)
    return padded[np.minimum(index, len(curve))]


def replace_one_curve(curve: npt.ArrayLike) -> Curve:
    """An RDP curve on ``ORDERS`` for replacing one record, from a total that may mix add/remove
    and replace-one entries (module docstring).

    Args:
        curve: a client's total RDP curve on ``ORDERS`` (non-negative, +inf allowed).

    Returns:
        The converted curve, pointwise ≥ the monotone envelope of ``curve``; a curve that
        reaches zero (at the last order, hence everywhere) stays zero.

    Raises:
        ValueError: a curve of another length, or with NaN or negative values.
    """
    eps = np.asarray(curve, dtype=np.float64)
    if eps.shape != _GRID.shape:
        raise ValueError(f"a curve on ORDERS has {len(_GRID)} values, got shape {eps.shape}")
    if np.isnan(eps).any() or (eps < 0).any():
        raise ValueError("a curve must not hold NaN or negative values")
    envelope = np.minimum.accumulate(eps[::-1])[::-1]  # min over β ≥ α: still a valid bound
    if envelope[-1] == 0.0:  # D_α = 0 at some α > 1 only for equal distributions: nothing spent
        return np.zeros_like(envelope)
    best = np.full_like(envelope, np.inf)
    for p in EXPONENTS:
        q = p / (p - 1.0)
        first = (_GRID - 1.0 / p) / (_GRID - 1.0) * _at(envelope, p * _GRID)
        second = _at(envelope, q * (_GRID - 1.0 / p))
        with np.errstate(invalid="ignore"):  # 0·inf cannot occur: the coefficient is > 0
            best = np.minimum(best, first + second)
    return best
