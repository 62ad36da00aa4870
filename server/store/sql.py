"""The SQL store: SQLAlchemy 2 over SQLite (default) or PostgreSQL (psycopg 3).

Every public store method is one database transaction (a ``Session`` in ``begin()`` mode), so the
all-or-nothing behaviour the ledger relies on is the database's own. Unique keys are checked by
the database; a violation becomes :class:`~dpfl.server.errors.AlreadyExists` (or ``Conflict``) and
rolls the whole transaction back. Row locks (``SELECT ... FOR UPDATE``) serialise concurrent
charges of one client on PostgreSQL; SQLite serialises writers with ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from dpfl.server.errors import AlreadyExists, StoreError
from dpfl.server.store.base import Store
from dpfl.server.store.engine import (
    WRITE_OPTION,
    create_store_engine,
    database_error,
    is_memory_sqlite,
    upgrade_to_head,
)
from dpfl.server.store.ledger import (
    Curve,
    CurveSum,
    HistoryGroup,
    OwnShareGroup,
    PreparedCharge,
    encode_curve,
)
from dpfl.server.store.models import (
    AgentRow,
    AuditRecordRow,
    CredentialRowModel,
    CurveSumRow,
    EnrollmentTokenRowModel,
    HistoryGroupRow,
    JobMemberRow,
    JobRow,
    LedgerEntryRow,
    MetaRow,
    ModelVersionRow,
    PrivacyAuditRow,
    RoundRow,
)
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
    PrivacyAudit,
    PrivacyAuditFigures,
    Round,
    RoundStatus,
)
from dpfl.server.store.sql_rows import (
    agent_record,
    audit_record,
    credential_record,
    curve_sum,
    entry_from_charge,
    entry_record,
    job_record,
    model_record,
    privacy_audit_record,
    round_record,
    set_round_row,
    token_record,
)
from dpfl.server.store.tx import (
    CredentialRow,
    EnrollmentTokenRow,
    EntryKey,
    NewRound,
    StoreTx,
)

__all__ = ["SqlStore"]


# the tables the hot ledger path reads and writes with Core statements (no ORM objects): a round
# of a large population charges every member
_AGENTS = cast(sa.Table, AgentRow.__table__)
_ENTRIES = cast(sa.Table, LedgerEntryRow.__table__)
_SUMS = cast(sa.Table, CurveSumRow.__table__)
_GROUPS = cast(sa.Table, HistoryGroupRow.__table__)


class _SqlTx(StoreTx):
    def __init__(self, session: Session) -> None:
        self._s = session

    def _add(self, row: Any, what: str) -> None:
        self._s.add(row)
        try:
            self._s.flush()
        except IntegrityError:
            raise AlreadyExists(f"{what} already exists") from None

    def _get(self, model: type[Any], key: Any, lock: bool) -> Any:
        return self._s.get(model, key, with_for_update=lock or None)

    # agents and credentials ---------------------------------------------------------------------
    def insert_agent(self, agent: Agent) -> None:
        budget = agent.budget
        row = AgentRow(
            id=agent.id,
            name=agent.name,
            labels=dict(agent.labels),
            status=agent.status.value,
            budget_epsilon=None if budget is None else budget.epsilon,
            budget_delta=None if budget is None else budget.delta,
            created_at=agent.created_at,
            certificate_cn=agent.certificate_cn,
        )
        self._add(row, f"agent {agent.id!r}")

    def get_agent(self, agent_id: str, *, lock: bool = False) -> Agent | None:
        row = self._get(AgentRow, agent_id, lock)
        return None if row is None else agent_record(row)

    def get_agents(self, agent_ids: Sequence[str], *, lock: bool = False) -> dict[str, Agent]:
        if not agent_ids:
            return {}
        table = _AGENTS
        query = sa.select(table).where(table.c.id.in_(sorted(agent_ids))).order_by(table.c.id)
        if lock:
            query = query.with_for_update()
        return {row.id: agent_record(row) for row in self._s.execute(query)}

    def list_agents(self, *, except_status: AgentStatus | None = None) -> list[Agent]:
        table = _AGENTS
        query = sa.select(table).order_by(table.c.created_at, table.c.id)
        if except_status is not None:
            query = query.where(table.c.status != except_status.value)
        return [agent_record(r) for r in self._s.execute(query)]

    def update_agent(self, agent: Agent) -> None:
        row = self._s.get_one(AgentRow, agent.id)
        row.name = agent.name
        row.labels = dict(agent.labels)
        row.status = agent.status.value
        row.budget_epsilon = None if agent.budget is None else agent.budget.epsilon
        row.budget_delta = None if agent.budget is None else agent.budget.delta
        row.certificate_cn = agent.certificate_cn

    def insert_credential(self, row: CredentialRow) -> None:
        model = CredentialRowModel(
            id=row.id,
            agent_id=row.agent_id,
            kind=row.kind.value,
            token_hash=row.token_hash,
            created_at=row.created_at,
            revoked_at=row.revoked_at,
        )
        self._add(model, "credential")

    def credentials_of(self, agent_id: str, kind: CredentialKind) -> list[CredentialRow]:
        query = sa.select(CredentialRowModel).where(
            CredentialRowModel.agent_id == agent_id,
            CredentialRowModel.kind == kind.value,
            CredentialRowModel.revoked_at.is_(None),
        )
        return [credential_record(r) for r in self._s.scalars(query)]

    def credential_by_hash(self, token_hash: str) -> CredentialRow | None:
        query = sa.select(CredentialRowModel).where(CredentialRowModel.token_hash == token_hash)
        row = self._s.scalars(query).one_or_none()
        return None if row is None else credential_record(row)

    def revoke_credentials(self, agent_id: str, kind: CredentialKind | None, at: datetime) -> int:
        query = sa.select(CredentialRowModel).where(
            CredentialRowModel.agent_id == agent_id, CredentialRowModel.revoked_at.is_(None)
        )
        if kind is not None:
            query = query.where(CredentialRowModel.kind == kind.value)
        rows = list(self._s.scalars(query))
        for row in rows:
            row.revoked_at = at
        return len(rows)

    def insert_enrollment_token(self, row: EnrollmentTokenRow) -> None:
        info = row.info
        model = EnrollmentTokenRowModel(
            id=info.id,
            token_hash=row.token_hash,
            created_at=info.created_at,
            expires_at=info.expires_at,
            budget_epsilon=None if info.budget is None else info.budget.epsilon,
            budget_delta=None if info.budget is None else info.budget.delta,
            labels=dict(info.labels),
            used_at=None,
            agent_id=None,
        )
        self._add(model, "enrollment token")

    def enrollment_token_by_hash(
        self, token_hash: str, *, lock: bool = False
    ) -> EnrollmentTokenRow | None:
        query = sa.select(EnrollmentTokenRowModel).where(
            EnrollmentTokenRowModel.token_hash == token_hash
        )
        if lock:
            query = query.with_for_update()
        row = self._s.scalars(query).one_or_none()
        return None if row is None else EnrollmentTokenRow(token_record(row), row.token_hash)

    def mark_enrollment_token_used(self, token_id: str, agent_id: str, at: datetime) -> bool:
        self._s.flush()
        result = self._s.execute(
            sa.update(EnrollmentTokenRowModel)
            .where(
                EnrollmentTokenRowModel.id == token_id, EnrollmentTokenRowModel.used_at.is_(None)
            )
            .values(used_at=at, agent_id=agent_id)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0) == 1)

    def list_enrollment_tokens(self) -> list[EnrollmentToken]:
        query = sa.select(EnrollmentTokenRowModel).order_by(
            EnrollmentTokenRowModel.created_at, EnrollmentTokenRowModel.id
        )
        return [token_record(r) for r in self._s.scalars(query)]

    # jobs ---------------------------------------------------------------------------------------
    def insert_job(self, job: Job) -> None:
        row = JobRow(
            id=job.id,
            name=job.name,
            algorithm=job.algorithm,
            spec=dict(job.spec),
            delta=job.delta,
            status=job.status.value,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            error=job.error,
        )
        self._add(row, f"job {job.id!r}")

    def get_job(self, job_id: str, *, lock: bool = False) -> Job | None:
        row = self._get(JobRow, job_id, lock)
        return None if row is None else job_record(row)

    def list_jobs(self, status: JobStatus | None) -> list[Job]:
        query = sa.select(JobRow).order_by(JobRow.created_at, JobRow.id)
        if status is not None:
            query = query.where(JobRow.status == status.value)
        return [job_record(r) for r in self._s.scalars(query)]

    def update_job(self, job: Job) -> None:
        row = self._s.get_one(JobRow, job.id)
        row.status = job.status.value
        row.started_at = job.started_at
        row.finished_at = job.finished_at
        row.error = job.error

    def add_members(self, job_id: str, agent_ids: Sequence[str], at: datetime) -> None:
        present = set(self.members(job_id))
        for a in agent_ids:
            if a not in present:
                self._s.add(JobMemberRow(job_id=job_id, agent_id=a, added_at=at))
        self._s.flush()

    def remove_members(self, job_id: str, agent_ids: Sequence[str]) -> None:
        if agent_ids:
            self._s.execute(
                sa.delete(JobMemberRow).where(
                    JobMemberRow.job_id == job_id, JobMemberRow.agent_id.in_(list(agent_ids))
                )
            )

    def members(self, job_id: str) -> list[str]:
        query = (
            sa.select(JobMemberRow.agent_id)
            .where(JobMemberRow.job_id == job_id)
            .order_by(JobMemberRow.agent_id)
        )
        return list(self._s.scalars(query))

    def jobs_of_agent(self, agent_id: str) -> list[str]:
        query = (
            sa.select(JobMemberRow.job_id)
            .where(JobMemberRow.agent_id == agent_id)
            .order_by(JobMemberRow.job_id)
        )
        return list(self._s.scalars(query))

    # rounds -------------------------------------------------------------------------------------
    def insert_round(self, new: NewRound) -> Round:
        row = RoundRow(
            job_id=new.job_id,
            number=new.number,
            attempt=new.attempt,
            status=RoundStatus.RUNNING.value,
            started_at=new.started_at,
            invited=list(new.invited),
            accepted=[],
            survivors={},
            dropped={},
            stage_seconds={},
            setup=new.setup.to_json(),
        )
        self._add(row, f"attempt {new.attempt} of round {new.number}")
        return round_record(row)

    def get_round(self, round_id: int, *, lock: bool = False) -> Round | None:
        row = self._get(RoundRow, round_id, lock)
        return None if row is None else round_record(row)

    def rounds_of_job(self, job_id: str, number: int | None = None) -> list[Round]:
        query = (
            sa.select(RoundRow)
            .where(RoundRow.job_id == job_id)
            .order_by(RoundRow.number, RoundRow.attempt)
        )
        if number is not None:
            query = query.where(RoundRow.number == number)
        return [round_record(r) for r in self._s.scalars(query)]

    def rounds_with_status(self, statuses: Sequence[RoundStatus]) -> list[Round]:
        query = (
            sa.select(RoundRow)
            .where(RoundRow.status.in_([s.value for s in statuses]))
            .order_by(RoundRow.id)
        )
        return [round_record(r) for r in self._s.scalars(query)]

    def update_round(self, rnd: Round) -> None:
        set_round_row(self._s.get_one(RoundRow, rnd.id), rnd)

    # models -------------------------------------------------------------------------------------
    def insert_model(self, model: ModelVersion) -> None:
        row = ModelVersionRow(
            job_id=model.job_id,
            version=model.version,
            sha256=model.sha256,
            size=model.size,
            data=model.data or b"",
            created_at=model.created_at,
            round_id=model.round_id,
        )
        self._add(row, f"model version {model.version} of job {model.job_id!r}")

    def get_model(self, job_id: str, version: int, *, with_data: bool) -> ModelVersion | None:
        row = self._s.get(ModelVersionRow, (job_id, version))
        return None if row is None else model_record(row, with_data=with_data)

    def list_models(self, job_id: str) -> list[ModelVersion]:
        cols = [c for c in ModelVersionRow.__table__.c if c.name != "data"]
        query = (
            sa.select(*cols)
            .where(ModelVersionRow.job_id == job_id)
            .order_by(ModelVersionRow.version)
        )
        return [ModelVersion(**dict(r._mapping)) for r in self._s.execute(query)]

    def latest_model_version(self, job_id: str) -> int | None:
        query = sa.select(sa.func.max(ModelVersionRow.version)).where(
            ModelVersionRow.job_id == job_id
        )
        value = self._s.scalar(query)
        return None if value is None else int(value)

    # ledger -------------------------------------------------------------------------------------
    def insert_entries(
        self, rnd: Round, algorithm: str, charges: Sequence[PreparedCharge], at: datetime
    ) -> list[LedgerEntry]:
        # one executemany INSERT, then the ids by client (not a unit of work of N objects)
        table = _ENTRIES
        values = [
            {
                "agent_id": c.agent_id,
                "job_id": rnd.job_id,
                "round_id": rnd.id,
                "round_number": rnd.number,
                "attempt": rnd.attempt,
                "algorithm": algorithm,
                "unit": c.unit.value,
                "event": c.event,
                "curve": encode_curve(c.curve),
                "approximate": c.approximate,
                "secure_aggregation": c.secure_aggregation,
                "honest_fraction": c.honest_fraction,
                "own_noise_fraction": c.own_noise_fraction,
                "data_dependent_event": c.data_dependent_event,
                "data_dependent_curve": None
                if c.data_dependent_curve is None
                else encode_curve(c.data_dependent_curve),
                "created_at": at,
            }
            for c in charges
        ]
        if not values:
            return []
        try:
            self._s.execute(sa.insert(table), values)
        except IntegrityError:
            raise AlreadyExists(
                f"a client of round {rnd.id} already has a ledger entry for it"
            ) from None
        query = sa.select(table.c.agent_id, table.c.id).where(table.c.round_id == rnd.id)
        ids: dict[str, int] = {row.agent_id: row.id for row in self._s.execute(query)}
        return [entry_from_charge(ids[c.agent_id], rnd, algorithm, c, at) for c in charges]

    def entries(
        self,
        *,
        agent_id: str | None = None,
        job_id: str | None = None,
        round_id: int | None = None,
    ) -> list[LedgerEntry]:
        table = _ENTRIES
        query = sa.select(table).order_by(table.c.id)
        if agent_id is not None:
            query = query.where(table.c.agent_id == agent_id)
        if job_id is not None:
            query = query.where(table.c.job_id == job_id)
        if round_id is not None:
            query = query.where(table.c.round_id == round_id)
        return [entry_record(r) for r in self._s.execute(query)]

    def entry_keys(
        self,
        *,
        job_id: str | None = None,
        approximate: bool | None = None,
    ) -> list[EntryKey]:
        table = _ENTRIES
        c = table.c
        query = sa.select(c.id, c.agent_id, c.job_id, c.round_id, c.approximate).order_by(c.id)
        if job_id is not None:
            query = query.where(c.job_id == job_id)
        if approximate is not None:
            query = query.where(c.approximate == approximate)
        return [
            EntryKey(r.id, r.agent_id, r.job_id, r.round_id, bool(r.approximate))
            for r in self._s.execute(query)
        ]

    def charged_agents(self, round_id: int) -> set[str]:
        table = _ENTRIES
        query = sa.select(table.c.agent_id).where(table.c.round_id == round_id)
        return set(self._s.execute(query).scalars())

    def curve_sums(
        self, agent_ids: Sequence[str] | None = None, job_id: str | None = None
    ) -> list[CurveSum]:
        table = _SUMS
        query = sa.select(table).order_by(table.c.agent_id, table.c.job_id)
        if agent_ids is not None:
            query = query.where(table.c.agent_id.in_(list(agent_ids)))
        if job_id is not None:
            query = query.where(table.c.job_id == job_id)
        return [curve_sum(r) for r in self._s.execute(query)]

    def put_curve_sums(self, sums: Sequence[CurveSum]) -> None:
        # the keys that exist, one query per job; then one executemany UPDATE and one INSERT
        table = _SUMS
        existing: set[tuple[str, str]] = set()
        for job_id in {s.job_id for s in sums}:
            query = sa.select(table.c.agent_id).where(
                table.c.job_id == job_id,
                table.c.agent_id.in_([s.agent_id for s in sums if s.job_id == job_id]),
            )
            existing.update((a, job_id) for a in self._s.execute(query).scalars())
        rows = [
            {
                "key_agent": s.agent_id,
                "key_job": s.job_id,
                "curve": encode_curve(s.curve),
                "data_dependent_curve": encode_curve(s.data_dependent_curve),
                "entries": s.entries,
                "data_dependent_entries": s.data_dependent_entries,
            }
            for s in sums
        ]
        updates = [r for r in rows if (r["key_agent"], r["key_job"]) in existing]
        inserts = [
            {**r, "agent_id": r["key_agent"], "job_id": r["key_job"]}
            for r in rows
            if (r["key_agent"], r["key_job"]) not in existing
        ]
        if updates:
            statement = (
                sa.update(table)
                .where(
                    table.c.agent_id == sa.bindparam("key_agent"),
                    table.c.job_id == sa.bindparam("key_job"),
                )
                .values(
                    curve=sa.bindparam("curve"),
                    data_dependent_curve=sa.bindparam("data_dependent_curve"),
                    entries=sa.bindparam("entries"),
                    data_dependent_entries=sa.bindparam("data_dependent_entries"),
                )
            )
            self._s.execute(statement, updates)
        if inserts:
            for r in inserts:
                del r["key_agent"], r["key_job"]
            self._s.execute(sa.insert(table), inserts)

    def replace_entry_curves(
        self, entry_id: int, curve: Curve, data_dependent_curve: Curve | None
    ) -> None:
        row = self._s.get_one(LedgerEntryRow, entry_id)
        row.curve = encode_curve(curve)
        row.data_dependent_curve = (
            None if data_dependent_curve is None else encode_curve(data_dependent_curve)
        )

    def delete_curve_sums(self) -> None:
        self._s.flush()  # pending entry curve changes first
        for obj in list(self._s.identity_map.values()):
            if isinstance(obj, CurveSumRow):
                self._s.expunge(obj)
        self._s.execute(sa.delete(CurveSumRow).execution_options(synchronize_session=False))

    def history_groups(
        self, agent_ids: Sequence[str] | None = None, job_id: str | None = None
    ) -> list[HistoryGroup]:
        c = _GROUPS.c
        query = sa.select(c.agent_id, c.job_id, c.relation, c.event, c.entries).order_by(
            c.agent_id, c.job_id, c.key
        )
        if agent_ids is not None:
            query = query.where(c.agent_id.in_(list(agent_ids)))
        if job_id is not None:
            query = query.where(c.job_id == job_id)
        return [
            HistoryGroup(r.agent_id, r.job_id, r.relation, r.event, r.entries)
            for r in self._s.execute(query)
        ]

    def own_share_groups(self, agent_ids: Sequence[str] | None = None) -> list[OwnShareGroup]:
        # grouped in the database: a round charges one event to many clients, so the groups
        # are few; the event as its stored text (JSON on both backends, written by one encoder)
        c = _ENTRIES.c
        event = sa.cast(c.event, sa.Text).label("event")
        keys = (c.agent_id, c.algorithm, c.unit, event, c.own_noise_fraction)
        query = sa.select(*keys, sa.func.count().label("n")).group_by(*keys).order_by(*keys)
        if agent_ids is not None:
            query = query.where(c.agent_id.in_(list(agent_ids)))
        return [
            OwnShareGroup(r.agent_id, r.algorithm, r.unit, r.event, r.own_noise_fraction, r.n)
            for r in self._s.execute(query)
        ]

    def add_history(self, groups: Sequence[HistoryGroup]) -> None:
        # the keys that exist, one query per job; then one executemany UPDATE and one INSERT
        c = _GROUPS.c
        existing: set[tuple[str, str, str]] = set()
        for job_id in {g.job_id for g in groups}:
            query = sa.select(c.agent_id, c.key).where(
                c.job_id == job_id,
                c.agent_id.in_(sorted({g.agent_id for g in groups if g.job_id == job_id})),
            )
            existing.update((r.agent_id, job_id, r.key) for r in self._s.execute(query))
        updates, inserts = [], []
        for g in groups:
            if (g.agent_id, g.job_id, g.key) in existing:
                updates.append(
                    {"k_agent": g.agent_id, "k_job": g.job_id, "k_key": g.key, "n": g.entries}
                )
            else:
                inserts.append(
                    {
                        "agent_id": g.agent_id,
                        "job_id": g.job_id,
                        "key": g.key,
                        "relation": g.relation,
                        "event": g.event,
                        "entries": g.entries,
                    }
                )
        if updates:
            statement = (
                sa.update(_GROUPS)
                .where(
                    c.agent_id == sa.bindparam("k_agent"),
                    c.job_id == sa.bindparam("k_job"),
                    c.key == sa.bindparam("k_key"),
                )
                .values(entries=c.entries + sa.bindparam("n"))
            )
            self._s.execute(statement, updates)
        if inserts:
            self._s.execute(sa.insert(_GROUPS), inserts)

    def delete_history_groups(self) -> None:
        self._s.execute(sa.delete(_GROUPS))

    # agents by certificate and the audit trail ------------------------------------------------
    def agent_by_certificate_cn(self, certificate_cn: str) -> Agent | None:
        query = sa.select(AgentRow).where(AgentRow.certificate_cn == certificate_cn)
        row = self._s.scalars(query).first()
        return None if row is None else agent_record(row)

    def insert_audit(
        self, *, at: datetime, actor: str, action: str, agent_id: str | None, detail: str
    ) -> AuditRecord:
        row = AuditRecordRow(at=at, actor=actor, action=action, agent_id=agent_id, detail=detail)
        self._s.add(row)
        self._s.flush()
        return audit_record(row)

    def list_audit(self, agent_id: str | None, limit: int) -> list[AuditRecord]:
        query = sa.select(AuditRecordRow).order_by(AuditRecordRow.id.desc()).limit(limit)
        if agent_id is not None:
            query = query.where(AuditRecordRow.agent_id == agent_id)
        return [audit_record(r) for r in reversed(list(self._s.scalars(query)))]

    # privacy audits ---------------------------------------------------------------------------
    def insert_privacy_audit(
        self, job_id: str, figures: PrivacyAuditFigures, at: datetime
    ) -> PrivacyAudit:
        row = PrivacyAuditRow(
            job_id=job_id,
            created_at=at,
            mode=figures.mode,
            unit=figures.unit,
            relation=figures.relation,
            canaries=figures.canaries,
            guesses=figures.guesses,
            correct=figures.correct,
            confidence=figures.confidence,
            delta=figures.delta,
            epsilon_lower=figures.epsilon_lower,
            epsilon_upper=figures.epsilon_upper,
            mu_lower=figures.mu_lower,
            epsilon_lower_gdp=figures.epsilon_lower_gdp,
            details=dict(figures.details),
        )
        self._add(row, f"an audit of job {job_id!r}")
        return privacy_audit_record(row)

    def privacy_audits_of_job(self, job_id: str) -> list[PrivacyAudit]:
        query = (
            sa.select(PrivacyAuditRow)
            .where(PrivacyAuditRow.job_id == job_id)
            .order_by(PrivacyAuditRow.id)
        )
        return [privacy_audit_record(r) for r in self._s.scalars(query)]

    # metadata -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._s.get(MetaRow, key)
        return None if row is None else row.value

    def set_meta(self, key: str, value: str) -> None:
        row = self._s.get(MetaRow, key)
        if row is None:
            self._s.add(MetaRow(key=key, value=value))
        else:
            row.value = value
        self._s.flush()


class SqlStore(Store):
    """The store in a SQL database; the schema is migrated to the newest version on open.

    Args:
        url: any SQLAlchemy URL (``sqlite:///./dpfl.db``, ``postgresql://user@host/db``).
        clock: injectable time source (tests).
        migrate: run the Alembic upgrade (False only for tests of the migrations themselves).

    Raises:
        StoreUnavailable: the database cannot be reached or migrated.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        clock: Callable[[], datetime] | None = None,
        migrate: bool = True,
    ) -> None:
        super().__init__(clock=clock)
        self.engine = create_store_engine(url)
        self._writer = self.engine.execution_options(**{WRITE_OPTION: True})
        # a read transaction sees one snapshot on every backend: SQLite's WAL reader does, and
        # PostgreSQL's default (READ COMMITTED) would give each statement its own view
        self._reader = (
            self.engine
            if self.engine.url.get_backend_name() == "sqlite"
            else self.engine.execution_options(isolation_level="REPEATABLE READ")
        )
        # an in-memory SQLite database is one connection shared by every thread: transactions
        # must take turns on it, or they would interleave inside one another
        self._serial: AbstractContextManager[Any] = (
            threading.RLock() if is_memory_sqlite(self.engine.url) else nullcontext()
        )
        try:
            if migrate:
                upgrade_to_head(self.engine)
            self._ensure_orders()
        except BaseException:
            self.engine.dispose()
            raise

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[StoreTx]:
        bind = self._writer if write else self._reader
        try:
            with (
                self._serial,
                Session(bind, expire_on_commit=False, autoflush=False) as session,
                session.begin(),
            ):
                yield _SqlTx(session)
        except StoreError:
            raise
        except SQLAlchemyError as exc:
            mapped = database_error(exc)  # the one place database errors become store errors
            if mapped is None:
                raise
            raise mapped from exc

    def close(self) -> None:
        self.engine.dispose()
