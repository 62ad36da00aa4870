"""The values the store hands out: frozen records, status enums and ledger reports.

Records are plain frozen dataclasses, independent of the database: SQLite and PostgreSQL return
equal records for equal histories (the contract suite checks it). Every timestamp is timezone-aware
UTC. Mappings and lists inside a record are fresh copies owned by the caller; mutating them never
changes the store.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime
from typing import Any, TypeAlias

from pydantic import JsonValue

from dpfl.accounting import DpEvent
from dpfl.server.errors import InvalidInput
from dpfl.server.store.round_setup import RoundSetup

#: A JSON object shaped by its producer (a job document, an event, an audit's report).
JsonObject: TypeAlias = dict[str, JsonValue]

__all__ = [
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
    "JsonObject",
    "LedgerEntry",
    "Mismatch",
    "ModelVersion",
    "PrivacyAudit",
    "PrivacyAuditFigures",
    "ProtectedUnit",
    "Round",
    "RoundStatus",
    "VerifyReport",
    "to_json",
]


class AgentStatus(enum.StrEnum):
    ACTIVE = "active"
    #: refused at authentication; its ledger stays; an admin may enable it again
    DISABLED = "disabled"
    #: refused for good: its secrets are revoked, its certificate name stays bound to it (no
    #: re-enrolment under the same name); its ledger stays
    REVOKED = "revoked"


class CredentialKind(enum.StrEnum):
    #: the bearer credential of the gRPC stream
    AGENT = "agent"
    #: the read-only REST token of the client's own budget
    API = "api"


class JobStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


class RoundStatus(enum.StrEnum):
    #: invitations and secure-aggregation stages before the ledger commit
    RUNNING = "running"
    #: privacy charged; unmasking may happen (the aggregate is computable from here on)
    COMMITTED = "committed"
    #: the aggregate was decoded and applied
    COMPLETED = "completed"
    #: given up; charged if and only if it was committed first
    ABORTED = "aborted"


class ProtectedUnit(enum.StrEnum):
    RECORD = "record"
    AGENT = "agent"


@dataclass(frozen=True, slots=True)
class Budget:
    """A client's privacy budget: ε spent, measured at ``delta``, must stay ≤ ``epsilon``."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon)):
            raise InvalidInput(f"budget epsilon must be a finite number, got {self.epsilon!r}")
        if self.epsilon <= 0:
            raise InvalidInput(f"budget epsilon must be > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0 < self.delta < 1):
            raise InvalidInput(f"budget delta must be in (0, 1), got {self.delta!r}")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "delta", float(self.delta))


@dataclass(frozen=True, slots=True)
class Agent:
    """A client (silo) known to the coordinator; ``budget`` None means no limit is enforced.

    ``certificate_cn`` is the common name of the client certificate the agent enrolled with under
    mutual TLS (None: enrolled without one). Once set it never changes, and under mutual TLS every
    later RPC of the agent must present a certificate with that name
    (:func:`dpfl.server.agent_protocol.authenticate`).
    """

    id: str
    name: str
    labels: dict[str, str]
    status: AgentStatus
    budget: Budget | None
    created_at: datetime
    certificate_cn: str | None = None


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """Who did what to which agent, and when (an administrator's action, kept for good).

    ``actor`` names the administrator as the caller identified itself (the REST admin token's
    caller, or the operating-system user of the CLI); ``action`` is e.g. ``agent.disable``.
    """

    id: int
    at: datetime
    actor: str
    action: str
    agent_id: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class EnrollmentToken:
    """A one-time enrollment token as stored (never the secret itself)."""

    id: str
    created_at: datetime
    expires_at: datetime
    budget: Budget | None
    labels: dict[str, str]
    used_at: datetime | None
    agent_id: str | None


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A freshly created enrollment token: ``token`` is shown once and never stored."""

    token: str = field(repr=False)
    info: EnrollmentToken


@dataclass(frozen=True, slots=True)
class Enrollment:
    """The result of redeeming an enrollment token; both secrets are shown once."""

    agent: Agent
    credential: str = field(repr=False)
    api_token: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Job:
    """A submitted job; ``spec`` is the validated document with every default filled in."""

    id: str
    name: str
    algorithm: str
    spec: JsonObject
    delta: float
    status: JobStatus
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Round:
    """One attempt at one round of a job.

    A round number is redone as a new ``attempt`` after a coordinator restart; ``survivors`` and
    ``dropped`` map a stage name to client ids, ``stage_seconds`` a stage name to its duration.
    ``epsilon`` is the largest per-job ε (at the job's δ) among the clients charged by this round,
    after the charge.
    """

    id: int
    job_id: str
    number: int
    attempt: int
    status: RoundStatus
    started_at: datetime
    committed_at: datetime | None
    finished_at: datetime | None
    invited: tuple[str, ...]
    accepted: tuple[str, ...]
    survivors: dict[str, tuple[str, ...]]
    dropped: dict[str, tuple[str, ...]]
    stage_seconds: dict[str, float]
    setup: RoundSetup
    accuracy: float | None
    epsilon: float | None
    model_version: int | None
    abort_reason: str | None


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """A model version of a job; ``data`` is None in listings."""

    job_id: str
    version: int
    sha256: str
    size: int
    created_at: datetime
    round_id: int | None
    data: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Charge:
    """One client's privacy cost for one round, as the coordinator hands it to the ledger.

    ``event`` may contain data-dependent parts (PATE/kNN margins): the ledger then stores its
    guaranteed counterpart as the event budgets are enforced on, and the event itself as the
    data-dependent figure. ``approximate``: the event is not a proven upper bound for the noise
    used (Gaussian noise rounded by each agent; the job's ``privacy.noise``). A figure that is
    not a bound for the analysis (DP-FedSGD's sum-dominating claim) never reaches the ledger.
    ``secure_aggregation`` False: the agent's contribution was released on its own, and
    ``event`` must be the local-DP charge (True with a local-DP event is possible too: DP-FedSGD's
    provable accounting of several local steps).
    ``own_noise_fraction``: f₁, the fraction of ``event``'s noise variance that ONE agent's own
    share carries in the round (1 when the agent's own noise carries the whole charge), as the
    agent's own check computes it; None when unknown, which makes the client's own-share figure
    unknown (docs/accounting.md#what-the-agent-can-verify).
    """

    agent_id: str
    event: DpEvent
    unit: ProtectedUnit
    approximate: bool = False
    secure_aggregation: bool = True
    honest_fraction: float = 1.0
    own_noise_fraction: float | None = None


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One charge as stored. ``curve`` is the RDP curve of ``event`` on ``dpfl.accounting.ORDERS``;
    ``data_dependent_curve`` (if any) is the elementwise minimum of it and the data-dependent one.
    """

    id: int
    agent_id: str
    job_id: str
    round_id: int
    round_number: int
    attempt: int
    algorithm: str
    unit: ProtectedUnit
    event: JsonObject
    curve: tuple[float, ...] = field(repr=False)
    approximate: bool
    secure_aggregation: bool
    honest_fraction: float
    data_dependent_event: JsonObject | None
    data_dependent_curve: tuple[float, ...] | None = field(repr=False)
    created_at: datetime
    #: f₁ of the round (:class:`Charge`); None for entries written before it was recorded
    own_noise_fraction: float | None = None


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What ``commit_round`` did; ``replayed`` is True when the round had already been committed
    with exactly these charges (nothing was written the second time)."""

    round: Round
    entries: tuple[LedgerEntry, ...]
    replayed: bool


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """Whether charging ``agent_id`` more would stay within its budget (ε at the budget's δ)."""

    agent_id: str
    allowed: bool
    budget: Budget | None
    epsilon_before: float | None
    epsilon_after: float | None
    #: how ``epsilon_after`` was obtained (``dpfl.accounting.history.HistoryFigure.method``)
    method: str = "rdp"


@dataclass(frozen=True, slots=True)
class EventReport:
    """A ledger entry with its own ε at the report's δ (the composed ε is not the sum of these)."""

    entry: LedgerEntry
    epsilon: float
    data_dependent_epsilon: float | None


@dataclass(frozen=True, slots=True)
class JobEpsilon:
    """A client's spending on one job at the report's δ.

    ``epsilon`` is the smaller of two upper bounds on the whole job (one neighbouring relation):
    ``rdp_epsilon``, the job's summed RDP curve converted, and, when every event of the job has a
    tight path, the tight figure of the same events composed (exact Gaussian profile or
    pessimistic PLD; ``dpfl.accounting.history``); ``method`` names the winner
    (``"rdp"``, ``"pld"``, ``"analytic_gaussian"``) and ``order`` is the RDP bound's order.
    ``approximate``: at least one of the job's entries is approximate (:class:`Charge`), so
    neither figure is a proven upper bound, whatever ``method`` says.
    """

    job_id: str
    epsilon: float
    order: float | None
    entries: int
    data_dependent_epsilon: float | None
    method: str = "rdp"
    rdp_epsilon: float | None = None
    approximate: bool = False


@dataclass(frozen=True, slots=True)
class ClientBudget:
    """How much privacy one client has spent, at ``delta``, and what remains of its budget.

    ``epsilon`` composes every event of every job (``dpfl.accounting.history``: the tight path
    where each event has one, RDP otherwise, ``method`` says which; ``rdp_epsilon`` beside it),
    the guaranteed figure budgets are enforced on; where the client's jobs mix neighbouring
    relations it is the total converted to replacing one record. ``replace_one_epsilon`` is that
    conversion whatever the jobs were (:mod:`dpfl.accounting.relations`; at least ``epsilon``).
    ``data_dependent_epsilon`` uses the data-dependent curves where entries have one (it is
    itself a function of private data). ``remaining_epsilon`` is
    measured at the budget's own δ and is never negative. ``approximate``: at least one of the
    client's entries is approximate (:class:`Charge`), so none of these figures (totals, budget
    and remaining ε alike) is a proven upper bound.
    """

    agent_id: str
    delta: float
    epsilon: float
    order: float | None
    method: str
    data_dependent_epsilon: float | None
    budget: Budget | None
    epsilon_at_budget_delta: float | None
    remaining_epsilon: float | None
    exceeded: bool
    by_job: dict[str, JobEpsilon]
    events: tuple[EventReport, ...]
    replace_one_epsilon: float = math.inf
    approximate: bool = False
    #: the RDP bound of the same history, shown beside the figure
    rdp_epsilon: float | None = None
    #: ε of the same entries with each event's noise variance scaled by its entry's f₁: what an
    #: agent that trusts no peer records (None when unknown: ``own_share_unknown`` says why)
    own_share_epsilon: float | None = None
    own_share_method: str | None = None
    own_share_unknown: str | None = None


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One disagreement found by ``verify_ledger``."""

    kind: str
    detail: str
    agent_id: str | None = None
    job_id: str | None = None
    entry_id: int | None = None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The result of recomputing every stored curve and running sum from the stored events."""

    entries_checked: int
    sums_checked: int
    mismatches: tuple[Mismatch, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def to_json(value: Any) -> Any:
    """A record (or anything containing records) as JSON-native values, for the REST layer.

    Datetimes become ISO 8601 strings, enums their values, infinite floats the string
    ``"inf"``; fields marked ``repr=False`` that hold secrets or bytes are kept out.
    """
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if not f.repr and isinstance(item, str | bytes):
                continue  # secrets and blobs
            out[f.name] = to_json(item)
        return out
    if isinstance(value, RoundSetup):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class PrivacyAuditFigures:
    """An empirical privacy audit of a job's run (``dpfl audit``), as stored with the job.

    ``epsilon_lower`` is a lower bound on ε at ``delta`` holding with ``confidence``
    (Steinke–Nasr–Jagielski one-run bound); ``epsilon_upper`` is the ledger's ε, at the same δ,
    for a canary's unit in the same run; ``mu_lower`` is the μ-GDP lower bound of the f-DP
    one-run bound and ``epsilon_lower_gdp`` its ε at δ (a bound within the Gaussian family).
    ``details`` keeps the rest of the audit's report (design, rounds, seconds, ...).
    """

    mode: str
    unit: str
    relation: str
    canaries: int
    guesses: int
    correct: int
    confidence: float
    delta: float
    epsilon_lower: float
    epsilon_upper: float
    mu_lower: float
    epsilon_lower_gdp: float
    details: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PrivacyAudit:
    """A stored audit: its id, the job it audited and when it was recorded."""

    id: int
    job_id: str
    created_at: datetime
    figures: PrivacyAuditFigures
