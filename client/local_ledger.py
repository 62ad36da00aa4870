"""The agent's own privacy ledger: SQLite in its state directory.

The agent does not trust the coordinator's arithmetic
(docs/architecture.md#rule-3-budgets-are-enforced-on-both-sides): it records what it spends
(``Algorithm.agent_charge``) before sending, one durable transaction per write (WAL,
``synchronous=FULL``), one row per release keyed by an attempt id it draws itself
(docs/accounting.md#what-the-agents-local-ledger-records-per-attempt). Each row keeps its events
and their RDP curve, so :meth:`LocalLedger.verify` can recompute it. ε at δ is the tight
composition of every recorded event (:func:`dpfl.accounting.history.history_figure`, the figure
the coordinator's ledger uses: pessimistic PLD where every event has a tight path, RDP otherwise,
the replace-one conversion where the agent's jobs mix neighbouring relations).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfl.accounting import (
    ORDERS,
    AccountingError,
    DpEvent,
    event_from_json,
    event_to_json,
    guaranteed_event,
    rdp_curve,
)
from dpfl.accounting.history import ONE_JOB, EventMultiset, canonical_event, history_figure
from dpfl.accounting.relations import relation_class
from dpfl.client.errors import AgentError

__all__ = [
    "LEDGER_FILENAME",
    "LedgerEntry",
    "LocalBudgetExceeded",
    "LocalLedger",
    "LocalLedgerError",
    "Spent",
]

LEDGER_FILENAME = "ledger.sqlite"
_SCHEMA_VERSION = 3
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    attempt TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    coordinator TEXT NOT NULL,
    events_json TEXT NOT NULL,
    curve BLOB NOT NULL,
    recorded_at REAL NOT NULL,
    session_id TEXT NOT NULL DEFAULT '',
    sent_sha256 TEXT NOT NULL DEFAULT '',
    unit TEXT NOT NULL DEFAULT '',
    UNIQUE (job_id, round, attempt)
);
CREATE INDEX IF NOT EXISTS charges_job ON charges (job_id);
"""
#: Columns added after version 1 (the unit after version 2); an older file gains the ones it
#: lacks (empty) when it is opened: its rows keep no unit, so votes among them stay unstated.
_ADDED_COLUMNS = (
    ("session_id", "TEXT NOT NULL DEFAULT ''"),
    ("sent_sha256", "TEXT NOT NULL DEFAULT ''"),
    ("unit", "TEXT NOT NULL DEFAULT ''"),
)
_UNITS = ("agent", "record", "")
_INSERT = (
    "INSERT INTO charges (job_id, round, attempt, algorithm, coordinator, events_json, curve, "
    "recorded_at, session_id, sent_sha256, unit) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_CURVE_RTOL = 1e-9


class LocalLedgerError(AgentError):
    """A local-ledger write was refused (bad or conflicting record) or its file is corrupt."""

    exit_code = 3  # like StateDirError: the ledger lives in the state directory


class LocalBudgetExceeded(LocalLedgerError):  # noqa: N818 (reads as the event it reports)
    """Recording the round would exceed a local budget; nothing was recorded."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One recorded contribution (one round attempt).

    ``session_id`` is the coordinator's session id (hex) the contribution was sent in,
    ``sent_sha256`` the SHA-256 (hex) of the bytes sent and ``unit`` the task's privacy unit
    (``"agent"``/``"record"``); each is empty in records written without it (by tests, or by an
    older ledger).
    """

    job_id: str
    round: int
    attempt: str
    algorithm: str
    coordinator: str
    events: tuple[DpEvent, ...]
    recorded_at: float
    session_id: str = ""
    sent_sha256: str = ""
    unit: str = ""


@dataclass(frozen=True, slots=True)
class Spent:
    """ε spent at ``delta``: in total and per job."""

    delta: float
    total: float
    by_job: dict[str, float]


def _canonical(events: Sequence[DpEvent]) -> tuple[str, npt.NDArray[np.float64]]:
    if isinstance(events, DpEvent) or not isinstance(events, Sequence) or not events:
        raise LocalLedgerError("a record needs a non-empty sequence of privacy events")
    stored = []
    curve = np.zeros(len(ORDERS))
    for i, event in enumerate(events):
        if not isinstance(event, DpEvent):
            raise LocalLedgerError(f"events[{i}] is not a privacy event: {event!r}")
        try:
            safe = guaranteed_event(event)
            curve = curve + rdp_curve(safe)
            stored.append(event_to_json(safe))
        except AccountingError as exc:
            raise LocalLedgerError(f"events[{i}] cannot be accounted: {exc}") from exc
    return json.dumps(stored, sort_keys=True, separators=(",", ":")), curve


def _key(job_id: str, round_: int, attempt: int | str) -> tuple[str, int, str]:
    if not isinstance(job_id, str) or not job_id:
        raise LocalLedgerError(f"job_id must be a non-empty string, got {job_id!r}")
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
        raise LocalLedgerError(f"round must be an integer >= 0, got {round_!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int | str):
        raise LocalLedgerError(f"attempt must be an integer >= 0 or a string, got {attempt!r}")
    if (isinstance(attempt, int) and attempt < 0) or attempt == "":
        raise LocalLedgerError(f"attempt must be an integer >= 0 or a string, got {attempt!r}")
    return job_id, round_, str(attempt)


def _check_unit(unit: str) -> str:
    if not isinstance(unit, str) or unit not in _UNITS:
        raise LocalLedgerError(f"unit must be 'agent', 'record' or '' (unknown), got {unit!r}")
    return unit


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise LocalLedgerError(f"delta must lie in (0, 1), got {delta!r}")
    return float(delta)


class LocalLedger:
    """The agent's ledger in one SQLite file; safe to share between threads of one process.

    Args:
        path: the database file (created with its schema when absent).

    Raises:
        LocalLedgerError: the file is not a ledger of this version or of this grid of orders.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            # write-ahead log: a commit appends to one file and syncs it once, where the
            # rollback journal creates, syncs and deletes a journal and syncs the database too;
            # with synchronous=FULL the commit is on disk before record() returns either way
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
            self._check_meta()
        except sqlite3.DatabaseError as exc:
            raise LocalLedgerError(f"cannot open the local ledger {self.path}: {exc}") from exc

    @classmethod
    def open(cls, state_dir: str | Path) -> LocalLedger:
        """The ledger of an agent's state directory (``STATE_DIR/ledger.sqlite``)."""
        folder = Path(state_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LocalLedgerError(f"cannot create the state directory {folder}: {exc}") from exc
        return cls(folder / LEDGER_FILENAME)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> LocalLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _check_meta(self) -> None:
        expected = {"schema_version": str(_SCHEMA_VERSION), "orders": json.dumps(list(ORDERS))}
        with self._transaction() as conn:
            rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if not rows:
                conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", expected.items())
                return
            old = rows.get("schema_version") in ("1", "2")
            if old and rows.get("orders") == expected["orders"]:
                # an older version lacks some of the added columns: add them, in this transaction
                present = {r[1] for r in conn.execute("PRAGMA table_info(charges)").fetchall()}
                for name, kind in _ADDED_COLUMNS:
                    if name not in present:
                        conn.execute(f"ALTER TABLE charges ADD COLUMN {name} {kind}")
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    (str(_SCHEMA_VERSION),),
                )
                rows["schema_version"] = str(_SCHEMA_VERSION)
        for key, value in expected.items():
            if rows.get(key) != value:
                raise LocalLedgerError(
                    f"{self.path} is not a local ledger of this version ({key} differs)"
                )

    # -- writes --------------------------------------------------------------------------------

    def record(
        self,
        *,
        job_id: str,
        round: int,
        attempt: int | str = 0,
        events: Sequence[DpEvent],
        algorithm: str = "",
        coordinator: str = "",
        unit: str = "",
        session_id: str = "",
        sent_sha256: str = "",
        max_epsilon_job: float | None = None,
        max_epsilon_total: float | None = None,
        delta: float | None = None,
    ) -> bool:
        """Record one round's events (what ``agent_charge`` returned), atomically.

        Args:
            job_id, round, attempt: the key (the task loop's attempt is a fresh random id per
                accepted invitation: every contribution it sends is a new row).
            events: the events to record.
            algorithm, coordinator, session_id: stored for the operator.
            unit: the task's privacy unit, ``"agent"`` or ``"record"`` (``""``: unknown); with
                the algorithm it states the relation of votes that do not carry their level.
            sent_sha256: the SHA-256 (hex) of the contribution about to be sent; a recorded key
                is a no-op only for the same events, unit AND digest (a byte-identical resend).
            max_epsilon_job, max_epsilon_total, delta: when given, the budgets are checked at
                ``delta`` INSIDE the write transaction (SQLite's write lock), so two rounds
                recorded at once cannot together overspend.

        Returns:
            True if recorded now, False if this exact record was already there.

        Raises:
            LocalBudgetExceeded: a budget would be exceeded; nothing was recorded.
            LocalLedgerError: bad key, events, unit or text fields, or different events or
                another contribution already recorded under ``(job_id, round, attempt)``.
        """
        key, (text, curve) = _key(job_id, round, attempt), _canonical(events)
        unit = _check_unit(unit)
        for name, value in (("session_id", session_id), ("sent_sha256", sent_sha256)):
            if not isinstance(value, str):
                raise LocalLedgerError(f"{name} must be a string, got {value!r}")
        limits = (max_epsilon_job, max_epsilon_total)
        if any(v is not None for v in limits) and delta is None:
            raise LocalLedgerError("budgets need the delta they are measured at")
        with self._transaction() as conn:
            if _recorded(conn, key, text, unit, sent_sha256):
                return False
            if delta is not None:
                self._check_budgets(key, events, algorithm, unit, limits, _check_delta(delta))
            row = (*key, algorithm, coordinator, text, curve.astype("<f8").tobytes(), time.time())
            conn.execute(_INSERT, (*row, session_id, sent_sha256, unit))
        return True

    def _check_budgets(
        self,
        key: tuple[str, int, str],
        events: Sequence[DpEvent],
        algorithm: str,
        unit: str,
        limits: tuple[float | None, float | None],
        delta: float,
    ) -> None:
        """Refuse a record whose events would bring ε at ``delta`` over a limit (of the job,
        of all jobs); run inside the write transaction."""
        job_id, round_, _ = key
        for limit, scope in zip(limits, (job_id, None), strict=True):
            if limit is None:
                continue
            eps = self._figure(scope, events, algorithm, unit, delta)
            if eps > limit:
                where = f"job {job_id!r}" if scope is not None else "all jobs"
                raise LocalBudgetExceeded(
                    f"recording round {round_} would bring ε on {where} to {eps:.4g} > "
                    f"{limit:g} at δ = {delta:g}"
                )

    # -- reads ---------------------------------------------------------------------------------

    def _rows(
        self, job_id: str | None, columns: str, tail: str = " ORDER BY id"
    ) -> list[tuple[Any, ...]]:
        query = f"SELECT {columns} FROM charges"
        args: tuple[str, ...] = ()
        if job_id is not None:
            query, args = query + " WHERE job_id = ?", (job_id,)
        with self._lock:
            return self._conn.execute(query + tail, args).fetchall()

    def entries(self, *, job_id: str | None = None) -> list[LedgerEntry]:
        """The recorded rounds, oldest first (one job's, or all)."""
        out = []
        for row in self._rows(
            job_id,
            "job_id, round, attempt, algorithm, coordinator, events_json, recorded_at, "
            "session_id, sent_sha256, unit",
        ):
            try:
                events = tuple(event_from_json(e) for e in json.loads(row[5]))
            except (ValueError, AccountingError) as exc:
                raise LocalLedgerError(f"corrupt record {row[:3]}: {exc}") from exc
            out.append(LedgerEntry(row[0], row[1], row[2], row[3], row[4], events, *row[6:]))
        return out

    def jobs(self) -> list[str]:
        """The job ids with at least one record."""
        with self._lock:
            rows = self._conn.execute("SELECT DISTINCT job_id FROM charges ORDER BY job_id")
            return [r[0] for r in rows.fetchall()]

    def curve(self, *, job_id: str | None = None) -> npt.NDArray[np.float64]:
        """The summed RDP curve on :data:`ORDERS` (one job's, or all)."""
        total = np.zeros(len(ORDERS))
        for (blob,) in self._rows(job_id, "curve"):
            values = np.frombuffer(blob, dtype="<f8")
            if values.shape != total.shape:
                raise LocalLedgerError("a stored curve does not match the grid of orders")
            total = total + values
        return total

    def _history(self, job_id: str | None, algorithm_of_job: bool) -> EventMultiset:
        """The recorded events (one job's, or all) as a multiset; ``algorithm_of_job``: one
        job's events share one relation (its algorithm's), so they are tagged alike."""
        columns, groups = "algorithm, unit, events_json, COUNT(*)", []
        for algorithm, unit, text, count in self._rows(job_id, columns, " GROUP BY 1, 2, 3"):
            try:
                events = [event_from_json(e) for e in json.loads(text)]
            except (ValueError, AccountingError) as exc:
                raise LocalLedgerError(f"a corrupt record of job {job_id!r}: {exc}") from exc
            groups += [(_tag(e, algorithm, unit, algorithm_of_job), count) for e in events]
        return EventMultiset.of(groups)

    def _figure(
        self,
        job_id: str | None,
        extra: Sequence[DpEvent],
        algorithm: str,
        unit: str,
        delta: float,
    ) -> float:
        """ε at ``delta`` of the recorded events (one job's, or all) with ``extra`` (of a job of
        ``algorithm`` and ``unit``) added."""
        history = self._history(job_id, job_id is not None)
        for e in extra:
            history = history.plus(*_tag(guaranteed_event(e), algorithm, unit, job_id is not None))
        try:
            return history_figure(history, delta).epsilon
        except AccountingError as exc:
            raise LocalLedgerError(f"the recorded events cannot be accounted: {exc}") from exc

    def epsilon(self, *, delta: float, job_id: str | None = None) -> float:
        """ε spent at ``delta``, in total or on one job (0 when nothing is recorded)."""
        return self._figure(job_id, (), "", "", _check_delta(delta))

    def epsilon_with(
        self,
        events: Sequence[DpEvent],
        *,
        job_id: str,
        delta: float,
        algorithm: str = "",
        unit: str = "",
    ) -> tuple[float, float]:
        """``(ε of job_id, ε in total)`` at ``delta`` if ``events`` (of a job of ``algorithm``
        protecting ``unit``, as :meth:`record` takes them) were recorded too.

        Raises:
            LocalLedgerError: events that cannot be accounted, or a bad unit.
        """
        _canonical(events)
        d, u = _check_delta(delta), _check_unit(unit)
        job = self._figure(job_id, events, algorithm, u, d)
        return job, self._figure(None, events, algorithm, u, d)

    def spent(self, *, delta: float) -> Spent:
        """ε at ``delta`` in total and per job."""
        d = _check_delta(delta)
        return Spent(
            delta=d,
            total=self.epsilon(delta=d),
            by_job={job: self.epsilon(delta=d, job_id=job) for job in self.jobs()},
        )

    def verify(self) -> None:
        """Recompute every stored curve from its events.

        docs/architecture.md#rule-2-every-event-can-be-recomputed.

        Raises:
            LocalLedgerError: naming the first record whose curve disagrees.
        """
        for entry, (blob,) in zip(self.entries(), self._rows(None, "curve"), strict=True):
            _, again = _canonical(entry.events)
            stored = np.frombuffer(blob, dtype="<f8")
            finite = np.isfinite(again)
            if not np.array_equal(np.isfinite(stored), finite) or not np.allclose(
                stored[finite], again[finite], rtol=_CURVE_RTOL, atol=0.0
            ):
                raise LocalLedgerError(
                    f"job {entry.job_id!r} round {entry.round} attempt {entry.attempt}: the "
                    "stored RDP curve disagrees with its events"
                )


def _recorded(
    conn: sqlite3.Connection, key: tuple[str, int, str], text: str, unit: str, sent_sha256: str
) -> bool:
    """Whether ``key`` already holds this record (a resend); a conflicting one raises."""
    row = conn.execute(
        "SELECT events_json, unit, sent_sha256 FROM charges "
        "WHERE job_id = ? AND round = ? AND attempt = ?",
        key,
    ).fetchone()
    if row is None:
        return False
    where = f"job {key[0]!r} round {key[1]} attempt {key[2]} is already recorded"
    if tuple(row[:2]) != (text, unit):
        raise LocalLedgerError(f"{where} with different events or unit")
    if row[2] != sent_sha256:
        raise LocalLedgerError(
            f"{where} for another contribution: only the same bytes may be sent again under a "
            "recorded attempt"
        )
    return True


def _tag(event: DpEvent, algorithm: str, unit: str, one_job: bool) -> tuple[str, str]:
    """(relation class, canonical JSON) of a recorded event: its relation
    (:func:`dpfl.accounting.relations.relation_class`, from its algorithm and unit; a row without
    a unit states none), or :data:`ONE_JOB` within one job."""
    relation = ONE_JOB if one_job else relation_class(event, algorithm, unit or None)
    return relation, canonical_event(event)
