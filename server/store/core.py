"""What every part of the store shares: the transaction hook, the clock, input checks, lookups.

A backend implements :meth:`StoreCore._transaction` (and ``close``); the mixins that make up
:class:`~dpfl.server.store.base.Store` only ever touch storage through the
:class:`~dpfl.server.store.tx.StoreTx` it yields.
"""

from __future__ import annotations

import abc
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from types import TracebackType
from typing import Self

from dpfl.server.errors import InvalidInput, NotFound
from dpfl.server.store.records import Agent, Job, JsonObject, ModelVersion, Round
from dpfl.server.store.tx import StoreTx

__all__ = [
    "MAX_INT",
    "MAX_NAME",
    "MAX_REASON",
    "StoreCore",
    "check_count",
    "check_labels",
    "check_name",
    "check_reason",
    "storable_text",
    "text_problem",
    "utc_now",
]

# ``fullmatch``, not ``match`` with ``$``: a ``$`` also matches before a trailing newline
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
_MAX_LABELS = 64
_MAX_LABEL_VALUE = 256
#: The longest name (an agent's, an actor's, a certificate's common name): their columns' size.
MAX_NAME = 200
#: The longest reason of an agent's status change (kept in its audit record).
MAX_REASON = 1000
_MAX_TEXT = 2000
#: The largest value of the SQL ``INTEGER`` columns (round numbers and attempts, model versions,
#: row ids, counts): PostgreSQL's ``integer`` is 32-bit, and the store bounds every backend alike.
MAX_INT = 2**31 - 1
#: Names of the control characters that have none in ``unicodedata``.
_CONTROL_NAMES = {
    0x00: "NUL",
    0x09: "TAB",
    0x0A: "LINE FEED",
    0x0D: "CARRIAGE RETURN",
    0x1B: "ESCAPE",
    0x7F: "DELETE",
}
_CATEGORIES = {
    "Cc": "a control character, Unicode category Cc",
    "Cf": "a format character, Unicode category Cf, such as a bidirectional override",
    "Cs": "an unpaired surrogate, which is not text",
}


def utc_now() -> datetime:
    return datetime.now(UTC)


class StoreCore(abc.ABC):
    """The backend hook and the helpers shared by the store's mixins."""

    def __init__(self, *, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or utc_now

    @abc.abstractmethod
    def _transaction(self, *, write: bool) -> AbstractContextManager[StoreTx]:
        """One transaction: every write inside it is applied on normal exit, none on an
        exception. ``write=False`` promises no writes (the backend may run it concurrently)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def ping(self) -> None:
        """Check that the storage answers (readiness probe).

        Raises:
            StoreUnavailable: the database cannot be reached.
        """
        with self._transaction(write=False) as tx:
            tx.get_meta("schema")

    # ------------------------------------------------------------------------------------------
    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise InvalidInput("the store's clock must return timezone-aware datetimes")
        # microseconds are what every backend keeps
        return now.astimezone(UTC)

    @staticmethod
    def _agent_of(tx: StoreTx, agent_id: str, *, lock: bool = False) -> Agent:
        agent = tx.get_agent(agent_id, lock=lock)
        if agent is None:
            raise NotFound(f"agent {agent_id!r} not found")
        return agent

    @staticmethod
    def _job_of(tx: StoreTx, job_id: str, *, lock: bool = False) -> Job:
        job = tx.get_job(job_id, lock=lock)
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    @staticmethod
    def _round_of(tx: StoreTx, round_id: int, *, lock: bool = False) -> Round:
        rnd = tx.get_round(check_count(round_id, "round id"), lock=lock)
        if rnd is None:
            raise NotFound(f"round {round_id!r} not found")
        return rnd

    def _insert_model(
        self, tx: StoreTx, job_id: str, data: bytes, round_id: int | None
    ) -> ModelVersion:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidInput(f"model data must be bytes, got {type(data).__name__}")
        blob = bytes(data)
        latest = tx.latest_model_version(job_id)
        model = ModelVersion(
            job_id=job_id,
            version=0 if latest is None else latest + 1,
            sha256=hashlib.sha256(blob).hexdigest(),
            size=len(blob),
            created_at=self._now(),
            round_id=round_id,
            data=blob,
        )
        tx.insert_model(model)
        return model

    @staticmethod
    def _existing_agents(
        tx: StoreTx, agent_ids: Iterable[str], *, lock: bool = False
    ) -> dict[str, Agent]:
        """The agents by id; NotFound names every missing one."""
        ids = sorted(set(agent_ids))
        found = tx.get_agents(ids, lock=lock)
        missing = [a for a in ids if a not in found]
        if missing:
            raise NotFound(f"agents not found: {', '.join(repr(a) for a in missing)}")
        return found


# ----------------------------------------------------------------------------------------------
# input checks (the store refuses bad values before touching storage)


def _refusal(char: str, multiline: bool) -> str | None:
    """Why ``char`` may not be part of a stored text (None: it may)."""
    category = unicodedata.category(char)
    if category not in _CATEGORIES or (multiline and char in "\t\n"):
        return None
    return _CATEGORIES[category]


def text_problem(value: str, *, multiline: bool = False) -> str | None:
    """Why ``value`` may not be stored, or None when it may.

    Refused: control characters (Unicode category Cc, NUL included, which PostgreSQL cannot
    store), format characters (Cf: the bidirectional overrides such as U+202E and the invisible
    zero-width ones, which make a name display as another) and unpaired surrogates (Cs: not
    text, no database encodes them). ``multiline`` allows tab and line feed (free text, such as
    a reason). The answer names the first offending code point and its position.
    """
    if value.isprintable():  # no Cc, Cf or Cs character (the common case, in C)
        return None
    for position, char in enumerate(value):
        why = _refusal(char, multiline)
        if why is None:
            continue
        code = ord(char)
        name = unicodedata.name(char, "") or _CONTROL_NAMES.get(code, "")
        shown = f"U+{code:04X}" + (f" {name}" if name else "")
        return f"character {shown} at position {position} is not allowed ({why})"
    return None


def storable_text(value: str) -> str:
    """``value`` with what no database can store (NUL, unpaired surrogates) replaced by U+FFFD.

    For text the coordinator writes itself (why a job failed, why a round was aborted), which
    may quote what an agent or a document said: it is recorded, never refused.
    """
    if "\x00" not in value and value.isprintable():
        return value
    return "".join(
        "\ufffd" if char == "\x00" or unicodedata.category(char) == "Cs" else char for char in value
    )


def check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise InvalidInput(
            f"{what} must be 1-64 characters of letters, digits, '.', '_', ':' or '-', "
            f"got {value!r}"
        )
    return value


def check_ids(values: Iterable[object], what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise InvalidInput(f"{what} must be a sequence of ids, not a string")
    out = tuple(check_id(v, what) for v in values)
    if len(set(out)) != len(out):
        raise InvalidInput(f"{what} contains duplicates")
    return out


def check_name(value: object, what: str = "name", *, max_chars: int = MAX_NAME) -> str:
    """A display name: not blank, at most ``max_chars``, no control or format character."""
    if not isinstance(value, str) or not value.strip() or len(value) > max_chars:
        raise InvalidInput(f"{what} must be a non-empty string of at most {max_chars} characters")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidInput(f"{what}: {problem}")
    return value


def check_reason(value: object, what: str = "reason", *, max_chars: int = MAX_REASON) -> str:
    """Free text an administrator gives (may be empty; tab and line feed allowed)."""
    if not isinstance(value, str) or len(value) > max_chars:
        raise InvalidInput(f"{what} must be a string of at most {max_chars} characters")
    problem = text_problem(value, multiline=True)
    if problem is not None:
        raise InvalidInput(f"{what}: {problem}")
    return value


def check_text(value: object, what: str) -> str:
    """Text the coordinator writes itself: not blank; truncated, and made storable."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-empty string")
    return storable_text(value[:_MAX_TEXT])


def check_labels(labels: Mapping[str, str] | None, what: str = "label") -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidInput(f"{what}s must be a mapping of strings to strings")
    if len(labels) > _MAX_LABELS:
        raise InvalidInput(f"at most {_MAX_LABELS} {what}s are allowed")
    out = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise InvalidInput(
                f"{what} key {key!r} must be 1-63 letters, digits, '.', '_', '/', '-'"
            )
        if not isinstance(value, str) or len(value) > _MAX_LABEL_VALUE:
            raise InvalidInput(
                f"{what} {key!r} must have a string value of at most {_MAX_LABEL_VALUE} characters"
            )
        problem = text_problem(value)
        if problem is not None:
            raise InvalidInput(f"{what} {key!r}: {problem}")
        out[key] = value
    return out


def check_number(value: object, what: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{what} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{what} must be >= {minimum:g}, got {value!r}")
    return float(value)


def check_count(value: object, what: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An integer in [``minimum``, ``maximum``] (by default what an SQL INTEGER column holds)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInput(f"{what} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return value


def check_json_object(value: Mapping[str, object] | None, what: str) -> JsonObject:
    """A JSON-serialisable mapping (deep-copied through JSON, so the store owns its copy)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a mapping")
    try:
        copied: JsonObject = json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be JSON-serialisable with finite numbers: {exc}") from None
    return copied
