"""The storage primitives a backend implements, inside one transaction.

:class:`~dpfl.server.store.base.Store` writes every rule (life cycles, idempotency, token checks,
the ledger) once, on top of these primitives; the backend (SQL) only stores and fetches. A
transaction either applies all its writes or none: the database transaction.

Primitives never enforce business rules except uniqueness: inserting a duplicate key raises
:class:`~dpfl.server.errors.AlreadyExists`. ``lock=True`` asks for a row lock held until the end of
the transaction (``SELECT ... FOR UPDATE`` where the database has it; SQLite serialises writers
anyway).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dpfl.server.store.ledger import (
    Curve,
    CurveSum,
    HistoryGroup,
    OwnShareGroup,
    PreparedCharge,
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
from dpfl.server.store.round_setup import RoundSetup

__all__ = ["CredentialRow", "EnrollmentTokenRow", "EntryKey", "NewRound", "StoreTx"]


@dataclass(frozen=True, slots=True)
class CredentialRow:
    id: str
    agent_id: str
    kind: CredentialKind
    token_hash: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class EnrollmentTokenRow:
    info: EnrollmentToken
    token_hash: str


@dataclass(frozen=True, slots=True)
class EntryKey:
    """Who a ledger entry charged, where, and whether it is approximate (no curves, no event)."""

    id: int
    agent_id: str
    job_id: str
    round_id: int
    approximate: bool


@dataclass(frozen=True, slots=True)
class NewRound:
    job_id: str
    number: int
    attempt: int
    started_at: datetime
    invited: tuple[str, ...]
    setup: RoundSetup


class StoreTx(abc.ABC):
    """One open transaction of a backend."""

    # agents and credentials ------------------------------------------------------------------
    @abc.abstractmethod
    def insert_agent(self, agent: Agent) -> None: ...

    @abc.abstractmethod
    def get_agent(self, agent_id: str, *, lock: bool = False) -> Agent | None: ...

    @abc.abstractmethod
    def get_agents(self, agent_ids: Sequence[str], *, lock: bool = False) -> dict[str, Agent]:
        """The agents that exist among ``agent_ids`` (locked in id order when ``lock``)."""

    @abc.abstractmethod
    def list_agents(self, *, except_status: AgentStatus | None = None) -> list[Agent]:
        """Every agent (but those of ``except_status``), oldest first (ties by id)."""

    @abc.abstractmethod
    def update_agent(self, agent: Agent) -> None: ...

    @abc.abstractmethod
    def insert_credential(self, row: CredentialRow) -> None: ...

    @abc.abstractmethod
    def credentials_of(self, agent_id: str, kind: CredentialKind) -> list[CredentialRow]:
        """The agent's credentials of ``kind`` that are not revoked."""

    @abc.abstractmethod
    def credential_by_hash(self, token_hash: str) -> CredentialRow | None: ...

    @abc.abstractmethod
    def revoke_credentials(
        self, agent_id: str, kind: CredentialKind | None, at: datetime
    ) -> int: ...

    @abc.abstractmethod
    def insert_enrollment_token(self, row: EnrollmentTokenRow) -> None: ...

    @abc.abstractmethod
    def enrollment_token_by_hash(
        self, token_hash: str, *, lock: bool = False
    ) -> EnrollmentTokenRow | None: ...

    @abc.abstractmethod
    def mark_enrollment_token_used(self, token_id: str, agent_id: str, at: datetime) -> bool:
        """Mark an unused token used; False when it was used meanwhile (nothing changed)."""

    @abc.abstractmethod
    def list_enrollment_tokens(self) -> list[EnrollmentToken]: ...

    # jobs -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_job(self, job: Job) -> None: ...

    @abc.abstractmethod
    def get_job(self, job_id: str, *, lock: bool = False) -> Job | None: ...

    @abc.abstractmethod
    def list_jobs(self, status: JobStatus | None) -> list[Job]:
        """Jobs, oldest first (ties by id)."""

    @abc.abstractmethod
    def update_job(self, job: Job) -> None: ...

    @abc.abstractmethod
    def add_members(self, job_id: str, agent_ids: Sequence[str], at: datetime) -> None:
        """Add the agents not yet members; existing members are left as they are."""

    @abc.abstractmethod
    def remove_members(self, job_id: str, agent_ids: Sequence[str]) -> None: ...

    @abc.abstractmethod
    def members(self, job_id: str) -> list[str]:
        """Member agent ids, sorted."""

    @abc.abstractmethod
    def jobs_of_agent(self, agent_id: str) -> list[str]:
        """Ids of the jobs the agent is a member of, sorted."""

    # rounds -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_round(self, new: NewRound) -> Round:
        """Insert a running round and return it with its id (AlreadyExists on a taken attempt)."""

    @abc.abstractmethod
    def get_round(self, round_id: int, *, lock: bool = False) -> Round | None: ...

    @abc.abstractmethod
    def rounds_of_job(self, job_id: str, number: int | None = None) -> list[Round]:
        """Rounds ordered by (number, attempt)."""

    @abc.abstractmethod
    def rounds_with_status(self, statuses: Sequence[RoundStatus]) -> list[Round]:
        """Rounds in any of ``statuses``, ordered by id."""

    @abc.abstractmethod
    def update_round(self, rnd: Round) -> None: ...

    # model versions ---------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_model(self, model: ModelVersion) -> None: ...

    @abc.abstractmethod
    def get_model(self, job_id: str, version: int, *, with_data: bool) -> ModelVersion | None: ...

    @abc.abstractmethod
    def list_models(self, job_id: str) -> list[ModelVersion]:
        """Versions without data, ascending."""

    @abc.abstractmethod
    def latest_model_version(self, job_id: str) -> int | None: ...

    # ledger -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_entries(
        self, rnd: Round, algorithm: str, charges: Sequence[PreparedCharge], at: datetime
    ) -> list[LedgerEntry]:
        """Insert one entry per charge (AlreadyExists on a second entry of a client and round)."""

    @abc.abstractmethod
    def entries(
        self,
        *,
        agent_id: str | None = None,
        job_id: str | None = None,
        round_id: int | None = None,
    ) -> list[LedgerEntry]:
        """Ledger entries matching every given filter, ordered by id."""

    @abc.abstractmethod
    def entry_keys(
        self,
        *,
        job_id: str | None = None,
        approximate: bool | None = None,
    ) -> list[EntryKey]:
        """The keys of the entries matching every given filter (``approximate``: only entries
        with that flag), ordered by id."""

    @abc.abstractmethod
    def charged_agents(self, round_id: int) -> set[str]:
        """The clients with a ledger entry for the round."""

    @abc.abstractmethod
    def curve_sums(
        self, agent_ids: Sequence[str] | None = None, job_id: str | None = None
    ) -> list[CurveSum]:
        """Cached running sums of the given agents (all when None), ordered by (agent, job)."""

    @abc.abstractmethod
    def put_curve_sums(self, sums: Sequence[CurveSum]) -> None:
        """Insert or replace running sums."""

    @abc.abstractmethod
    def replace_entry_curves(
        self, entry_id: int, curve: Curve, data_dependent_curve: Curve | None
    ) -> None:
        """Overwrite an entry's cached curves (only when the order grid changed)."""

    @abc.abstractmethod
    def delete_curve_sums(self) -> None: ...

    @abc.abstractmethod
    def history_groups(
        self, agent_ids: Sequence[str] | None = None, job_id: str | None = None
    ) -> list[HistoryGroup]:
        """The grouped histories of the given agents (all when None), ordered by (agent, job,
        key)."""

    @abc.abstractmethod
    def own_share_groups(self, agent_ids: Sequence[str] | None = None) -> list[OwnShareGroup]:
        """The given agents' entries (all when None) grouped by (agent, algorithm, unit, event,
        f₁), ordered by agent: what their own-share figures are composed from."""

    @abc.abstractmethod
    def add_history(self, groups: Sequence[HistoryGroup]) -> None:
        """Add each group's entries to the stored group of its (agent, job, key), created at 0
        when missing."""

    @abc.abstractmethod
    def delete_history_groups(self) -> None: ...

    # privacy audits ---------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_privacy_audit(
        self, job_id: str, figures: PrivacyAuditFigures, at: datetime
    ) -> PrivacyAudit:
        """Insert an audit of an existing job and return it with its id."""

    @abc.abstractmethod
    def privacy_audits_of_job(self, job_id: str) -> list[PrivacyAudit]:
        """The job's audits, oldest first (ids ascending)."""

    # metadata ---------------------------------------------------------------------------------
    # agents by certificate and the audit trail ------------------------------------------------
    @abc.abstractmethod
    def agent_by_certificate_cn(self, certificate_cn: str) -> Agent | None:
        """The agent bound to a certificate common name, whatever its status."""

    @abc.abstractmethod
    def insert_audit(
        self, *, at: datetime, actor: str, action: str, agent_id: str | None, detail: str
    ) -> AuditRecord: ...

    @abc.abstractmethod
    def list_audit(self, agent_id: str | None, limit: int) -> list[AuditRecord]:
        """The newest ``limit`` records (of one agent, or all), oldest first."""

    @abc.abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abc.abstractmethod
    def set_meta(self, key: str, value: str) -> None: ...
