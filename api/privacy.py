"""``dpfl.privacy``: ε and noise calibration of a job or of a single mechanism, from Python.

Wraps :mod:`dpfl.accounting` (what ``dpfl privacy`` calls) and each algorithm's own ``plan``
(what the coordinator fixes at job start), so that a notebook sees the same figures as the
coordinator's ledger: ``plan`` calibrates a job for N agents, ``epsilon`` is the ε of the whole
planned job (or of any event) at a δ, ``noise_multiplier`` the calibrated z. Every ε is an upper
bound. Examples: docs/utility.md#python-api.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfl.accounting import (
    CalibrationResult,
    DpEvent,
    EpsilonReport,
    GaussianEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    calibrate,
    compute_epsilon,
    event_from_json,
    event_to_json,
)
from dpfl.simulation import JobLike, resolve_job

if TYPE_CHECKING:
    from dpfl.learning.algorithms.base import JobPlan

__all__ = [
    "CalibrationResult",
    "DpEvent",
    "EpsilonReport",
    "GaussianEvent",
    "PoissonSampledEvent",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "SkellamEvent",
    "VotingEvent",
    "calibrate",
    "compute_epsilon",
    "epsilon",
    "event_to_json",
    "job_event",
    "noise_multiplier",
    "plan",
]


def plan(job: JobLike, *, agents: int, target_epsilon: float | None = None) -> JobPlan:
    """The job's plan for ``agents`` clients, as the coordinator computes it at job start
    (``dpfl.learning.algorithms.base.JobPlan``: noise multiplier, calibration record, details).

    Args:
        job: a JobSpec, its mapping, or a YAML/JSON file's path.
        agents: the population N the noise is calibrated for.
        target_epsilon: replaces the job's ``privacy.target_epsilon`` when given.

    Raises:
        dpfl.learning.jobs.JobSpecError: an invalid job (or target).
        dpfl.learning.errors.LearningError: the target cannot be met for this population.
    """
    from dpfl.learning.algorithms.registry import get_algorithm
    from dpfl.learning.jobs import job_to_dict, parse_job

    spec = resolve_job(job)
    if target_epsilon is not None:
        document = job_to_dict(spec)
        privacy = document["privacy"]
        assert isinstance(privacy, dict)  # a job's privacy section is an object
        document["privacy"] = {**privacy, "target_epsilon": target_epsilon}
        spec = parse_job(document)
    return get_algorithm(spec.algorithm).plan(spec, population=agents)


def job_event(job: JobLike, *, agents: int, target_epsilon: float | None = None) -> DpEvent:
    """The event the whole planned job charges one client (every round, as calibrated)."""
    record = plan(job, agents=agents, target_epsilon=target_epsilon).calibration
    event = record.get("event")
    if event is None:
        raise ValueError("this job's plan records no privacy event (nothing to account)")
    return event_from_json(event)


def epsilon(
    subject: DpEvent | JobLike,
    *,
    delta: float | None = None,
    agents: int | None = None,
    tight: bool = True,
) -> EpsilonReport:
    """ε at ``delta`` of an event, or of a whole job planned for ``agents`` clients.

    Args:
        subject: a :class:`DpEvent` or a job (JobSpec, mapping, or path).
        delta: δ; for a job it defaults to the job's ``privacy.delta``.
        agents: the population a job is planned for (required for a job).
        tight: also try the tight (PLD / analytic) bound; the smaller valid bound is reported.

    Raises:
        ValueError: a missing ``delta`` for an event or ``agents`` for a job.
        dpfl.accounting.AccountingError: an event no accounting path supports.
    """
    if isinstance(subject, DpEvent):
        if delta is None:
            raise ValueError("the ε of an event needs a delta")
        return compute_epsilon(subject, delta=delta, tight=tight)
    if agents is None:
        raise ValueError("the ε of a job needs agents= (the population it is planned for)")
    spec = resolve_job(subject)
    event = job_event(spec, agents=agents)
    return compute_epsilon(event, delta=spec.privacy.delta if delta is None else delta, tight=tight)


def noise_multiplier(job: JobLike, *, agents: int, target_epsilon: float | None = None) -> float:
    """The noise multiplier z the coordinator would calibrate ``job`` to for ``agents`` clients
    (at ``target_epsilon`` instead of the job's target when given)."""
    return float(plan(job, agents=agents, target_epsilon=target_epsilon).noise_multiplier)
