"""An in-process store for simulations and tests: same rules, nothing persisted.

Transactions hold one re-entrant lock (so they are serialised) and keep an undo log: every write
records how to revert itself, and an exception inside the transaction replays the log backwards,
which gives the all-or-nothing behaviour of a database transaction. Records are copied on the way
in and out, so callers never share mutable state with the store.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from dpfl.server.errors import AlreadyExists, StoreUnavailable
from dpfl.server.store.base import Store
from dpfl.server.store.ledger import Curve, CurveSum, PreparedCharge
from dpfl.server.store.records import (
    Agent,
    AgentStatus,
    AuditRecord,
    CredentialKind,
    EnrollmentToken,
    Job,
    JobStatus,
    LedgerEntry,
    ModelVersion,
    Round,
    RoundStatus,
)
from dpfl.server.store.tx import CredentialRow, EnrollmentTokenRow, NewRound, StoreTx

__all__ = ["MemoryStore"]

K = TypeVar("K")
V = TypeVar("V")
_MISSING = object()


@dataclass
class _State:
    agents: dict[str, Agent] = field(default_factory=dict)
    credentials: dict[str, CredentialRow] = field(default_factory=dict)
    tokens: dict[str, EnrollmentTokenRow] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    members: dict[tuple[str, str], datetime] = field(default_factory=dict)
    rounds: dict[int, Round] = field(default_factory=dict)
    models: dict[tuple[str, int], ModelVersion] = field(default_factory=dict)
    entries: dict[int, LedgerEntry] = field(default_factory=dict)
    entry_keys: dict[tuple[int, str], int] = field(default_factory=dict)
    sums: dict[tuple[str, str], CurveSum] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    audit: dict[int, AuditRecord] = field(default_factory=dict)
    audit_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    round_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    entry_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))


def _copy(value: V) -> V:
    return copy.deepcopy(value)


def _copy_sum(s: CurveSum) -> CurveSum:
    return replace(s, curve=s.curve.copy(), data_dependent_curve=s.data_dependent_curve.copy())


class _MemoryTx(StoreTx):
    def __init__(self, state: _State) -> None:
        self._s = state
        self.undo: list[Callable[[], None]] = []

    # writes with undo ---------------------------------------------------------------------------
    def _put(self, table: dict[K, V], key: K, value: V) -> None:
        old: Any = table.get(key, _MISSING)
        table[key] = value

        def undo() -> None:
            if old is _MISSING:
                table.pop(key, None)
            else:
                table[key] = old

        self.undo.append(undo)

    def _insert(self, table: dict[K, V], key: K, value: V, what: str) -> None:
        if key in table:
            raise AlreadyExists(f"{what} already exists")
        self._put(table, key, value)

    def _delete(self, table: dict[K, V], key: K) -> None:
        if key in table:
            old = table.pop(key)
            self.undo.append(lambda: table.__setitem__(key, old))

    # agents and credentials ---------------------------------------------------------------------
    def insert_agent(self, agent: Agent) -> None:
        self._insert(self._s.agents, agent.id, _copy(agent), f"agent {agent.id!r}")

    def get_agent(self, agent_id: str, *, lock: bool = False) -> Agent | None:
        return _copy(self._s.agents.get(agent_id))

    def get_agents(self, agent_ids: Sequence[str], *, lock: bool = False) -> dict[str, Agent]:
        return {a: _copy(self._s.agents[a]) for a in sorted(agent_ids) if a in self._s.agents}

    def list_agents(self, *, except_status: AgentStatus | None = None) -> list[Agent]:
        agents = [a for a in self._s.agents.values() if a.status != except_status]
        return _copy(sorted(agents, key=lambda a: (a.created_at, a.id)))

    def update_agent(self, agent: Agent) -> None:
        self._put(self._s.agents, agent.id, _copy(agent))

    def insert_credential(self, row: CredentialRow) -> None:
        if any(c.token_hash == row.token_hash for c in self._s.credentials.values()):
            raise AlreadyExists("credential already exists")
        self._insert(self._s.credentials, row.id, row, f"credential {row.id!r}")

    def credentials_of(self, agent_id: str, kind: CredentialKind) -> list[CredentialRow]:
        return [
            c
            for c in self._s.credentials.values()
            if c.agent_id == agent_id and c.kind == kind and c.revoked_at is None
        ]

    def credential_by_hash(self, token_hash: str) -> CredentialRow | None:
        return next((c for c in self._s.credentials.values() if c.token_hash == token_hash), None)

    def revoke_credentials(self, agent_id: str, kind: CredentialKind | None, at: datetime) -> int:
        hits = [
            c
            for c in self._s.credentials.values()
            if c.agent_id == agent_id and c.revoked_at is None and (kind is None or c.kind == kind)
        ]
        for c in hits:
            self._put(self._s.credentials, c.id, replace(c, revoked_at=at))
        return len(hits)

    def insert_enrollment_token(self, row: EnrollmentTokenRow) -> None:
        self._insert(self._s.tokens, row.token_hash, _copy(row), "enrollment token")

    def enrollment_token_by_hash(
        self, token_hash: str, *, lock: bool = False
    ) -> EnrollmentTokenRow | None:
        return _copy(self._s.tokens.get(token_hash))

    def mark_enrollment_token_used(self, token_id: str, agent_id: str, at: datetime) -> bool:
        for key, row in self._s.tokens.items():
            if row.info.id == token_id:
                if row.info.used_at is not None:
                    return False
                info = replace(row.info, used_at=at, agent_id=agent_id)
                self._put(self._s.tokens, key, replace(row, info=info))
                return True
        return False

    def list_enrollment_tokens(self) -> list[EnrollmentToken]:
        infos = [r.info for r in self._s.tokens.values()]
        return _copy(sorted(infos, key=lambda i: (i.created_at, i.id)))

    # jobs ---------------------------------------------------------------------------------------
    def insert_job(self, job: Job) -> None:
        self._insert(self._s.jobs, job.id, _copy(job), f"job {job.id!r}")

    def get_job(self, job_id: str, *, lock: bool = False) -> Job | None:
        return _copy(self._s.jobs.get(job_id))

    def list_jobs(self, status: JobStatus | None) -> list[Job]:
        jobs = [j for j in self._s.jobs.values() if status is None or j.status == status]
        return _copy(sorted(jobs, key=lambda j: (j.created_at, j.id)))

    def update_job(self, job: Job) -> None:
        self._put(self._s.jobs, job.id, _copy(job))

    def add_members(self, job_id: str, agent_ids: Sequence[str], at: datetime) -> None:
        for a in agent_ids:
            if (job_id, a) not in self._s.members:
                self._put(self._s.members, (job_id, a), at)

    def remove_members(self, job_id: str, agent_ids: Sequence[str]) -> None:
        for a in agent_ids:
            self._delete(self._s.members, (job_id, a))

    def members(self, job_id: str) -> list[str]:
        return sorted(a for (j, a) in self._s.members if j == job_id)

    def jobs_of_agent(self, agent_id: str) -> list[str]:
        return sorted(j for (j, a) in self._s.members if a == agent_id)

    # rounds -------------------------------------------------------------------------------------
    def insert_round(self, new: NewRound) -> Round:
        if any(
            (r.job_id, r.number, r.attempt) == (new.job_id, new.number, new.attempt)
            for r in self._s.rounds.values()
        ):
            raise AlreadyExists(f"attempt {new.attempt} of round {new.number} already exists")
        rnd = Round(
            id=next(self._s.round_ids),
            job_id=new.job_id,
            number=new.number,
            attempt=new.attempt,
            status=RoundStatus.RUNNING,
            started_at=new.started_at,
            committed_at=None,
            finished_at=None,
            invited=tuple(new.invited),
            accepted=(),
            survivors={},
            dropped={},
            stage_seconds={},
            noise=_copy(new.noise),
            accuracy=None,
            epsilon=None,
            model_version=None,
            abort_reason=None,
        )
        self._put(self._s.rounds, rnd.id, rnd)
        return _copy(rnd)

    def get_round(self, round_id: int, *, lock: bool = False) -> Round | None:
        return _copy(self._s.rounds.get(round_id))

    def rounds_of_job(self, job_id: str, number: int | None = None) -> list[Round]:
        rounds = [
            r
            for r in self._s.rounds.values()
            if r.job_id == job_id and (number is None or r.number == number)
        ]
        return _copy(sorted(rounds, key=lambda r: (r.number, r.attempt)))

    def rounds_with_status(self, statuses: Sequence[RoundStatus]) -> list[Round]:
        return _copy([r for _, r in sorted(self._s.rounds.items()) if r.status in statuses])

    def update_round(self, rnd: Round) -> None:
        self._put(self._s.rounds, rnd.id, _copy(rnd))

    # models -------------------------------------------------------------------------------------
    def insert_model(self, model: ModelVersion) -> None:
        key = (model.job_id, model.version)
        self._insert(self._s.models, key, model, f"model version {model.version}")

    def get_model(self, job_id: str, version: int, *, with_data: bool) -> ModelVersion | None:
        model = self._s.models.get((job_id, version))
        if model is None or with_data:
            return model
        return replace(model, data=None)

    def list_models(self, job_id: str) -> list[ModelVersion]:
        return [
            replace(m, data=None) for (j, _), m in sorted(self._s.models.items()) if j == job_id
        ]

    def latest_model_version(self, job_id: str) -> int | None:
        return max((v for (j, v) in self._s.models if j == job_id), default=None)

    # ledger -------------------------------------------------------------------------------------
    def insert_entries(
        self, rnd: Round, algorithm: str, charges: Sequence[PreparedCharge], at: datetime
    ) -> list[LedgerEntry]:
        out = []
        for c in charges:
            key = (rnd.id, c.agent_id)
            if key in self._s.entry_keys:
                raise AlreadyExists(f"agent {c.agent_id!r} is already charged for round {rnd.id}")
            entry = LedgerEntry(
                id=next(self._s.entry_ids),
                agent_id=c.agent_id,
                job_id=rnd.job_id,
                round_id=rnd.id,
                round_number=rnd.number,
                attempt=rnd.attempt,
                algorithm=algorithm,
                unit=c.unit,
                event=_copy(c.event),
                curve=tuple(float(x) for x in c.curve),
                approximate=c.approximate,
                secure_aggregation=c.secure_aggregation,
                honest_fraction=c.honest_fraction,
                data_dependent_event=_copy(c.data_dependent_event),
                data_dependent_curve=None
                if c.data_dependent_curve is None
                else tuple(float(x) for x in c.data_dependent_curve),
                created_at=at,
            )
            self._put(self._s.entry_keys, key, entry.id)
            self._put(self._s.entries, entry.id, entry)
            out.append(_copy(entry))
        return out

    def entries(
        self,
        *,
        agent_id: str | None = None,
        job_id: str | None = None,
        round_id: int | None = None,
    ) -> list[LedgerEntry]:
        return _copy(
            [
                e
                for _, e in sorted(self._s.entries.items())
                if (agent_id is None or e.agent_id == agent_id)
                and (job_id is None or e.job_id == job_id)
                and (round_id is None or e.round_id == round_id)
            ]
        )

    def curve_sums(
        self, agent_ids: Sequence[str] | None = None, job_id: str | None = None
    ) -> list[CurveSum]:
        wanted = None if agent_ids is None else set(agent_ids)
        return [
            _copy_sum(s)
            for (a, j), s in sorted(self._s.sums.items())
            if (wanted is None or a in wanted) and (job_id is None or j == job_id)
        ]

    def put_curve_sums(self, sums: Sequence[CurveSum]) -> None:
        for s in sums:
            self._put(self._s.sums, (s.agent_id, s.job_id), _copy_sum(s))

    def replace_entry_curves(
        self, entry_id: int, curve: Curve, data_dependent_curve: Curve | None
    ) -> None:
        entry = self._s.entries[entry_id]
        dd = None if data_dependent_curve is None else tuple(map(float, data_dependent_curve))
        self._put(
            self._s.entries,
            entry_id,
            replace(entry, curve=tuple(map(float, curve)), data_dependent_curve=dd),
        )

    def delete_curve_sums(self) -> None:
        for key in list(self._s.sums):
            self._delete(self._s.sums, key)

    # agents by certificate and the audit trail ------------------------------------------------
    def agent_by_certificate_cn(self, certificate_cn: str) -> Agent | None:
        for agent in self._s.agents.values():
            if agent.certificate_cn == certificate_cn:
                return _copy(agent)
        return None

    def insert_audit(
        self, *, at: datetime, actor: str, action: str, agent_id: str | None, detail: str
    ) -> AuditRecord:
        record = AuditRecord(next(self._s.audit_ids), at, actor, action, agent_id, detail)
        self._insert(self._s.audit, record.id, record, f"audit record {record.id}")
        return record

    def list_audit(self, agent_id: str | None, limit: int) -> list[AuditRecord]:
        records = [r for r in self._s.audit.values() if agent_id is None or r.agent_id == agent_id]
        return sorted(records, key=lambda r: r.id)[-limit:] if limit > 0 else []

    # metadata -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        return self._s.meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self._put(self._s.meta, key, value)


class MemoryStore(Store):
    """A store that lives in this process only (``memory://``)."""

    def __init__(self, *, clock: Callable[[], datetime] | None = None) -> None:
        super().__init__(clock=clock)
        self._state = _State()
        self._lock = threading.RLock()
        self._closed = False
        self._ensure_orders()

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[StoreTx]:
        with self._lock:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            tx = _MemoryTx(self._state)
            try:
                yield tx
            except BaseException:
                for undo in reversed(tx.undo):
                    undo()
                raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
