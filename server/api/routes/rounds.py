"""``/api/v1/jobs/{job_id}/rounds``: every attempt of every round of a job (admin only):
participants, dropouts per stage, stage timings, the aggregate ε after the round, accuracy."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from dpfl.server.api import queries
from dpfl.server.api.deps import AdminDep, JobId, StoreDep
from dpfl.server.api.routes import error_responses
from dpfl.server.api.schemas import RoundPublic

router = APIRouter(prefix="/jobs/{job_id}/rounds", tags=["rounds"])


@router.get(
    "",
    response_model=list[RoundPublic],
    responses=error_responses(401, 403, 404, 422),
)
def list_rounds(
    job_id: JobId,
    _: AdminDep,
    store: StoreDep,
    number: Annotated[
        int | None, Query(ge=1, le=2**31 - 1, description="Only this round number.")
    ] = None,
) -> list[RoundPublic]:
    """Rounds by (number, attempt); an aborted attempt is followed by its redo."""
    return queries.job_rounds(store, job_id, number=number)
