"""Agents, their secrets, enrollment, jobs, job membership and model versions.

Invariants: secrets are returned once and stored only as SHA-256 hashes, compared in constant
time; an enrollment token is redeemed at most once, before it expires, in the same transaction
that creates the agent and its credentials; a disabled or revoked agent cannot authenticate but
keeps its ledger; a revoked agent stays revoked; a client certificate's common name is bound to
at most one agent, ever (a silo holds one agent id and so one budget); every administrator's
action on an agent writes an :class:`AuditRecord` in the same transaction; job status changes
follow :data:`JOB_TRANSITIONS`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from dpfl.learning.jobs import JobSpec, job_to_dict
from dpfl.server.errors import (
    AlreadyExists,
    InvalidCredential,
    InvalidInput,
    InvalidTransition,
    NotFound,
)
from dpfl.server.store import tokens
from dpfl.server.store.core import (
    StoreCore,
    check_count,
    check_id,
    check_ids,
    check_labels,
    check_name,
    check_reason,
    storable_text,
)
from dpfl.server.store.records import (
    Agent,
    AgentStatus,
    AuditRecord,
    Budget,
    CredentialKind,
    Enrollment,
    EnrollmentToken,
    IssuedToken,
    Job,
    JobStatus,
    ModelVersion,
)
from dpfl.server.store.tx import CredentialRow, EnrollmentTokenRow, StoreTx

__all__ = ["JOB_TRANSITIONS", "DirectoryMixin"]

#: Allowed job status changes (a change to the current status is a no-op).
JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.RUNNING, JobStatus.STOPPED, JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset({JobStatus.STOPPED, JobStatus.COMPLETED, JobStatus.FAILED}),
    JobStatus.STOPPED: frozenset({JobStatus.RUNNING, JobStatus.FAILED}),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
}
_FINISHED = (JobStatus.STOPPED, JobStatus.COMPLETED, JobStatus.FAILED)
_PREFIX = {CredentialKind.AGENT: tokens.CREDENTIAL_PREFIX, CredentialKind.API: tokens.API_PREFIX}
_INVALID = "unknown agent or invalid credential"
#: The size of the jobs' name column.
_MAX_JOB_NAME = 64


def _certificate_taken(certificate_cn: str, bound: Agent) -> AlreadyExists:
    return AlreadyExists(
        f"the client certificate {certificate_cn!r} is already bound to agent {bound.id!r} "
        f"({bound.status.value}): one certificate, one agent. That agent keeps using its own "
        "credential; a silo that must enrol anew needs a certificate with another common name, "
        "signed by the federation's administrator"
    )


def _budget(budget: Budget | None) -> Budget | None:
    if budget is not None and not isinstance(budget, Budget):
        raise InvalidInput(f"budget must be a Budget or None, got {type(budget).__name__}")
    return budget


class DirectoryMixin(StoreCore):
    # agents ------------------------------------------------------------------------------------
    def create_agent(
        self,
        *,
        name: str,
        labels: Mapping[str, str] | None = None,
        budget: Budget | None = None,
        agent_id: str | None = None,
    ) -> Agent:
        """Register an agent directly (simulation, tests); deployments enrol with a token.

        Raises:
            InvalidInput: a bad name, id or label.
            AlreadyExists: ``agent_id`` is taken.
        """
        agent = Agent(
            id=check_id(agent_id, "agent id") if agent_id is not None else tokens.new_id("agent"),
            name=check_name(name),
            labels=check_labels(labels),
            status=AgentStatus.ACTIVE,
            budget=_budget(budget),
            created_at=self._now(),
        )
        with self._transaction(write=True) as tx:
            tx.insert_agent(agent)
        return agent

    def get_agent(self, agent_id: str) -> Agent:
        """Raises: NotFound."""
        with self._transaction(write=False) as tx:
            return self._agent_of(tx, agent_id)

    def list_agents(
        self, *, status: AgentStatus | None = None, except_status: AgentStatus | None = None
    ) -> list[Agent]:
        """Every agent (optionally of one status, or but one status), oldest first."""
        with self._transaction(write=False) as tx:
            agents = tx.list_agents(except_status=except_status)
        return [a for a in agents if status is None or a.status == status]

    def set_agent_budget(self, agent_id: str, budget: Budget | None) -> Agent:
        """Replace an agent's budget (None: no limit). Raises: NotFound."""
        budget = _budget(budget)
        with self._transaction(write=True) as tx:
            agent = replace(self._agent_of(tx, agent_id, lock=True), budget=budget)
            tx.update_agent(agent)
        return agent

    def set_agent_status(
        self, agent_id: str, status: AgentStatus, *, actor: str = "system", reason: str = ""
    ) -> Agent:
        """Enable, disable or revoke an agent, with an audit record of who did it and why.

        Disabled: refused at authentication until enabled again. Revoked: refused for good, its
        secrets revoked in the same transaction, its certificate name kept bound to it. The
        running coordinator closes the agent's stream and drops it from its rounds
        (``dpfl.server.agents_control``).

        Raises:
            NotFound: no such agent.
            InvalidTransition: the agent is revoked (a revocation is final).
            InvalidInput: an empty actor; a reason over 1000 characters; a control or
                format character in either (``dpfl.server.store.core.text_problem``; a reason
                may hold tabs and line feeds).
        """
        status = AgentStatus(status)
        actor = check_name(actor, "actor")
        reason = check_reason(reason)
        with self._transaction(write=True) as tx:
            before = self._agent_of(tx, agent_id, lock=True)
            if before.status == AgentStatus.REVOKED and status != AgentStatus.REVOKED:
                raise InvalidTransition(
                    f"agent {agent_id!r} is revoked, which is final: enrol the silo again "
                    "with a new certificate name instead"
                )
            agent = replace(before, status=status)
            tx.update_agent(agent)
            now = self._now()
            revoked = 0
            if status == AgentStatus.REVOKED:
                revoked = tx.revoke_credentials(agent_id, None, now)
            action = {
                AgentStatus.ACTIVE: "agent.enable",
                AgentStatus.DISABLED: "agent.disable",
                AgentStatus.REVOKED: "agent.revoke",
            }[status]
            detail = f"{before.status.value} -> {status.value}"
            if revoked:
                detail += f"; {revoked} secrets revoked"
            if reason:
                detail += f"; reason: {reason}"
            tx.insert_audit(at=now, actor=actor, action=action, agent_id=agent_id, detail=detail)
        return agent

    def audit_records(self, *, agent_id: str | None = None, limit: int = 200) -> list[AuditRecord]:
        """The newest ``limit`` audit records (of one agent, or all), oldest first."""
        limit = check_count(limit, "limit", minimum=1)
        with self._transaction(write=False) as tx:
            if agent_id is not None:
                self._agent_of(tx, agent_id)
            return tx.list_audit(agent_id, limit)

    # credentials -------------------------------------------------------------------------------
    def issue_credential(
        self, agent_id: str, *, kind: CredentialKind = CredentialKind.AGENT, rotate: bool = False
    ) -> str:
        """A new secret for the agent (returned once; only its hash is stored).

        Args:
            agent_id: the agent.
            kind: ``AGENT`` for the gRPC bearer credential, ``API`` for the read-only REST token.
            rotate: revoke the agent's other secrets of this kind in the same transaction.

        Raises:
            NotFound: no such agent.
        """
        kind = CredentialKind(kind)
        with self._transaction(write=True) as tx:
            self._agent_of(tx, agent_id, lock=True)
            now = self._now()
            if rotate:
                tx.revoke_credentials(agent_id, kind, now)
            return self._new_credential(tx, agent_id, kind, now)

    @staticmethod
    def _new_credential(tx: StoreTx, agent_id: str, kind: CredentialKind, now: datetime) -> str:
        secret = tokens.new_token(_PREFIX[kind])
        tx.insert_credential(
            CredentialRow(
                tokens.new_id("cred"), agent_id, kind, tokens.hash_token(secret), now, None
            )
        )
        return secret

    def authenticate_agent(self, agent_id: str, credential: str) -> Agent:
        """The agent whose id and credential match (the gRPC interceptor's check).

        Raises:
            InvalidCredential: unknown agent, wrong, revoked or foreign credential, or a disabled
                agent — one message for all, so that a caller learns nothing about which.
        """
        return self.authenticate_member(agent_id, credential)[0]

    def authenticate_member(self, agent_id: str, credential: str) -> tuple[Agent, frozenset[str]]:
        """:meth:`authenticate_agent` and the ids of the agent's jobs, in one read transaction
        (every download needs both, and every member downloads every round).

        Raises:
            InvalidCredential: as :meth:`authenticate_agent`.
        """
        if not isinstance(agent_id, str) or not isinstance(credential, str):
            raise InvalidCredential(_INVALID)
        with self._transaction(write=False) as tx:
            agent = tx.get_agent(agent_id)
            rows = tx.credentials_of(agent_id, CredentialKind.AGENT) if agent else []
            jobs = frozenset(tx.jobs_of_agent(agent_id)) if agent else frozenset()
        # compare against every candidate (and a dummy when there is none): no early exit
        hashes = [r.token_hash for r in rows] or [hashlib.sha256(b"").hexdigest()]
        ok = False
        for h in hashes:
            ok |= tokens.matches(credential, h)
        if not ok or agent is None or agent.status != AgentStatus.ACTIVE:
            raise InvalidCredential(_INVALID)
        return agent, jobs

    def authenticate_api_token(self, token: str) -> Agent:
        """The agent owning a read-only REST token.

        Raises:
            InvalidCredential: unknown, revoked or malformed token, or a disabled agent.
        """
        if not isinstance(token, str) or not token.startswith(tokens.API_PREFIX):
            raise InvalidCredential("invalid API token")
        with self._transaction(write=False) as tx:
            row = tx.credential_by_hash(tokens.hash_token(token))
            agent = tx.get_agent(row.agent_id) if row is not None else None
        if (
            row is None
            or row.kind != CredentialKind.API
            or row.revoked_at is not None
            or not tokens.matches(token, row.token_hash)
            or agent is None
            or agent.status != AgentStatus.ACTIVE
        ):
            raise InvalidCredential("invalid API token")
        return agent

    def revoke_credentials(self, agent_id: str, *, kind: CredentialKind | None = None) -> int:
        """Revoke the agent's secrets (of one kind, or all); returns how many. Raises: NotFound."""
        with self._transaction(write=True) as tx:
            self._agent_of(tx, agent_id, lock=True)
            return tx.revoke_credentials(
                agent_id, None if kind is None else CredentialKind(kind), self._now()
            )

    # enrollment --------------------------------------------------------------------------------
    def create_enrollment_token(
        self,
        *,
        ttl: timedelta,
        budget: Budget | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> IssuedToken:
        """A one-time token that enrols one agent before ``now + ttl``.

        Args:
            ttl: validity, > 0.
            budget: the enrolled agent's budget (None: the default given at redemption).
            labels: labels the enrolled agent gets (its own labels are merged over them).
        """
        if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
            raise InvalidInput(f"ttl must be a positive timedelta, got {ttl!r}")
        secret = tokens.new_token(tokens.ENROLLMENT_PREFIX)
        now = self._now()
        info = EnrollmentToken(
            id=tokens.new_id("enroll"),
            created_at=now,
            expires_at=now + ttl,
            budget=_budget(budget),
            labels=check_labels(labels, "token label"),
            used_at=None,
            agent_id=None,
        )
        with self._transaction(write=True) as tx:
            tx.insert_enrollment_token(EnrollmentTokenRow(info, tokens.hash_token(secret)))
        return IssuedToken(secret, info)

    def list_enrollment_tokens(self) -> list[EnrollmentToken]:
        with self._transaction(write=False) as tx:
            return tx.list_enrollment_tokens()

    def redeem_enrollment_token(
        self,
        token: str,
        *,
        name: str,
        labels: Mapping[str, str] | None = None,
        default_budget: Budget | None = None,
        certificate_cn: str | None = None,
    ) -> Enrollment:
        """Exchange a one-time token for a new agent, its credential and its REST token.

        All of it happens in one transaction: a token is never used twice, and a failure leaves
        neither an agent nor a used token behind.

        Args:
            token: the one-time enrollment token.
            name: the agent's display name.
            labels: its own labels (merged over the token's).
            default_budget: its budget when the token carries none.
            certificate_cn: the common name of the client certificate the enrolment came with
                (mutual TLS), bound to the agent for good; None without one.

        Raises:
            InvalidCredential: unknown, expired or already used token.
            AlreadyExists: the certificate name is already bound to an agent (the token stays
                unused).
            InvalidInput: a bad name, label or certificate name.
        """
        name = check_name(name)
        own_labels = check_labels(labels)
        _budget(default_budget)
        if certificate_cn is not None:
            certificate_cn = check_name(certificate_cn, "certificate common name")
        if not isinstance(token, str) or not token.startswith(tokens.ENROLLMENT_PREFIX):
            raise InvalidCredential("unknown enrollment token")
        lost: AlreadyExists | None = None  # the database's unique index refused the agent
        try:
            with self._transaction(write=True) as tx:
                row = tx.enrollment_token_by_hash(tokens.hash_token(token), lock=True)
                if row is None or not tokens.matches(token, row.token_hash):
                    raise InvalidCredential("unknown enrollment token")
                now = self._now()
                if row.info.used_at is not None:
                    raise InvalidCredential("enrollment token already used")
                if now >= row.info.expires_at:
                    raise InvalidCredential("enrollment token expired")
                if certificate_cn is not None:
                    bound = tx.agent_by_certificate_cn(certificate_cn)
                    if bound is not None:
                        raise _certificate_taken(certificate_cn, bound)
                agent = Agent(
                    id=tokens.new_id("agent"),
                    name=name,
                    labels={**row.info.labels, **own_labels},
                    status=AgentStatus.ACTIVE,
                    budget=row.info.budget if row.info.budget is not None else default_budget,
                    created_at=now,
                    certificate_cn=certificate_cn,
                )
                try:
                    tx.insert_agent(agent)
                except AlreadyExists as exc:
                    lost = exc
                    raise
                if not tx.mark_enrollment_token_used(row.info.id, agent.id, now):
                    raise InvalidCredential("enrollment token already used")
                credential = self._new_credential(tx, agent.id, CredentialKind.AGENT, now)
                api_token = self._new_credential(tx, agent.id, CredentialKind.API, now)
        except AlreadyExists as exc:
            if exc is not lost or certificate_cn is None:
                raise
            # a concurrent enrolment with the same certificate name committed between the check
            # above and the insert (PostgreSQL; SQLite serialises writers): the index refused
            # this agent, whose id was never created. Name the agent that exists.
            with self._transaction(write=False) as tx:
                bound = tx.agent_by_certificate_cn(certificate_cn)
            if bound is None:
                raise
            raise _certificate_taken(certificate_cn, bound) from None
        return Enrollment(agent, credential, api_token)

    # jobs --------------------------------------------------------------------------------------
    def create_job(
        self,
        spec: JobSpec,
        *,
        job_id: str | None = None,
        members: Iterable[str] = (),
        running: bool = False,
    ) -> Job:
        """Store a validated job as pending (or running, started in the same transaction), with
        its population (job membership).

        Raises:
            NotFound: a member agent does not exist.
            AlreadyExists: ``job_id`` is taken.
        """
        member_ids = check_ids(members, "members")
        now = self._now()
        job = Job(
            id=check_id(job_id, "job id") if job_id is not None else tokens.new_id("job"),
            name=check_name(spec.name, "job name", max_chars=_MAX_JOB_NAME),
            algorithm=spec.algorithm,
            spec=job_to_dict(spec),
            delta=spec.privacy.delta,
            status=JobStatus.RUNNING if running else JobStatus.PENDING,
            created_at=now,
            started_at=now if running else None,
            finished_at=None,
            error=None,
        )
        with self._transaction(write=True) as tx:
            self._existing_agents(tx, member_ids)
            tx.insert_job(job)
            tx.add_members(job.id, member_ids, job.created_at)
        return job

    def get_job(self, job_id: str) -> Job:
        """Raises: NotFound."""
        with self._transaction(write=False) as tx:
            return self._job_of(tx, job_id)

    def list_jobs(self, *, status: JobStatus | None = None) -> list[Job]:
        with self._transaction(write=False) as tx:
            return tx.list_jobs(None if status is None else JobStatus(status))

    def set_job_status(self, job_id: str, status: JobStatus, *, error: str | None = None) -> Job:
        """Move a job through its life cycle (:data:`JOB_TRANSITIONS`).

        ``started_at`` is set when it first runs; ``finished_at`` when it stops, completes or fails
        (and cleared when a stopped job resumes). ``error`` records why a job failed.

        Raises:
            NotFound, InvalidTransition.
        """
        status = JobStatus(status)
        with self._transaction(write=True) as tx:
            job = self._job_of(tx, job_id, lock=True)
            if job.status == status:
                return job
            if status not in JOB_TRANSITIONS[job.status]:
                raise InvalidTransition(
                    f"job {job_id!r} cannot go from {job.status.value} to {status.value}"
                )
            now = self._now()
            job = replace(
                job,
                status=status,
                started_at=job.started_at or (now if status == JobStatus.RUNNING else None),
                finished_at=now if status in _FINISHED else None,
                error=storable_text(error) if error is not None else job.error,
            )
            tx.update_job(job)
        return job

    def start_job(self, job_id: str, *, members: Iterable[str] = ()) -> Job:
        """Mark a pending or stopped job running, adding ``members`` when it has none, in one
        transaction; a refused start's reason is cleared. Raises: NotFound, InvalidTransition."""
        ids = check_ids(members, "members")
        with self._transaction(write=True) as tx:
            job = self._job_of(tx, job_id, lock=True)
            if job.status != JobStatus.RUNNING:
                if JobStatus.RUNNING not in JOB_TRANSITIONS[job.status]:
                    raise InvalidTransition(
                        f"job {job_id!r} cannot go from {job.status.value} to running"
                    )
                if ids and not tx.members(job_id):
                    self._existing_agents(tx, ids)
                    tx.add_members(job_id, ids, self._now())
                started = job.started_at or self._now()
                job = replace(
                    job, status=JobStatus.RUNNING, started_at=started, finished_at=None, error=None
                )
                tx.update_job(job)
        return job

    def refuse_job_start(self, job_id: str, reason: str) -> Job:
        """Record why a job's start was refused (its ``error``); nothing else. Raises: NotFound."""
        with self._transaction(write=True) as tx:
            job = replace(self._job_of(tx, job_id, lock=True), error=storable_text(reason))
            tx.update_job(job)
        return job

    def add_job_members(self, job_id: str, agent_ids: Iterable[str]) -> list[str]:
        """Add agents to a job's population; returns the members. Raises: NotFound."""
        ids = check_ids(agent_ids, "agent ids")
        with self._transaction(write=True) as tx:
            self._job_of(tx, job_id, lock=True)
            self._existing_agents(tx, ids)
            tx.add_members(job_id, ids, self._now())
            return tx.members(job_id)

    def remove_job_members(self, job_id: str, agent_ids: Iterable[str]) -> list[str]:
        """Remove agents from a job's population (their ledger stays); returns the members."""
        ids = check_ids(agent_ids, "agent ids")
        with self._transaction(write=True) as tx:
            self._job_of(tx, job_id, lock=True)
            tx.remove_members(job_id, ids)
            return tx.members(job_id)

    def job_members(self, job_id: str) -> list[str]:
        """The job's population, sorted. Raises: NotFound."""
        with self._transaction(write=False) as tx:
            self._job_of(tx, job_id)
            return tx.members(job_id)

    def agent_jobs(self, agent_id: str) -> list[str]:
        """Ids of the jobs an agent belongs to. Raises: NotFound."""
        with self._transaction(write=False) as tx:
            self._agent_of(tx, agent_id)
            return tx.jobs_of_agent(agent_id)

    # model versions ----------------------------------------------------------------------------
    def add_model_version(
        self, job_id: str, data: bytes, *, round_id: int | None = None
    ) -> ModelVersion:
        """Store the next model version of a job (0 for the first: the initial model).

        Raises:
            NotFound: no such job (or round).
        """
        with self._transaction(write=True) as tx:
            self._job_of(tx, job_id, lock=True)
            if round_id is not None:
                self._round_of(tx, round_id)
            return self._insert_model(tx, job_id, data, round_id)

    def get_model_version(self, job_id: str, version: int | None = None) -> ModelVersion:
        """A model version with its bytes (the latest when ``version`` is None).

        Raises:
            NotFound: no such job or version.
            InvalidInput: a version that is not an integer in [0, 2**31 - 1].
        """
        if version is not None:
            version = check_count(version, "version")
        with self._transaction(write=False) as tx:
            self._job_of(tx, job_id)
            if version is None:
                version = tx.latest_model_version(job_id)
                if version is None:
                    raise NotFound(f"job {job_id!r} has no model version yet")
            model = tx.get_model(job_id, version, with_data=True)
        if model is None:
            raise NotFound(f"job {job_id!r} has no model version {version}")
        return model

    def list_model_versions(self, job_id: str) -> list[ModelVersion]:
        """Versions of a job without their bytes, ascending. Raises: NotFound."""
        with self._transaction(write=False) as tx:
            self._job_of(tx, job_id)
            return tx.list_models(job_id)
