"""The REST API's handlers: ``(store, arguments) -> public schema``, free of HTTP
(docs/architecture.md#handlers-free-of-transport-typed-errors).

Routers only authenticate, call one of these in a worker thread (every store method is one
blocking transaction) and let the typed errors of ``dpfl.server.errors`` become statuses. Nothing
here computes a privacy figure of its own except :func:`epsilon_history`, which replays the
client's events in ledger order through the store's own composition; its last point equals the
store's total (the same events, grouped the same way). Every figure that adds entries up carries the
store's ``approximate`` flag: true when one of those entries is approximate.
"""

from __future__ import annotations

from dataclasses import asdict

from dpfl.accounting.history import ONE_JOB, EventMultiset, canonical_event, history_figure
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.errors import LearningError
from dpfl.server.api.schemas import (
    BudgetPublic,
    BudgetReport,
    ClientPublic,
    ClientSummary,
    EpsilonHistory,
    EpsilonPoint,
    JobDetail,
    JobEpsilonPublic,
    JobPublic,
    LedgerEventPublic,
    ModelVersionPublic,
    PrivacyAuditPublic,
    RoundPublic,
)
from dpfl.server.store import (
    Agent,
    ClientBudget,
    EventReport,
    Job,
    JobStatus,
    Round,
    Store,
)
from dpfl.server.store.ledger import relation_of

__all__ = [
    "budget_report",
    "client_detail",
    "client_summaries",
    "epsilon_history",
    "job_detail",
    "job_public",
    "job_rounds",
    "list_jobs",
    "model_versions",
    "round_public",
]

#: How a single ledger entry's ε is obtained (ReportsMixin converts each cached curve alone).
_EVENT_METHOD = "rdp"


def _summary(agent: Agent, budget: ClientBudget) -> ClientSummary:
    return ClientSummary(
        id=agent.id,
        name=agent.name,
        labels=dict(agent.labels),
        status=agent.status.value,
        created_at=agent.created_at,
        budget=None
        if agent.budget is None
        else BudgetPublic(epsilon=agent.budget.epsilon, delta=agent.budget.delta),
        delta=budget.delta,
        epsilon=budget.epsilon,
        epsilon_at_budget_delta=budget.epsilon_at_budget_delta,
        remaining_epsilon=budget.remaining_epsilon,
        exceeded=budget.exceeded,
        data_dependent_epsilon=budget.data_dependent_epsilon,
        own_share_epsilon=budget.own_share_epsilon,
        own_share_unknown=budget.own_share_unknown,
        approximate=budget.approximate,
    )


def client_summaries(store: Store, *, delta: float | None = None) -> list[ClientSummary]:
    """Every client with its spending at ``delta`` (default: each client's budget δ)."""
    agents = {a.id: a for a in store.list_agents()}
    out = []
    for budget in store.list_client_budgets(delta=delta):
        agent = agents.get(budget.agent_id)
        if agent is not None:  # enrolled between the two reads: shown on the next request
            out.append(_summary(agent, budget))
    return out


def client_detail(store: Store, client_id: str, *, delta: float | None = None) -> ClientPublic:
    """One client, its spending and its jobs. Raises: NotFound, InvalidInput (δ)."""
    agent = store.get_agent(client_id)
    budget = store.client_budget(client_id, delta=delta, include_events=False)
    return ClientPublic(**dict(_summary(agent, budget)), jobs=store.agent_jobs(client_id))


def _event_public(report: EventReport) -> LedgerEventPublic:
    e = report.entry
    return LedgerEventPublic(
        id=e.id,
        job_id=e.job_id,
        round_id=e.round_id,
        round_number=e.round_number,
        attempt=e.attempt,
        algorithm=e.algorithm,
        unit=e.unit.value,
        event=e.event,
        epsilon=report.epsilon,
        method=_EVENT_METHOD,
        data_dependent_event=e.data_dependent_event,
        data_dependent_epsilon=report.data_dependent_epsilon,
        approximate=e.approximate,
        secure_aggregation=e.secure_aggregation,
        honest_fraction=e.honest_fraction,
        own_noise_fraction=e.own_noise_fraction,
        created_at=e.created_at,
    )


def budget_report(
    store: Store, client_id: str, *, delta: float | None = None, tight: bool = False
) -> BudgetReport:
    """The budget document: ε at ``delta`` per job and in total, the events behind it,
    and the remaining budget. Raises: NotFound, InvalidInput (δ)."""
    b = store.client_budget(client_id, delta=delta, include_events=True, tight=tight)
    return BudgetReport(
        client_id=b.agent_id,
        epsilon=b.epsilon,
        rdp_epsilon=b.rdp_epsilon,
        replace_one_epsilon=b.replace_one_epsilon,
        delta=b.delta,
        order=b.order,
        method=b.method,
        data_dependent_epsilon=b.data_dependent_epsilon,
        own_share_epsilon=b.own_share_epsilon,
        own_share_method=b.own_share_method,
        own_share_unknown=b.own_share_unknown,
        budget_epsilon=None if b.budget is None else b.budget.epsilon,
        budget_delta=None if b.budget is None else b.budget.delta,
        epsilon_at_budget_delta=b.epsilon_at_budget_delta,
        remaining_epsilon=b.remaining_epsilon,
        exceeded=b.exceeded,
        events=[_event_public(r) for r in b.events],
        by_job={job_id: JobEpsilonPublic.model_validate(j) for job_id, j in b.by_job.items()},
        approximate=b.approximate,
    )


def epsilon_history(store: Store, client_id: str, *, delta: float | None = None) -> EpsilonHistory:
    """The client's cumulative ε after each of its ledger entries, oldest first.

    Each point is the client's figure over the entries so far (the same composition the store
    uses for the total: :func:`dpfl.accounting.history.history_figure` of the grouped events,
    cached per prefix), so every point is an upper bound and the last one is the client's
    current total; ``job_epsilon`` is the figure of the entry's job so far.

    Raises:
        NotFound: no such client.
        InvalidInput: δ outside (0, 1).
    """
    # validates δ and resolves its default exactly as the budget report does
    at = store.client_budget(client_id, delta=delta, include_events=False).delta
    entries = store.ledger_entries(agent_id=client_id)
    total = EventMultiset()
    per_job: dict[str, EventMultiset] = {}
    approximate_jobs: set[str] = set()  # an approximate entry taints every later figure
    points = []
    for e in entries:
        if e.approximate:
            approximate_jobs.add(e.job_id)
        text = canonical_event(e.event)
        total = total.plus(relation_of(text, e.algorithm, e.unit.value), text)
        per_job[e.job_id] = per_job.get(e.job_id, EventMultiset()).plus(ONE_JOB, text)
        points.append(
            EpsilonPoint(
                entry_id=e.id,
                job_id=e.job_id,
                round_id=e.round_id,
                round_number=e.round_number,
                attempt=e.attempt,
                created_at=e.created_at,
                epsilon=history_figure(total, at).epsilon,
                job_epsilon=history_figure(per_job[e.job_id], at).epsilon,
                approximate=bool(approximate_jobs),
                job_approximate=e.job_id in approximate_jobs,
            )
        )
    return EpsilonHistory(client_id=client_id, delta=at, points=points)


def job_public(job: Job) -> JobPublic:
    rounds = job.spec.get("rounds")
    return JobPublic(
        id=job.id,
        name=job.name,
        algorithm=job.algorithm,
        status=job.status.value,
        delta=job.delta,
        rounds=rounds if isinstance(rounds, int) else 0,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        error=job.error,
    )


def list_jobs(store: Store, *, status: JobStatus | None = None) -> list[JobPublic]:
    return [job_public(j) for j in store.list_jobs(status=status)]


def job_detail(store: Store, job_id: str) -> JobDetail:
    """A job with its document, members, per-client ε and, apart, any claimed figure of its
    plan that is not a bound. Raises: NotFound."""
    job = store.get_job(job_id)
    claimed, claim = _plan_claim(store, job_id)
    reports = store.job_epsilon_reports(job_id)
    return JobDetail(
        **job_public(job).model_dump(),
        spec=job.spec,
        members=store.job_members(job_id),
        epsilons={a: j.epsilon for a, j in reports.items()},
        epsilons_approximate={a: j.approximate for a, j in reports.items()},
        approximate=any(j.approximate for j in reports.values()),
        claimed_epsilon=claimed,
        claim=claim,
    )


def _plan_claim(store: Store, job_id: str) -> tuple[float | None, str | None]:
    """The labelled figure of the job's plan that is not a bound (``PlanDetails.shown_claim``,
    from the latest round record holding a plan), or ``(None, None)``: also for a plan this
    coordinator cannot read (the figure is only shown, never charged)."""
    for rnd in reversed(store.list_rounds(job_id)):
        stored = rnd.setup.plan
        if stored is None:
            continue
        try:
            algorithm = get_algorithm(store.get_job(job_id).algorithm)
            plan = algorithm.parse_plan(stored.model_dump(mode="json"))
            shown = plan.details.shown_claim()
        except LearningError:
            return None, None
        return (None, None) if shown is None else shown
    return None, None


def round_public(rnd: Round, *, approximate: bool = False) -> RoundPublic:
    """``approximate``: whether the round's ε adds up an approximate entry
    (``Store.approximate_rounds``)."""
    if "masked_input" in rnd.survivors:
        participants: tuple[str, ...] = rnd.survivors["masked_input"]
    else:  # charged rounds count every accepted client (the ledger's own fallback); others none
        participants = rnd.accepted if rnd.committed_at is not None else ()
    return RoundPublic(
        id=rnd.id,
        job_id=rnd.job_id,
        number=rnd.number,
        attempt=rnd.attempt,
        status=rnd.status.value,
        started_at=rnd.started_at,
        committed_at=rnd.committed_at,
        finished_at=rnd.finished_at,
        invited=list(rnd.invited),
        accepted=list(rnd.accepted),
        participants=list(participants),
        survivors={k: list(v) for k, v in rnd.survivors.items()},
        dropped={k: list(v) for k, v in rnd.dropped.items()},
        stage_seconds=dict(rnd.stage_seconds),
        noise=rnd.setup.document(),
        accuracy=rnd.accuracy,
        epsilon=rnd.epsilon,
        approximate=approximate and rnd.epsilon is not None,
        model_version=rnd.model_version,
        abort_reason=rnd.abort_reason,
    )


def job_rounds(store: Store, job_id: str, *, number: int | None = None) -> list[RoundPublic]:
    """Every attempt of every round of a job (or of one round number). Raises: NotFound."""
    rounds = store.list_rounds(job_id, number=number)
    approximate = store.approximate_rounds(job_id) if rounds else set()
    return [round_public(r, approximate=r.id in approximate) for r in rounds]


def model_versions(store: Store, job_id: str) -> list[ModelVersionPublic]:
    """A job's model versions without their bytes. Raises: NotFound."""
    return [ModelVersionPublic.model_validate(m) for m in store.list_model_versions(job_id)]


def job_privacy_audits(store: Store, job_id: str) -> list[PrivacyAuditPublic]:
    """The job's audits, oldest first. Raises: NotFound."""
    return [
        PrivacyAuditPublic(id=a.id, job_id=a.job_id, created_at=a.created_at, **asdict(a.figures))
        for a in store.list_privacy_audits(job_id)
    ]
