"""Ledger arithmetic shared by every store backend (pure: no I/O, no transactions).

The rules of docs/architecture.md#the-privacy-ledger rest here: charges are validated completely
before anything is written, every entry's event JSON must parse back to the same event
(:func:`recompute` is what ``verify_ledger`` compares with), and budgets compare the client's
figure: the tight composition of its grouped history (:class:`HistoryGroup`,
:mod:`dpfl.accounting.history`). RDP curves are cached per entry and summed per job for the
RDP figures shown beside it. A data-dependent curve is kept as the elementwise minimum of both
upper bounds; the guaranteed counterpart is what is charged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import JsonValue

from dpfl.accounting import (
    ORDERS,
    AccountingError,
    DpEvent,
    epsilon_from_rdp,
    event_from_json,
    event_to_json,
    guaranteed_event,
    is_data_dependent,
    rdp_curve,
)
from dpfl.accounting.history import EventMultiset, canonical_event, history_figure
from dpfl.accounting.relations import relation_class
from dpfl.server.errors import InvalidInput, LedgerIntegrityError
from dpfl.server.store.records import Agent, BudgetCheck, Charge, JsonObject, ProtectedUnit

__all__ = [
    "CURVE_RTOL",
    "CurveSum",
    "HistoryGroup",
    "OwnShareGroup",
    "PreparedCharge",
    "canonical_json",
    "check_delta",
    "decode_curve",
    "encode_curve",
    "epsilon_of",
    "evaluate_budget",
    "history_of",
    "orders_fingerprint",
    "own_share_history",
    "prepare_charges",
    "recompute",
    "relation_of",
    "same_curve",
]

Curve = npt.NDArray[np.float64]

#: Relative tolerance of ``verify_ledger``: a recomputed curve or a running sum may differ from
#: the stored one only by floating-point reassociation.
CURVE_RTOL = 1e-9
_ATOL = 1e-12


def encode_curve(curve: Curve) -> bytes:
    """A curve as little-endian float64 bytes (keeps +inf exactly, unlike JSON)."""
    return np.ascontiguousarray(curve, dtype="<f8").tobytes()


def decode_curve(blob: bytes) -> Curve:
    """The inverse of :func:`encode_curve`, checked against the length of ``ORDERS``."""
    if len(blob) != 8 * len(ORDERS):
        raise LedgerIntegrityError(
            f"a stored RDP curve has {len(blob)} bytes, expected {8 * len(ORDERS)} "
            "(one float64 per order of dpfl.accounting.ORDERS)"
        )
    return np.frombuffer(blob, dtype="<f8").astype(np.float64)


def orders_fingerprint(orders: Sequence[float] = ORDERS) -> str:
    """SHA-256 of the order grid, stored beside the curves so a changed grid is noticed."""
    return hashlib.sha256(np.asarray(orders, dtype="<f8").tobytes()).hexdigest()


def canonical_json(value: Any) -> str:
    """Key-sorted compact JSON: equal documents give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise InvalidInput(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def _checked_curve(event: DpEvent, what: str) -> Curve:
    curve = np.asarray(rdp_curve(event), dtype=np.float64)
    if curve.shape != (len(ORDERS),):
        raise InvalidInput(f"{what}: the RDP curve has shape {curve.shape}, not ({len(ORDERS)},)")
    if np.isnan(curve).any() or (curve < 0).any():
        raise InvalidInput(f"{what}: the RDP curve has NaN or negative values")
    return curve


@dataclass(frozen=True, slots=True)
class PreparedCharge:
    """A validated charge with its event JSON and curves computed, ready to be written."""

    agent_id: str
    unit: ProtectedUnit
    approximate: bool
    secure_aggregation: bool
    honest_fraction: float
    event: JsonObject
    curve: Curve
    data_dependent_event: JsonObject | None
    data_dependent_curve: Curve | None
    #: the canonical JSON of ``event`` (the key of its history group)
    event_text: str = ""
    #: f₁ of the round (:class:`~dpfl.server.store.records.Charge`), None when unknown
    own_noise_fraction: float | None = None

    def relation(self, algorithm: str) -> str:
        """The neighbouring relation class of this charge in a job of ``algorithm``."""
        return relation_of(self.event_text, algorithm, self.unit.value)

    def identity(self) -> tuple[Any, ...]:
        """What must match for a repeated commit to count as the same charge."""
        dd = self.data_dependent_event
        return (
            self.agent_id,
            self.unit.value,
            self.approximate,
            self.secure_aggregation,
            self.honest_fraction,
            canonical_json(self.event),
            None if dd is None else canonical_json(dd),
            self.own_noise_fraction,
        )


def _as_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be True or False, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class _CheckedEvent:
    event: JsonObject
    curve: Curve
    data_dependent_event: JsonObject | None
    data_dependent_curve: Curve | None
    text: str


def _check_event(event: DpEvent, what: str) -> _CheckedEvent:
    """A charge's event validated: its guaranteed part and (if any) its data-dependent one
    survive their JSON round trip, and their curves are computed."""
    try:
        guaranteed = guaranteed_event(event)
        dd = event if is_data_dependent(event) else None
        for ev in (guaranteed, dd):
            if ev is not None and event_from_json(event_to_json(ev)) != ev:
                raise InvalidInput(f"{what}: the event does not survive its JSON round trip")
        curve = _checked_curve(guaranteed, what)
        dd_curve = None if dd is None else np.minimum(_checked_curve(dd, what), curve)
    except AccountingError as exc:
        raise InvalidInput(f"{what}: {exc}") from exc
    return _CheckedEvent(
        event=event_to_json(guaranteed),
        curve=curve,
        data_dependent_event=None if dd is None else event_to_json(dd),
        data_dependent_curve=dd_curve,
        text=canonical_event(guaranteed),
    )


def _own_fraction(value: object, what: str) -> float | None:
    """A charge's f₁: None (unknown) or a number in (0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InvalidInput(f"{what}: own_noise_fraction must be None or in (0, 1], got {value!r}")
    return float(value)


def prepare_charges(charges: Sequence[Charge]) -> list[PreparedCharge]:
    """Validate a round's charges and compute their curves, before anything is written.

    Args:
        charges: at most one per client.

    Returns:
        The prepared charges, in the given order.

    Raises:
        InvalidInput: a duplicated client, a bad flag, honest or own-noise fraction, an event that
            ``dpfl.accounting`` rejects, or one that does not survive its JSON round trip.
    """
    # DP-FedAvg charges one event to a whole population: each distinct event is checked, its
    # JSON built and its curves computed once
    checked: dict[DpEvent, _CheckedEvent] = {}
    seen: set[str] = set()
    out = []
    for i, charge in enumerate(charges):
        if not isinstance(charge, Charge):
            raise InvalidInput(f"charges[{i}] must be a Charge, got {type(charge).__name__}")
        what = f"charge of agent {charge.agent_id!r}"
        if not isinstance(charge.agent_id, str) or not charge.agent_id:
            raise InvalidInput(f"charges[{i}].agent_id must be a non-empty string")
        if charge.agent_id in seen:
            raise InvalidInput(f"{what}: one charge per client and round (got two)")
        seen.add(charge.agent_id)
        try:
            unit = ProtectedUnit(charge.unit)
        except ValueError:
            raise InvalidInput(f"{what}: unit must be 'record' or 'agent'") from None
        t = charge.honest_fraction
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 1:
            raise InvalidInput(f"{what}: honest_fraction must be in (0, 1], got {t!r}")
        try:
            event = checked.get(charge.event)
        except TypeError:  # unhashable, so no event: _check_event names the problem
            event = None
        if event is None:
            event = checked[charge.event] = _check_event(charge.event, what)
        out.append(
            PreparedCharge(
                agent_id=charge.agent_id,
                unit=unit,
                approximate=_as_bool(charge.approximate, f"{what}: approximate"),
                secure_aggregation=_as_bool(
                    charge.secure_aggregation, f"{what}: secure_aggregation"
                ),
                honest_fraction=float(t),
                event=event.event,
                curve=event.curve,
                data_dependent_event=event.data_dependent_event,
                data_dependent_curve=event.data_dependent_curve,
                event_text=event.text,
                own_noise_fraction=_own_fraction(charge.own_noise_fraction, what),
            )
        )
    return out


def recompute(
    event: Mapping[str, JsonValue], data_dependent_event: Mapping[str, JsonValue] | None
) -> tuple[Curve, Curve | None]:
    """The curves of a stored entry, recomputed from its stored parameters alone (rule 2).

    Raises:
        LedgerIntegrityError: a stored event that no longer parses or cannot be accounted.
    """
    try:
        curve = _checked_curve(event_from_json(dict(event)), "stored event")
        dd = None
        if data_dependent_event is not None:
            dd_raw = _checked_curve(event_from_json(dict(data_dependent_event)), "stored event")
            dd = np.minimum(dd_raw, curve)
    except (AccountingError, InvalidInput) as exc:
        raise LedgerIntegrityError(f"a stored event cannot be recomputed: {exc}") from exc
    return curve, dd


def same_curve(a: Curve, b: Curve) -> bool:
    """Equal up to :data:`CURVE_RTOL`, with +inf exactly where the other has +inf."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if not np.array_equal(inf_a, inf_b) or np.isnan(a).any() or np.isnan(b).any():
        return False
    finite = ~inf_a
    return bool(np.allclose(a[finite], b[finite], rtol=CURVE_RTOL, atol=_ATOL))


@dataclass(frozen=True, slots=True)
class CurveSum:
    """The running sum of one client's curves in one job (a cache of the ledger entries).

    ``data_dependent_curve`` sums each entry's data-dependent curve where it has one and its
    guaranteed curve otherwise; ``data_dependent_entries`` counts the former.
    """

    agent_id: str
    job_id: str
    curve: Curve
    data_dependent_curve: Curve
    entries: int
    data_dependent_entries: int

    @classmethod
    def zero(cls, agent_id: str, job_id: str) -> CurveSum:
        z = np.zeros(len(ORDERS), dtype=np.float64)
        return cls(agent_id, job_id, z, z.copy(), 0, 0)

    def add(self, curve: Curve, data_dependent_curve: Curve | None) -> CurveSum:
        """The sum with one more entry of these curves."""
        return CurveSum(
            self.agent_id,
            self.job_id,
            self.curve + curve,
            self.data_dependent_curve
            + (curve if data_dependent_curve is None else data_dependent_curve),
            self.entries + 1,
            self.data_dependent_entries + (data_dependent_curve is not None),
        )

    def plus(self, charge: PreparedCharge) -> CurveSum:
        return self.add(charge.curve, charge.data_dependent_curve)


@dataclass(frozen=True, slots=True)
class HistoryGroup:
    """``entries`` ledger entries of one client in one job with the same relation class and
    guaranteed event (``event``: its canonical JSON). The client's history is the multiset of
    its groups over every job (:func:`history_of`)."""

    agent_id: str
    job_id: str
    relation: str
    event: str
    entries: int

    @property
    def key(self) -> str:
        """SHA-256 (hex) of the relation class and the event: the group's stored key."""
        return hashlib.sha256(f"{self.relation}\n{self.event}".encode()).hexdigest()


def history_of(groups: Iterable[HistoryGroup], *, relation: str | None = None) -> EventMultiset:
    """The multiset of the given groups (those of one client: over every job, or one job's);
    ``relation`` replaces every group's relation class (one job's groups share one relation)."""
    return EventMultiset.of(
        ((g.relation if relation is None else relation, g.event), g.entries) for g in groups
    )


@dataclass(frozen=True, slots=True)
class OwnShareGroup:
    """``entries`` ledger entries of one client with the same algorithm, unit, stored event
    (``event``: its JSON text as stored) and f₁ (``own_noise_fraction``, None: unknown)."""

    agent_id: str
    algorithm: str
    unit: str
    event: str
    own_noise_fraction: float | None
    entries: int


def own_share_history(groups: Iterable[OwnShareGroup]) -> tuple[EventMultiset | None, str]:
    """One client's history with each entry's event scaled to its own share's noise
    (``DpEvent.with_noise_fraction(f₁)``), tagged as the agent's ledger tags it; or (None, the
    reason) when some entry's f₁ is unknown or an event cannot be scaled: never a figure that
    could under-state (docs/accounting.md#what-the-agent-can-verify)."""
    counts: list[tuple[tuple[str, str], int]] = []
    unknown = 0
    for g in groups:
        if g.own_noise_fraction is None:
            unknown += g.entries
            continue
        try:
            text = _scaled(g.event, g.own_noise_fraction)
            counts.append(((relation_of(text, g.algorithm, g.unit), text), g.entries))
        except AccountingError as exc:
            return None, f"an event of algorithm {g.algorithm!r} cannot be scaled: {exc}"
    if unknown:
        return None, (
            f"{unknown} ledger entr{'y was' if unknown == 1 else 'ies were'} written before the "
            "coordinator recorded each round's own-noise fraction (f₁ unknown)"
        )
    return EventMultiset.of(counts), ""


@functools.lru_cache(maxsize=1024)
def _scaled(event_json: str, fraction: float) -> str:
    """The canonical JSON of a stored event with its noise variance scaled by ``fraction``."""
    return canonical_event(event_from_json(json.loads(event_json)).with_noise_fraction(fraction))


def total(sums: Iterable[CurveSum]) -> tuple[Curve, Curve, int, int]:
    """Guaranteed and data-dependent curves of several jobs composed (RDP adds)."""
    curve = np.zeros(len(ORDERS), dtype=np.float64)
    dd = np.zeros(len(ORDERS), dtype=np.float64)
    entries = dd_entries = 0
    for s in sums:
        curve = curve + s.curve
        dd = dd + s.data_dependent_curve
        entries += s.entries
        dd_entries += s.data_dependent_entries
    return curve, dd, entries, dd_entries


def epsilon_of(curve: Curve, delta: float) -> tuple[float, float | None]:
    """(ε, optimal order) of a composed curve at ``delta``; exactly (0, None) for a zero curve.

    A mechanism whose Rényi divergence is 0 at every order releases nothing about the data
    (it is (0, 0)-DP), so the conversion's additive log(1/δ)/(α−1) term does not apply.
    """
    delta = check_delta(delta)
    arr = np.ascontiguousarray(curve, dtype=np.float64)
    if not (arr > 0).any():
        return 0.0, None
    return _converted(arr.tobytes(), delta)


@functools.lru_cache(maxsize=4096)
def _converted(blob: bytes, delta: float) -> tuple[float, float | None]:
    """The conversion of one curve (its float64 bytes), memoised: a round's budget checks and
    commit convert each client's curve, and clients of one job mostly share the same one."""
    arr = np.frombuffer(blob, dtype=np.float64)
    epsilon, order = epsilon_from_rdp(arr, delta=delta, orders=ORDERS)
    if not math.isfinite(epsilon):
        return math.inf, None
    return float(epsilon), float(order)


def evaluate_budget(
    agent: Agent,
    history: EventMultiset,
    extra: tuple[str, str],
    *,
    data_dependent: tuple[Curve, Curve] | None = None,
) -> BudgetCheck:
    """Would one more ``extra`` = (relation class, event JSON) on top of ``history`` keep
    ``agent`` within its budget?

    ε is the client's figure (:func:`dpfl.accounting.history.history_figure`: the tight
    composition of every event, RDP where some event has no tight path) at the budget's own δ;
    an agent without a budget is always allowed (and reports no ε, since there is no δ to
    measure it at). ``data_dependent``: the operator's opt-in, (the client's data-dependent
    curve, the new entry's guaranteed curve); each figure is then the smaller of the two.
    """
    if agent.budget is None:
        return BudgetCheck(agent.id, True, None, None, None)
    delta = agent.budget.delta
    before = history_figure(history, delta).epsilon
    candidate = history_figure(history.plus(*extra), delta)
    after, method = candidate.epsilon, candidate.method
    if data_dependent is not None:
        current, added = data_dependent
        before = min(before, epsilon_of(current, delta)[0])
        dd_after = epsilon_of(current + added, delta)[0]
        if dd_after < after:
            after, method = dd_after, "rdp_data_dependent"
    return BudgetCheck(agent.id, after <= agent.budget.epsilon, agent.budget, before, after, method)


@functools.lru_cache(maxsize=1024)
def relation_of(event_text: str, algorithm: str, unit: str) -> str:
    """The relation class of a charge's guaranteed event (its canonical JSON) in a job of
    ``algorithm`` (:func:`dpfl.accounting.relations.relation_class`), memoised: a round charges
    one event to a whole population."""
    return relation_class(event_from_json(json.loads(event_text)), algorithm, unit)
