"""A client's privacy figure: the tightest proven ε of ALL its charged events composed.

A history is a multiset of events (a client's rounds are few distinct events repeated many
times), so it is held as (event, count) groups and composed by self-composition per group: RDP
multiplies a curve by the count, the PLD composes a group by FFT self-convolution. The figure is
``compute_epsilon`` of that composition: the tight path (pessimistic PLD, or the exact Gaussian
profile) where every event has one, the RDP bound otherwise, and ``method`` says which. When the
entries do not all share one neighbouring relation
(:func:`dpfl.accounting.relations.single_relation`) nothing is composed as it is: the figure is
the RDP total converted to "replace one record"
(:func:`dpfl.accounting.relations.replace_one_curve`), method ``"rdp_replace_one"``. Every
figure is an upper bound (docs/accounting.md#which-bound-each-ledger-figure-is).

Figures are cached by (multiset, δ): a population charged the same rounds shares one
computation, and the budget check before a round and the commit after it compute the same
candidate once.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .errors import InvalidParameterError
from .event_protocol import DpEvent, FloatArray
from .events import ComposedEvent, SelfComposedEvent
from .orders import ORDERS
from .rdp import epsilon_from_rdp, rdp_curve
from .relations import replace_one_curve, single_relation
from .report import compute_epsilon
from .serialization import event_from_json, event_to_json
from .tight import clear_pld_cache

__all__ = [
    "ONE_JOB",
    "REPLACE_ONE_METHOD",
    "EventMultiset",
    "HistoryFigure",
    "canonical_event",
    "clear_history_cache",
    "history_figure",
]

#: ``method`` of a figure for a history that mixes neighbouring relations.
REPLACE_ONE_METHOD = "rdp_replace_one"
#: The relation tag of one job's events: one job is one algorithm, hence one relation.
ONE_JOB = "one_job"


def canonical_event(event: DpEvent | Mapping[str, object]) -> str:
    """The key-sorted compact JSON of an event (or of its stored JSON form): equal events give
    equal strings, so a history's groups are found by string."""
    data = event_to_json(event) if isinstance(event, DpEvent) else dict(event)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, slots=True)
class EventMultiset:
    """A history as ``((relation class, canonical event JSON), count)`` groups, sorted, every
    count ≥ 1. Immutable and hashable: the cache key of its figure."""

    groups: tuple[tuple[tuple[str, str], int], ...] = ()

    @classmethod
    def of(cls, counts: Iterable[tuple[tuple[str, str], int]]) -> EventMultiset:
        """Merge equal keys and drop zero counts.

        Raises:
            InvalidParameterError: a negative or non-integer count.
        """
        merged: Counter[tuple[str, str]] = Counter()
        for key, n in counts:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise InvalidParameterError(f"a history count must be an integer ≥ 0, got {n!r}")
            merged[key] += n
        return cls(tuple(sorted((k, n) for k, n in merged.items() if n > 0)))

    def plus(self, relation: str, event: str, count: int = 1) -> EventMultiset:
        """The history with ``count`` more of ``event`` (canonical JSON) under ``relation``."""
        return EventMultiset.of([*self.groups, ((relation, event), count)])

    @property
    def entries(self) -> int:
        return sum(n for _, n in self.groups)


@dataclass(frozen=True, slots=True)
class HistoryFigure:
    """A client's ε at δ over its whole history.

    Attributes:
        epsilon: an upper bound on ε at ``delta``.
        delta: δ.
        method: ``"pld"`` / ``"analytic_gaussian"`` (tight path), ``"rdp"`` (some event has
            none), ``"rdp_fallback"`` (the tight path failed), ``"rdp_replace_one"`` (mixed
            relations).
        rdp_epsilon: the RDP bound of the same history (before any relation conversion).
        entries: the number of events composed.
    """

    epsilon: float
    delta: float
    method: str
    rdp_epsilon: float
    entries: int


def history_figure(history: EventMultiset, delta: float) -> HistoryFigure:
    """The figure of ``history`` at ``delta`` (cached by both).

    Raises:
        InvalidParameterError: δ outside (0, 1).
        InvalidEventError / UnsupportedEventError: a stored event that no longer parses or has
            no bound at all.
    """
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise InvalidParameterError(f"delta must be a number in (0, 1), got {delta!r}")
    if not isinstance(history, EventMultiset):
        raise InvalidParameterError(f"a history must be an EventMultiset, got {history!r}")
    return _figure(history, float(delta))


def history_figures(wanted: Iterable[tuple[EventMultiset, float]]) -> None:
    """Compute the figures of several (history, δ) pairs into the cache, on up to two threads.

    The FFTs of a PLD release the GIL, so a commit whose clients have a few distinct histories
    computes two at once; a later :func:`history_figure` of any of them is a cache hit.
    """
    todo = sorted(set(wanted), key=lambda hd: (hd[0].entries, hd[0].groups, hd[1]))
    if len(todo) < 2:
        for history, delta in todo:
            history_figure(history, delta)
        return
    with ThreadPoolExecutor(max_workers=min(2, len(todo))) as pool:
        list(pool.map(lambda hd: history_figure(*hd), todo))


def clear_history_cache() -> None:
    """Forget every cached figure and PLD (benchmarks measure cold computations with it)."""
    _figure.cache_clear()
    _parsed.cache_clear()
    clear_pld_cache()


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> DpEvent:
    return event_from_json(json.loads(text))


@functools.lru_cache(maxsize=2048)
def _figure(history: EventMultiset, delta: float) -> HistoryFigure:
    if not history.groups:
        return HistoryFigure(0.0, delta, "rdp", 0.0, 0)
    counts: Counter[str] = Counter()
    for (_, text), n in history.groups:
        counts[text] += n
    parts = tuple(SelfComposedEvent(_parsed(text), n) for text, n in sorted(counts.items()))
    event: DpEvent = parts[0] if len(parts) == 1 else ComposedEvent(parts)
    if not single_relation(relation for (relation, _), _ in history.groups):
        curve = rdp_curve(event)
        rdp_eps = _rdp_epsilon(curve, delta)
        converted = _rdp_epsilon(replace_one_curve(curve), delta)
        return HistoryFigure(
            max(converted, rdp_eps), delta, REPLACE_ONE_METHOD, rdp_eps, history.entries
        )
    report = compute_epsilon(event, delta=delta, tight=True, shared_grid=True)
    rdp_eps = report.rdp_epsilon if report.rdp_epsilon is not None else math.inf
    return HistoryFigure(report.epsilon, delta, report.method, rdp_eps, history.entries)


def _rdp_epsilon(curve: FloatArray, delta: float) -> float:
    """ε of a composed curve; exactly 0 for a zero curve (nothing released)."""
    if not (curve > 0).any():
        return 0.0
    eps, _ = epsilon_from_rdp(curve, delta=delta, orders=ORDERS)
    return eps if math.isfinite(eps) else math.inf
