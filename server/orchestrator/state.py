"""What a restarted coordinator needs to redo a round: the job's plan and the state before it.

Every attempt stores, in its :class:`~dpfl.server.store.round_setup.RoundSetup` before
anything is sent, the job's :class:`~dpfl.learning.algorithms.base.JobPlan` and the
:class:`~dpfl.learning.algorithms.base.CoordinatorState` before the round. :func:`restore`
redoes an interrupted round from them, or continues after the last completed round
(docs/architecture.md#round-attempts-in-the-store).

An attempt the coordinator ended (its restart, its shutdown, a stop of the job:
:data:`INTERRUPTIONS`) is redone and does not count toward the round's abort limit: only the
attempts the round itself aborted do (:func:`counts_toward_abort_limit`), so a crash-looping
coordinator does not fail its jobs.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from dpfl.learning.algorithms.base import Algorithm, CoordinatorState, JobPlan
from dpfl.learning.rounds.state import Summation, SumSetup
from dpfl.server.errors import LedgerIntegrityError
from dpfl.server.orchestrator.sampling import AttemptSample
from dpfl.server.store import JobStatus, Round, RoundStatus, Store
from dpfl.server.store.round_setup import (
    ROUND_SETUP_VERSION,
    EncodingRecord,
    PlanRecord,
    RoundSetup,
    SecAggRecord,
    StateRecord,
)

__all__ = [
    "COORDINATOR_RESTARTED",
    "COORDINATOR_SHUT_DOWN",
    "INTERRUPTIONS",
    "Restored",
    "counts_toward_abort_limit",
    "halt_reason",
    "plan_record",
    "restore",
    "round_record",
    "state_from_record",
    "state_record",
    "with_summation",
]

#: Why a coordinator at start-up aborts the attempts it finds unfinished (the default reason of
#: ``Store.abort_interrupted_rounds``).
COORDINATOR_RESTARTED = "coordinator restarted"
#: Why a coordinator shutting down aborts the attempts in flight (``Orchestrator.close``).
COORDINATOR_SHUT_DOWN = "coordinator shut down"


def halt_reason(status: JobStatus) -> str:
    """Why the orchestrator aborts the attempt in flight of a job that left ``running``
    (``job stopped``; ``job failed``, ``job completed``... when another process changed it)."""
    return f"job {status.value}"


#: The abort reasons of attempts the coordinator ended, not the round itself.
INTERRUPTIONS = frozenset({COORDINATOR_RESTARTED, COORDINATOR_SHUT_DOWN}) | frozenset(
    halt_reason(status) for status in JobStatus
)
#: What the store appends to the reason of an attempt aborted after its ledger commit.
_AFTER_COMMIT = " (aborted after the ledger commit"


def counts_toward_abort_limit(rnd: Round) -> bool:
    """Whether ``rnd`` is an attempt the round itself aborted (too few survivors, a deadline, a
    refused commit...), as opposed to one the coordinator ended (:data:`INTERRUPTIONS`) or a
    small sample's skip (the runner counts neither)."""
    if rnd.status != RoundStatus.ABORTED:
        return False
    reason = (rnd.abort_reason or "").split(_AFTER_COMMIT, 1)[0]
    return reason not in INTERRUPTIONS and not reason.endswith(": skipped")


def state_record(state: CoordinatorState) -> StateRecord:
    """The state without its model bytes (kept as the store's model version)."""
    return StateRecord(
        model_version=state.model_version if state.model is not None else None,
        details=dict(state.details),
        blobs={k: base64.b64encode(v).decode("ascii") for k, v in state.blobs.items()},
    )


def state_from_record(record: StateRecord, *, store: Store, job_id: str) -> CoordinatorState:
    """Rebuild a state, fetching its model version's bytes from the store."""
    version = record.model_version
    model = None if version is None else store.get_model_version(job_id, version).data
    return CoordinatorState(
        model=model,
        model_version=version if version is not None else 0,
        details=dict(record.details),
        blobs={k: base64.b64decode(v) for k, v in record.blobs.items()},
    )


def plan_record(plan: JobPlan) -> PlanRecord:
    """The job's plan as a round stores it (``JobPlan.to_json``)."""
    return PlanRecord.model_validate(plan.to_json())


def round_record(
    plan: JobPlan,
    state: CoordinatorState,
    sample: AttemptSample,
    population: Sequence[str],
    excluded: Sequence[str],
) -> RoundSetup:
    """The record of a new attempt: what a restart resumes from, the attempt's population (the
    ``excluded`` left out, over budget), and the draw a later attempt keeps."""
    return RoundSetup(
        version=ROUND_SETUP_VERSION,
        plan=plan_record(plan),
        state=state_record(state),
        population=len(population),
        excluded_over_budget=list(excluded),
        sample=list(sample.sample),
        sample_population=list(sample.drawn_from),
        sample_kept=sample.kept,
    )


def with_summation(record: RoundSetup, setup: SumSetup) -> RoundSetup:
    """``record`` with the round's summation: its encoding and its parameters."""
    p, ring_bits = setup.params, setup.encoding.ring_bits
    secagg = SecAggRecord(enabled=False, num_clients=len(setup.accepted), ring_bits=ring_bits)
    if p is not None:
        secagg = SecAggRecord(
            num_clients=p.num_clients,
            degree=p.degree,
            threshold=p.threshold,
            ring_bits=p.ring_bits,
            vector_length=p.vector_length,
            min_survivors=p.min_survivors,
            threat_model=setup.threat_model,
        )
    encoding = EncodingRecord.model_validate(setup.encoding.to_dict())
    alone = {"noise_alone": True} if setup.kind is Summation.NOISE_ALONE else {}
    return record.model_copy(update={"encoding": encoding, "secagg": secagg, **alone})


@dataclass(frozen=True, slots=True)
class Restored:
    """Where a job resumes: the next round number, its plan and the state before it."""

    number: int
    plan: JobPlan
    state: CoordinatorState
    attempts: int  # attempts of ``number`` the round itself aborted (the abort limit's count)


def restore(store: Store, job_id: str, algorithm: Algorithm) -> Restored | None:
    """The point a job resumes from, or None when it never started a round (blocking).

    Raises:
        LedgerIntegrityError: a round record without the plan and state it must hold.
    """
    rounds = store.list_rounds(job_id)
    if not rounds:
        return None
    completed = [r for r in rounds if r.status == RoundStatus.COMPLETED]
    last_done = max((r.number for r in completed), default=0)
    following = [r for r in rounds if r.number == last_done + 1]
    if following:
        latest = max(following, key=lambda r: r.attempt)
        plan, state = _from_record(store, latest, algorithm)
        aborted = sum(1 for r in following if counts_toward_abort_limit(r))
        return Restored(last_done + 1, plan, state, attempts=aborted)
    done = max(completed, key=lambda r: r.number)
    plan, before = _from_record(store, done, algorithm)
    if done.model_version is not None:
        model = store.get_model_version(job_id, done.model_version).data
        version = done.model_version
    else:
        model, version = before.model, before.model_version
    details = {**before.details, "round": done.number}
    state = CoordinatorState(
        model=model, model_version=version, details=details, blobs=before.blobs
    )
    return Restored(last_done + 1, plan, state, attempts=0)


def _from_record(
    store: Store, rnd: Round, algorithm: Algorithm
) -> tuple[JobPlan, CoordinatorState]:
    stored_plan, stored_state = rnd.setup.plan, rnd.setup.state
    if stored_plan is None or stored_state is None:
        raise LedgerIntegrityError(
            f"round {rnd.number} (attempt {rnd.attempt}) of job {rnd.job_id!r} does not hold "
            "the plan and state needed to resume"
        )
    plan = algorithm.parse_plan(stored_plan.model_dump(mode="json"))
    return plan, state_from_record(stored_state, store=store, job_id=rnd.job_id)
