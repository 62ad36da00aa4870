"""What a restarted coordinator needs to redo a round: the job's plan and the state before it.

Every attempt stores, in its record's ``noise`` object before anything is sent, the job's
:class:`~dpfl.learning.algorithms.base.JobPlan` and the
:class:`~dpfl.learning.algorithms.base.CoordinatorState` before the round. :func:`restore`
redoes an interrupted round from them, or continues after the last completed round
(docs/architecture.md#round-attempts-in-the-store).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpfl.learning.algorithms.base import Algorithm, CoordinatorState, JobPlan
from dpfl.server.errors import LedgerIntegrityError
from dpfl.server.store import Round, RoundStatus, Store

__all__ = ["Restored", "restore", "round_record", "state_from_json", "state_to_json"]


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
    attempts: int  # attempts of ``number`` already made


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
        return Restored(last_done + 1, plan, state, attempts=len(following))
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
