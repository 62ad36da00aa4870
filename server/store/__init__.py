"""The coordinator's store: agents, secrets, jobs, rounds, model versions and the privacy ledger.

One abstract :class:`Store`, implemented by :class:`~dpfl.server.store.sql.SqlStore` (SQLAlchemy 2 +
Alembic; SQLite by default, ``sqlite://`` in memory, PostgreSQL in production) and opened by
:func:`open_store` from a URL. The rules live in the abstract class, once; see
:mod:`dpfl.server.store.rounds` for the ledger commit and its restart semantics, and
:mod:`dpfl.server.store.reports` for how ε is computed.
"""

from dpfl.server.store.base import Store
from dpfl.server.store.factory import DEFAULT_URL, open_store
from dpfl.server.store.records import (
    Agent,
    AgentStatus,
    AuditRecord,
    Budget,
    BudgetCheck,
    Charge,
    ClientBudget,
    CommitResult,
    CredentialKind,
    Enrollment,
    EnrollmentToken,
    EventReport,
    IssuedToken,
    Job,
    JobEpsilon,
    JobStatus,
    LedgerEntry,
    Mismatch,
    ModelVersion,
    PrivacyAudit,
    PrivacyAuditFigures,
    ProtectedUnit,
    Round,
    RoundStatus,
    VerifyReport,
    to_json,
)
from dpfl.server.store.round_setup import ROUND_SETUP_VERSION, RoundSetup
from dpfl.server.store.rounds import CHARGED_STAGES, STAGES

__all__ = [
    "CHARGED_STAGES",
    "DEFAULT_URL",
    "ROUND_SETUP_VERSION",
    "STAGES",
    "Agent",
    "AgentStatus",
    "AuditRecord",
    "Budget",
    "BudgetCheck",
    "Charge",
    "ClientBudget",
    "CommitResult",
    "CredentialKind",
    "Enrollment",
    "EnrollmentToken",
    "EventReport",
    "IssuedToken",
    "Job",
    "JobEpsilon",
    "JobStatus",
    "LedgerEntry",
    "Mismatch",
    "ModelVersion",
    "PrivacyAudit",
    "PrivacyAuditFigures",
    "ProtectedUnit",
    "Round",
    "RoundSetup",
    "RoundStatus",
    "Store",
    "VerifyReport",
    "open_store",
    "to_json",
]
