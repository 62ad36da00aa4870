"""What the REST API answers with: one *Public* schema per resource and use, plus the errors.

These are the wire contract (scripts, the dashboard and ``dpfl budget`` rely on them): add fields
freely, never rename or remove one. Every ε is an upper bound at the stated δ, except the lower
bounds an audit measured (``PrivacyAuditPublic``: ``epsilon_lower``, ``epsilon_lower_gdp``) and
a figure marked ``approximate`` (it adds up at least one ledger entry whose ε is not a proven
bound for the noise used: discrete Gaussian noise charged as the continuous Gaussian); an
infinite ε (an event no accounting path bounds) is sent as the string ``"Infinity"``. Timestamps
are ISO 8601 UTC. Job creation has no schema of its own here: the body is the job document of
``dpfl.learning.jobs`` (YAML or JSON), validated by ``parse_job``.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from dpfl.server.store.records import JsonObject

__all__ = [
    "BudgetPublic",
    "BudgetReport",
    "ClientPublic",
    "ClientSummary",
    "EpsilonHistory",
    "EpsilonPoint",
    "ErrorPublic",
    "HealthPublic",
    "JobDetail",
    "JobEpsilonPublic",
    "JobPublic",
    "LedgerEventPublic",
    "ModelVersionPublic",
    "PrivacyAuditPublic",
    "RoundPublic",
]


class _Public(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings", from_attributes=True)


#: What ``approximate`` means on every figure that adds ledger entries up.
_APPROXIMATE = (
    "True when this figure adds up at least one approximate ledger entry (discrete Gaussian "
    "noise charged as the continuous Gaussian, the job's privacy.noise: gaussian): it is then "
    "not a proven upper bound, whatever 'method' says. False: every entry behind it is a bound."
)


class ErrorPublic(_Public):
    """Every error: ``detail`` names the problem; ``code`` is stable and machine-readable."""

    detail: str = Field(description="What went wrong, naming the offending value or field.")
    code: str = Field(description="e.g. unauthenticated, forbidden, not_found, invalid_job.")
    problems: list[str] | None = Field(
        default=None, description="One 'path: problem' line per mistake (invalid input only)."
    )


class HealthPublic(_Public):
    status: str = Field(description="'ok'/'ready', or 'unavailable'.")
    checks: dict[str, bool] = Field(default_factory=dict)


#: What ``own_share_epsilon`` is, wherever a client's figure is shown.
_OWN_SHARE = (
    "ε of the same ledger entries with each entry's noise variance scaled by its round's "
    "own_noise_fraction f₁ (the fraction one agent's own noise share carries), composed as "
    "'epsilon' is: the figure an agent that trusts no peer records in its own ledger, since it "
    "can verify only its own share is in the sum (docs/accounting.md#what-the-agent-can-verify). "
    "'epsilon' instead assumes the announced cohort (honest fraction t of min_survivors). For "
    "rounds the client was charged without taking part its agent records nothing, so this is "
    "then an upper bound of the agent's ledger. Null when some entry's f₁ is unknown (entries "
    "written before the coordinator recorded it): own_share_unknown says why; never a figure "
    "that could under-state."
)
_OWN_SHARE_UNKNOWN = "Why own_share_epsilon is null; null when it is known."
_COHORT = (
    "ε assuming the announced cohort: the events as charged, whose noise is that of the "
    "honest fraction t of min_survivors agents' shares (the population figure budgets use)."
)


# clients --------------------------------------------------------------------------------------
class BudgetPublic(_Public):
    """A client's budget: ε spent, measured at ``delta``, must stay ≤ ``epsilon``."""

    epsilon: float
    delta: float


class ClientSummary(_Public):
    """A client with its spending; ``epsilon`` is at ``delta`` (the request's, else its budget's
    δ, else 1e-5); ``remaining_epsilon`` is measured at the budget's own δ and never negative."""

    id: str
    name: str
    labels: dict[str, str]
    status: str
    created_at: datetime
    budget: BudgetPublic | None
    delta: float
    epsilon: float = Field(description=_COHORT)
    epsilon_at_budget_delta: float | None
    remaining_epsilon: float | None
    exceeded: bool
    data_dependent_epsilon: float | None = Field(
        description="ε using data-dependent bounds where entries have one (itself a function "
        "of private data); null when no entry has one."
    )
    own_share_epsilon: float | None = Field(description=_OWN_SHARE)
    own_share_unknown: str | None = Field(description=_OWN_SHARE_UNKNOWN)
    approximate: bool = Field(
        description=_APPROXIMATE + " Covers every ε here (and so remaining_epsilon, exceeded)."
    )


class ClientPublic(ClientSummary):
    jobs: list[str] = Field(description="Ids of the jobs the client belongs to.")


class JobEpsilonPublic(_Public):
    job_id: str
    epsilon: float = Field(
        description="ε of this job alone: the smaller of 'rdp_epsilon' and, when every event of "
        "the job has a tight path (Gaussian, voting, Poisson-subsampled Gaussian), the exact "
        "Gaussian or pessimistic PLD figure of the same events composed; 'method' says which."
    )
    method: str = Field(
        description="'rdp', 'pld' or 'analytic_gaussian': how 'epsilon' was computed (whether "
        "it is a proven bound is 'approximate')."
    )
    rdp_epsilon: float | None = Field(description="The job's summed RDP curve, converted.")
    order: float | None = Field(
        description="The Rényi order of the RDP figure (null: nothing spent)."
    )
    entries: int
    data_dependent_epsilon: float | None
    approximate: bool = Field(description=_APPROXIMATE + " Covers every ε of this job.")


class LedgerEventPublic(_Public):
    """One ledger entry: the mechanism with its parameters, and its own ε at the report's δ
    (ε of several entries compose through their RDP curves, not by adding these numbers)."""

    id: int
    job_id: str
    round_id: int
    round_number: int
    attempt: int
    algorithm: str
    unit: str
    event: JsonObject = Field(description="The privacy event (dpfl.accounting JSON form).")
    epsilon: float
    method: str = Field(description="How ε was obtained from the event ('rdp').")
    data_dependent_event: JsonObject | None
    data_dependent_epsilon: float | None
    approximate: bool = Field(
        description="The ε is not a proven upper bound for the noise used: Gaussian noise "
        "rounded by each agent (the job's privacy.noise). A figure that is not a bound for the "
        "analysis (DP-FedSGD's sum-dominating claim) is never a ledger entry: see the job's "
        "claimed_epsilon."
    )
    secure_aggregation: bool
    honest_fraction: float
    own_noise_fraction: float | None = Field(
        description="f₁: the fraction of this event's noise variance that one agent's own share "
        "carried in the round (1 when an agent's own noise carries the whole charge), computed "
        "by the agents' own check; null for entries written before it was recorded."
    )
    created_at: datetime


class BudgetReport(_Public):
    """What one client has spent at ``delta``, per job and in total, and what remains."""

    client_id: str
    epsilon: float = Field(
        description="Total ε over every job: every event of the client composed, by pessimistic "
        "PLD or the exact Gaussian profile where each has a tight path, by RDP otherwise; where "
        "the client's jobs mix neighbouring relations, the RDP total converted to replacing one "
        "record (docs/accounting.md, section (d)). Budgets, remaining_epsilon and the history use "
        "this figure. ?tight=true changes nothing (kept for clients that ask for it). " + _COHORT
    )
    rdp_epsilon: float | None = Field(
        default=None, description="The RDP bound of the same events composed, for comparison."
    )
    replace_one_epsilon: float = Field(
        description="ε for replacing one record of the client, valid whatever neighbouring "
        "relations (add/remove, replace-one) and units its jobs mixed: the total converted by "
        "RDP's weak triangle inequality (Mironov 2017, Prop. 11); at least 'epsilon'."
    )
    delta: float
    order: float | None
    method: str = Field(
        description="How 'epsilon' was obtained: 'pld' or 'analytic_gaussian' (tight path), "
        "'rdp' (some event has no tight path), 'rdp_fallback' (the tight path failed), "
        "'rdp_replace_one' (mixed relations). Whether it is a proven bound is 'approximate'."
    )
    data_dependent_epsilon: float | None
    own_share_epsilon: float | None = Field(description=_OWN_SHARE)
    own_share_method: str | None = Field(
        description="How own_share_epsilon was obtained (as 'method'); null when it is."
    )
    own_share_unknown: str | None = Field(description=_OWN_SHARE_UNKNOWN)
    budget_epsilon: float | None
    budget_delta: float | None
    epsilon_at_budget_delta: float | None
    remaining_epsilon: float | None
    exceeded: bool
    events: list[LedgerEventPublic]
    by_job: dict[str, JobEpsilonPublic]
    approximate: bool = Field(
        description=_APPROXIMATE + " Covers the totals (epsilon, replace_one_epsilon, "
        "data_dependent_epsilon, epsilon_at_budget_delta) and so remaining_epsilon and exceeded; "
        "each job's and each event's own flag is in by_job and events."
    )


class EpsilonPoint(_Public):
    """The client's cumulative ε right after one ledger entry."""

    entry_id: int
    job_id: str
    round_id: int
    round_number: int
    attempt: int
    created_at: datetime
    epsilon: float = Field(
        description="Total ε over every job so far, at the history's δ (the budget report's "
        "composition of the entries so far)."
    )
    job_epsilon: float = Field(
        description="ε within this entry's job so far (its events composed, as the budget "
        "report's by_job)."
    )
    approximate: bool = Field(description=_APPROXIMATE + " Of 'epsilon' (every job so far).")
    job_approximate: bool = Field(
        description=_APPROXIMATE + " Of 'job_epsilon' (this entry's job so far)."
    )


class EpsilonHistory(_Public):
    client_id: str
    delta: float
    points: list[EpsilonPoint]


# jobs, rounds, models -------------------------------------------------------------------------
class JobPublic(_Public):
    id: str
    name: str
    algorithm: str
    status: str
    delta: float
    rounds: int = Field(description="Rounds the job is configured to run.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None


class JobDetail(JobPublic):
    spec: JsonObject = Field(description="The validated job document, defaults filled in.")
    members: list[str]
    epsilons: dict[str, float] = Field(
        description="Each charged client's ε in this job alone, at the job's δ: the smaller of "
        "its RDP figure and the tight (exact Gaussian / pessimistic PLD) figure of the same "
        "events where every event has one."
    )
    epsilons_approximate: dict[str, bool] = Field(
        description="For each client of 'epsilons' (same keys): whether its figure adds up at "
        "least one approximate ledger entry (discrete Gaussian noise charged as the continuous "
        "Gaussian), so that it is not a proven upper bound."
    )
    approximate: bool = Field(
        description="True when any figure of 'epsilons' is approximate (see "
        "epsilons_approximate); false when none is, or nobody was charged."
    )
    claimed_epsilon: float | None = Field(
        default=None,
        description="A figure the job's recipe claims that is NOT a proven bound (DP-FedSGD's "
        "sum-dominating accounting of several local steps), at the job's δ; never charged, "
        "added to a total or compared with a budget. null when the job makes no such claim.",
    )
    claim: str | None = Field(
        default=None, description="What claimed_epsilon is, and why it is not a bound."
    )


class RoundPublic(_Public):
    """One attempt at one round; ``dropped``/``survivors``/``stage_seconds`` are per stage."""

    id: int
    job_id: str
    number: int
    attempt: int
    status: str
    started_at: datetime
    committed_at: datetime | None
    finished_at: datetime | None
    invited: list[str]
    accepted: list[str]
    participants: list[str] = Field(
        description="Clients whose masked input entered the aggregate: the masked-input "
        "stage's survivors; without that record, the accepted clients of a charged round and "
        "nobody for a round that was never charged."
    )
    survivors: dict[str, list[str]]
    dropped: dict[str, list[str]]
    stage_seconds: dict[str, float]
    noise: dict[str, JsonValue] = Field(
        description="The attempt's stored setup (its plan, sample, declines and summation)."
    )
    accuracy: float | None
    epsilon: float | None = Field(
        description="Largest per-job RDP ε (at the job's δ) among the clients charged by this "
        "round, after the charge, fixed at commit; null when the round was never charged. The "
        "job's ε (job detail 'epsilons') may be tighter (min with the PLD)."
    )
    approximate: bool = Field(
        description=_APPROXIMATE + " Of 'epsilon': one of the clients it charged has an "
        "approximate entry in the job up to this round. False for a round never charged."
    )
    model_version: int | None
    abort_reason: str | None


class PrivacyAuditPublic(_Public):
    """An empirical privacy audit of the job's run (``dpfl audit --database-url``): lower bounds
    measured with canaries beside the ledger's ε of the same run. Evidence only: an audit is
    never charged, added to a total or compared with a budget."""

    id: int
    job_id: str
    created_at: datetime
    mode: str = Field(description="'white-box' (every aggregate) or 'black-box' (final model).")
    unit: str = Field(description="'record' or 'agent': what a canary is.")
    relation: str = Field(description="'add-remove' or 'replace-one'.")
    canaries: int
    guesses: int
    correct: int
    confidence: float = Field(description="Of each lower bound.")
    delta: float
    epsilon_lower: float = Field(
        description="A lower bound on ε at 'delta' holding with 'confidence' (Steinke, Nasr & "
        "Jagielski's one-run bound for the (ε, δ) claim); above 'epsilon_upper' means the "
        "implementation leaks more than the ledger charges."
    )
    epsilon_upper: float = Field(
        description="The ledger's ε at 'delta' for a canary's unit in this same run (the job "
        "detail's 'epsilons')."
    )
    mu_lower: float = Field(
        description="A lower bound on μ of μ-GDP with 'confidence' (the f-DP one-run bound)."
    )
    epsilon_lower_gdp: float = Field(
        description="ε at 'delta' of mu_lower-GDP: a lower bound within the Gaussian family of "
        "trade-off curves only, not on ε of every (ε, δ) analysis."
    )
    details: JsonObject = Field(description="The rest of the audit's report.")


class ModelVersionPublic(_Public):
    job_id: str
    version: int
    sha256: str
    size: int
    created_at: datetime
    round_id: int | None
