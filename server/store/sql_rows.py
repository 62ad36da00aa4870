"""Conversions between the SQL rows of :mod:`dpfl.server.store.models` and the store's records.

Kept apart from the transaction code so that each direction of every table is visible in one
place: a field added to a record needs a line here, and the contract suite fails until it has one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from dpfl.server.store.ledger import CurveSum, PreparedCharge, decode_curve
from dpfl.server.store.models import (
    AgentRow,
    AuditRecordRow,
    CredentialRowModel,
    CurveSumRow,
    EnrollmentTokenRowModel,
    JobRow,
    LedgerEntryRow,
    ModelVersionRow,
    PrivacyAuditRow,
    RoundRow,
)
from dpfl.server.store.records import (
    Agent,
    AgentStatus,
    AuditRecord,
    Budget,
    CredentialKind,
    EnrollmentToken,
    Job,
    JobStatus,
    LedgerEntry,
    ModelVersion,
    PrivacyAudit,
    PrivacyAuditFigures,
    ProtectedUnit,
    Round,
    RoundStatus,
)
from dpfl.server.store.round_setup import RoundSetup
from dpfl.server.store.tx import CredentialRow

__all__ = [
    "agent_record",
    "audit_record",
    "budget_of",
    "credential_record",
    "curve_sum",
    "entry_from_charge",
    "entry_record",
    "job_record",
    "model_record",
    "round_record",
    "set_round_row",
    "token_record",
]


def budget_of(epsilon: float | None, delta: float | None) -> Budget | None:
    return None if epsilon is None or delta is None else Budget(epsilon, delta)


def agent_record(row: AgentRow | sa.Row[Any]) -> Agent:
    return Agent(
        id=row.id,
        name=row.name,
        labels=dict(row.labels),
        status=AgentStatus(row.status),
        budget=budget_of(row.budget_epsilon, row.budget_delta),
        created_at=row.created_at,
        certificate_cn=row.certificate_cn,
    )


def audit_record(row: AuditRecordRow) -> AuditRecord:
    return AuditRecord(
        id=row.id,
        at=row.at,
        actor=row.actor,
        action=row.action,
        agent_id=row.agent_id,
        detail=row.detail,
    )


def token_record(row: EnrollmentTokenRowModel) -> EnrollmentToken:
    return EnrollmentToken(
        id=row.id,
        created_at=row.created_at,
        expires_at=row.expires_at,
        budget=budget_of(row.budget_epsilon, row.budget_delta),
        labels=dict(row.labels),
        used_at=row.used_at,
        agent_id=row.agent_id,
    )


def credential_record(row: CredentialRowModel) -> CredentialRow:
    return CredentialRow(
        row.id,
        row.agent_id,
        CredentialKind(row.kind),
        row.token_hash,
        row.created_at,
        row.revoked_at,
    )


def job_record(row: JobRow) -> Job:
    return Job(
        id=row.id,
        name=row.name,
        algorithm=row.algorithm,
        spec=dict(row.spec),
        delta=row.delta,
        status=JobStatus(row.status),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
    )


def round_record(row: RoundRow) -> Round:
    return Round(
        id=row.id,
        job_id=row.job_id,
        number=row.number,
        attempt=row.attempt,
        status=RoundStatus(row.status),
        started_at=row.started_at,
        committed_at=row.committed_at,
        finished_at=row.finished_at,
        invited=tuple(row.invited),
        accepted=tuple(row.accepted),
        survivors={k: tuple(v) for k, v in row.survivors.items()},
        dropped={k: tuple(v) for k, v in row.dropped.items()},
        stage_seconds={k: float(v) for k, v in row.stage_seconds.items()},
        setup=RoundSetup.from_stored(
            row.setup,
            where=f"round {row.id} (job {row.job_id!r}, round {row.number}, attempt {row.attempt})",
        ),
        accuracy=row.accuracy,
        epsilon=row.epsilon,
        model_version=row.model_version,
        abort_reason=row.abort_reason,
    )


def set_round_row(row: RoundRow, rnd: Round) -> None:
    row.status = rnd.status.value
    row.committed_at = rnd.committed_at
    row.finished_at = rnd.finished_at
    row.invited = list(rnd.invited)
    row.accepted = list(rnd.accepted)
    row.survivors = {k: list(v) for k, v in rnd.survivors.items()}
    row.dropped = {k: list(v) for k, v in rnd.dropped.items()}
    row.stage_seconds = dict(rnd.stage_seconds)
    row.setup = rnd.setup.to_json()
    row.accuracy = rnd.accuracy
    row.epsilon = rnd.epsilon
    row.model_version = rnd.model_version
    row.abort_reason = rnd.abort_reason


def _curve_tuple(blob: bytes | None) -> tuple[float, ...] | None:
    return None if blob is None else tuple(decode_curve(blob).tolist())


def entry_record(row: LedgerEntryRow | sa.Row[Any]) -> LedgerEntry:
    curve = tuple(decode_curve(row.curve).tolist())
    return LedgerEntry(
        id=row.id,
        agent_id=row.agent_id,
        job_id=row.job_id,
        round_id=row.round_id,
        round_number=row.round_number,
        attempt=row.attempt,
        algorithm=row.algorithm,
        unit=ProtectedUnit(row.unit),
        event=dict(row.event),
        curve=curve,
        approximate=row.approximate,
        secure_aggregation=row.secure_aggregation,
        honest_fraction=row.honest_fraction,
        data_dependent_event=None
        if row.data_dependent_event is None
        else dict(row.data_dependent_event),
        data_dependent_curve=_curve_tuple(row.data_dependent_curve),
        created_at=row.created_at,
        own_noise_fraction=row.own_noise_fraction,
    )


def entry_from_charge(
    entry_id: int, rnd: Round, algorithm: str, charge: PreparedCharge, at: datetime
) -> LedgerEntry:
    """The entry just inserted for ``charge`` (what :func:`entry_record` reads back)."""
    dd_curve = charge.data_dependent_curve
    return LedgerEntry(
        id=entry_id,
        agent_id=charge.agent_id,
        job_id=rnd.job_id,
        round_id=rnd.id,
        round_number=rnd.number,
        attempt=rnd.attempt,
        algorithm=algorithm,
        unit=charge.unit,
        event=dict(charge.event),
        curve=tuple(charge.curve.tolist()),
        approximate=charge.approximate,
        secure_aggregation=charge.secure_aggregation,
        honest_fraction=charge.honest_fraction,
        data_dependent_event=None
        if charge.data_dependent_event is None
        else dict(charge.data_dependent_event),
        data_dependent_curve=None if dd_curve is None else tuple(dd_curve.tolist()),
        created_at=at,
        own_noise_fraction=charge.own_noise_fraction,
    )


def curve_sum(row: CurveSumRow | sa.Row[Any]) -> CurveSum:
    return CurveSum(
        row.agent_id,
        row.job_id,
        decode_curve(row.curve),
        decode_curve(row.data_dependent_curve),
        row.entries,
        row.data_dependent_entries,
    )


def model_record(row: ModelVersionRow, *, with_data: bool) -> ModelVersion:
    return ModelVersion(
        job_id=row.job_id,
        version=row.version,
        sha256=row.sha256,
        size=row.size,
        created_at=row.created_at,
        round_id=row.round_id,
        data=bytes(row.data) if with_data else None,
    )


def privacy_audit_record(row: PrivacyAuditRow) -> PrivacyAudit:
    return PrivacyAudit(
        id=row.id,
        job_id=row.job_id,
        created_at=row.created_at,
        figures=PrivacyAuditFigures(
            mode=row.mode,
            unit=row.unit,
            relation=row.relation,
            canaries=row.canaries,
            guesses=row.guesses,
            correct=row.correct,
            confidence=row.confidence,
            delta=row.delta,
            epsilon_lower=row.epsilon_lower,
            epsilon_upper=row.epsilon_upper,
            mu_lower=row.mu_lower,
            epsilon_lower_gdp=row.epsilon_lower_gdp,
            details=dict(row.details),
        ),
    )
