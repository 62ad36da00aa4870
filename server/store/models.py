"""The SQL schema (SQLAlchemy 2 declarative). Alembic migrations create exactly this; a test
compares the migrated database with this metadata.

Invariants enforced by the database itself, so that no code path can bypass them:

- one ledger entry per (round attempt, client): ``uq_ledger_entries_round_id_agent_id``;
- one attempt number per (job, round number): ``uq_rounds_job_id_number_attempt``;
- secrets only as SHA-256 hex, each unique;
- foreign keys everywhere (SQLite enforces them through ``PRAGMA foreign_keys=ON``).

Curves are float64 little-endian blobs (one value per order of ``dpfl.accounting.ORDERS``; +inf
survives, which JSON would not); events and round details are JSON.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from dpfl.server.store.records import JsonObject

__all__ = [
    "AgentRow",
    "AuditRecordRow",
    "Base",
    "CredentialRowModel",
    "CurveSumRow",
    "EnrollmentTokenRowModel",
    "HistoryGroupRow",
    "JobMemberRow",
    "JobRow",
    "LedgerEntryRow",
    "MetaRow",
    "ModelVersionRow",
    "PrivacyAuditRow",
    "RoundRow",
    "UtcDateTime",
]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite keeps them naive, in UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UtcDateTime(),
        float: sa.Double(),
        JsonObject: sa.JSON(),
        dict[str, str]: sa.JSON(),
        dict[str, list[str]]: sa.JSON(),
        dict[str, float]: sa.JSON(),
        list[str]: sa.JSON(),
        bytes: sa.LargeBinary(),
    }


def _id() -> Mapped[str]:
    return mapped_column(sa.String(64), primary_key=True)


class AgentRow(Base):
    __tablename__ = "agents"

    id: Mapped[str] = _id()
    name: Mapped[str] = mapped_column(sa.String(200))
    labels: Mapped[dict[str, str]]
    status: Mapped[str] = mapped_column(sa.String(16))
    budget_epsilon: Mapped[float | None]
    budget_delta: Mapped[float | None]
    created_at: Mapped[datetime]
    #: the CN of the client certificate it enrolled with (mutual TLS); migration 0002
    certificate_cn: Mapped[str | None] = mapped_column(sa.String(200))

    __table_args__ = (
        sa.CheckConstraint(
            "(budget_epsilon IS NULL) = (budget_delta IS NULL)", name="budget_complete"
        ),
        #: one agent per certificate name (NULLs, agents without one, are never equal);
        #: migration 0003
        sa.Index("ix_agents_certificate_cn", "certificate_cn", unique=True),
    )


class AuditRecordRow(Base):
    """An administrator's action on an agent (migration 0003)."""

    __tablename__ = "audit_records"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(sa.String(200))
    action: Mapped[str] = mapped_column(sa.String(32))
    agent_id: Mapped[str | None] = mapped_column(sa.ForeignKey("agents.id"), index=True)
    detail: Mapped[str] = mapped_column(sa.Text)


class CredentialRowModel(Base):
    __tablename__ = "credentials"

    id: Mapped[str] = _id()
    agent_id: Mapped[str] = mapped_column(sa.ForeignKey("agents.id"), index=True)
    kind: Mapped[str] = mapped_column(sa.String(16))
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class EnrollmentTokenRowModel(Base):
    __tablename__ = "enrollment_tokens"

    id: Mapped[str] = _id()
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    budget_epsilon: Mapped[float | None]
    budget_delta: Mapped[float | None]
    labels: Mapped[dict[str, str]]
    used_at: Mapped[datetime | None]
    agent_id: Mapped[str | None] = mapped_column(sa.ForeignKey("agents.id"))


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = _id()
    name: Mapped[str] = mapped_column(sa.String(64))
    algorithm: Mapped[str] = mapped_column(sa.String(32))
    spec: Mapped[JsonObject]
    delta: Mapped[float]
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(sa.Text)


class JobMemberRow(Base):
    __tablename__ = "job_members"

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), primary_key=True)
    agent_id: Mapped[str] = mapped_column(sa.ForeignKey("agents.id"), primary_key=True, index=True)
    added_at: Mapped[datetime]


class RoundRow(Base):
    __tablename__ = "rounds"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"))
    number: Mapped[int]
    attempt: Mapped[int]
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    started_at: Mapped[datetime]
    committed_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    invited: Mapped[list[str]]
    accepted: Mapped[list[str]]
    survivors: Mapped[dict[str, list[str]]]
    dropped: Mapped[dict[str, list[str]]]
    stage_seconds: Mapped[dict[str, float]]
    #: The attempt's :class:`~dpfl.server.store.round_setup.RoundSetup` (column ``noise``).
    setup: Mapped[JsonObject] = mapped_column("noise", sa.JSON())
    accuracy: Mapped[float | None]
    epsilon: Mapped[float | None]
    model_version: Mapped[int | None]
    abort_reason: Mapped[str | None] = mapped_column(sa.Text)

    __table_args__ = (
        sa.UniqueConstraint("job_id", "number", "attempt"),
        sa.CheckConstraint("attempt >= 1", name="attempt_positive"),
    )


class ModelVersionRow(Base):
    __tablename__ = "model_versions"

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), primary_key=True)
    version: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    size: Mapped[int] = mapped_column(sa.BigInteger)
    data: Mapped[bytes]
    created_at: Mapped[datetime]
    round_id: Mapped[int | None] = mapped_column(sa.ForeignKey("rounds.id"))


class LedgerEntryRow(Base):
    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(sa.ForeignKey("agents.id"))
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), index=True)
    round_id: Mapped[int] = mapped_column(sa.ForeignKey("rounds.id"))
    round_number: Mapped[int]
    attempt: Mapped[int]
    algorithm: Mapped[str] = mapped_column(sa.String(32))
    unit: Mapped[str] = mapped_column(sa.String(16))
    event: Mapped[JsonObject]
    curve: Mapped[bytes]
    approximate: Mapped[bool]
    secure_aggregation: Mapped[bool]
    honest_fraction: Mapped[float]
    data_dependent_event: Mapped[JsonObject | None] = mapped_column(sa.JSON(none_as_null=True))
    data_dependent_curve: Mapped[bytes | None]
    created_at: Mapped[datetime]
    #: f₁: the fraction of the event's noise variance one agent's own share carries in the round
    #: (migration 0007; NULL for entries written before it: unknown)
    own_noise_fraction: Mapped[float | None]

    __table_args__ = (
        sa.UniqueConstraint("round_id", "agent_id"),
        sa.Index("ix_ledger_entries_agent_id_job_id", "agent_id", "job_id"),
        sa.CheckConstraint(
            "honest_fraction > 0 AND honest_fraction <= 1", name="honest_fraction_range"
        ),
        sa.CheckConstraint(
            "own_noise_fraction IS NULL OR (own_noise_fraction > 0 AND own_noise_fraction <= 1)",
            name="own_noise_fraction_range",
        ),
    )


class CurveSumRow(Base):
    __tablename__ = "curve_sums"

    agent_id: Mapped[str] = mapped_column(sa.ForeignKey("agents.id"), primary_key=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), primary_key=True, index=True)
    curve: Mapped[bytes]
    data_dependent_curve: Mapped[bytes]
    entries: Mapped[int]
    data_dependent_entries: Mapped[int]


class HistoryGroupRow(Base):
    """A client's events in one job grouped: how many entries charged this (relation class,
    guaranteed event) pair (migration 0006). The client's privacy figure is composed from these
    groups, never from the entries one by one."""

    __tablename__ = "history_groups"

    agent_id: Mapped[str] = mapped_column(sa.ForeignKey("agents.id"), primary_key=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), primary_key=True, index=True)
    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    relation: Mapped[str] = mapped_column(sa.String(64))
    event: Mapped[str] = mapped_column(sa.Text)
    entries: Mapped[int]


class PrivacyAuditRow(Base):
    """An empirical privacy audit of a job's run (migration 0004)."""

    __tablename__ = "privacy_audits"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), index=True)
    created_at: Mapped[datetime]
    mode: Mapped[str] = mapped_column(sa.String(16))
    unit: Mapped[str] = mapped_column(sa.String(16))
    relation: Mapped[str] = mapped_column(sa.String(16))
    canaries: Mapped[int]
    guesses: Mapped[int]
    correct: Mapped[int]
    confidence: Mapped[float]
    delta: Mapped[float]
    epsilon_lower: Mapped[float]
    epsilon_upper: Mapped[float]
    mu_lower: Mapped[float]
    epsilon_lower_gdp: Mapped[float]
    details: Mapped[JsonObject]

    __table_args__ = (
        sa.CheckConstraint(
            "correct >= 0 AND correct <= guesses AND guesses <= canaries", name="counts"
        ),
        sa.CheckConstraint("confidence > 0 AND confidence < 1", name="confidence_range"),
    )


class MetaRow(Base):
    __tablename__ = "store_meta"

    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.Text)
