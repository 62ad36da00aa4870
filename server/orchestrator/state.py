"""What a restarted coordinator needs to redo a round: the job's plan and the state before it.

Every attempt stores, in its record's ``noise`` object before anything is sent, the job's
:class:`~dpfl.learning.algorithms.base.JobPlan` and the
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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpfl.learning.algorithms.base import Algorithm, CoordinatorState, JobPlan
from dpfl.server.errors import LedgerIntegrityError
from dpfl.server.store import JobStatus, Round, RoundStatus, Store

__all__ = [
    "COORDINATOR_RESTARTED",
    "COORDINATOR_SHUT_DOWN",
    "INTERRUPTIONS",
    "Restored",
    "counts_toward_abort_limit",
    "halt_reason",
    "restore",
    "round_record",
    "state_from_json",
    "state_to_json",
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


def state_to_json(state: CoordinatorState) -> dict[str, Any]:
    """The state without its model bytes (kept as the store's model version)."""
    return {
        "model_version": state.model_version if state.model is not None else None,
        "details": dict(state.details),
        "blobs": {k: base64.b64encode(v).decode("ascii") for k, v in state.blobs.items()},
    }


def state_from_json(data: Mapping[str, Any], *, store: Store, job_id: str) -> CoordinatorState:
    """Rebuild a state, fetching its model version's bytes from the store."""
    version = data.get("model_version")
    model = None
    if version is not None:
        model = store.get_model_version(job_id, int(version)).data
    return CoordinatorState(
        model=model,
        model_version=int(version) if version is not None else 0,
        details=dict(data.get("details", {})),
        blobs={k: base64.b64decode(v) for k, v in dict(data.get("blobs", {})).items()},
    )


def round_record(plan: JobPlan, state: CoordinatorState, **extra: Any) -> dict[str, Any]:
    """The ``noise`` object of a new round attempt."""
    return {"plan": plan.to_json(), "state": state_to_json(state), **extra}


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
    noise = rnd.noise
    if "plan" not in noise or "state" not in noise:
        raise LedgerIntegrityError(
            f"round {rnd.number} (attempt {rnd.attempt}) of job {rnd.job_id!r} does not hold "
            "the plan and state needed to resume"
        )
    plan = algorithm.parse_plan(noise["plan"])
    return plan, state_from_json(noise["state"], store=store, job_id=rnd.job_id)
