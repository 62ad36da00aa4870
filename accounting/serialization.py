"""The stable JSON form of privacy events (what the ledger stores and replays).

Invariants: ``event_from_json(event_to_json(e)) == e`` for every event; the JSON form is a dict of
JSON-native values with a ``"kind"`` key naming the event class; fields are never removed or
renamed, only added with defaults (an older document always parses). Each event class writes and
reads its own fields (:meth:`DpEvent.json_fields`, :meth:`DpEvent.from_json_fields`); the kind is
looked up among the registered classes. Parsing is strict: an unknown kind, a missing or
unexpected field, a value of the wrong type or outside its domain raises
:class:`~dpfl.accounting.errors.InvalidEventError` whose message gives the path of the offending
field (``event.events[2].sigma``), because a silently ignored field could under-count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidEventError
from .event_protocol import DpEvent, EventJson, event_class, event_kinds
from .events import (
    ComposedEvent,
    DataDependentVotingEvent,
    GaussianEvent,
    NoPrivacyEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
)

__all__ = ["EVENT_KINDS", "event_from_json", "event_kinds", "event_to_json"]

#: The event kinds built into dpfl (:func:`event_kinds` adds the ones registered since).
EVENT_KINDS: tuple[str, ...] = tuple(
    c.kind
    for c in (
        NoPrivacyEvent,
        GaussianEvent,
        PoissonSampledEvent,
        SampledWithoutReplacementEvent,
        SelfComposedEvent,
        ComposedEvent,
        SkellamEvent,
        VotingEvent,
        DataDependentVotingEvent,
    )
)


def event_to_json(event: DpEvent) -> EventJson:
    """The JSON-serialisable dict of ``event`` (with key ``"kind"``).

    Raises:
        InvalidEventError: if ``event`` is not a registered dpfl privacy event.
    """
    if not isinstance(event, DpEvent) or event_class(event.kind) is not type(event):
        raise InvalidEventError(f"not a dpfl privacy event: {type(event).__name__}")
    return {"kind": event.kind, **event.json_fields(event_to_json)}


def _parse(data: object, path: str) -> DpEvent:
    if not isinstance(data, Mapping):
        raise InvalidEventError(f"{path} must be a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    if kind is None:
        raise InvalidEventError(f"{path} has no 'kind' field")
    cls = event_class(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidEventError(
            f"{path}.kind: unknown event kind {kind!r} (known: {', '.join(event_kinds())})"
        )
    required, optional = cls.json_schema()
    missing = [name for name in required if name not in data]
    if missing:
        raise InvalidEventError(f"{path} ({kind}) is missing field(s): {', '.join(missing)}")
    unexpected = sorted(set(data) - set(required) - set(optional) - {"kind"})
    if unexpected:
        raise InvalidEventError(f"{path} ({kind}) has unexpected field(s): {', '.join(unexpected)}")
    fields = {**optional, **{k: v for k, v in data.items() if k != "kind"}}
    try:
        return cls.from_json_fields(fields, path, _parse)
    except InvalidEventError as exc:
        message = str(exc)
        if message.startswith(path):
            raise
        raise InvalidEventError(f"{path}: {message}") from None


def event_from_json(data: Mapping[str, Any]) -> DpEvent:
    """Parse the JSON form written by :func:`event_to_json`.

    Args:
        data: the decoded JSON object.

    Returns:
        The event.

    Raises:
        InvalidEventError: naming the offending field on an unknown kind, a missing or
            unexpected field, a wrong type, or a value outside its domain.
    """
    return _parse(data, "event")
