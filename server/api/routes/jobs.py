"""``/api/v1/jobs``: submit (YAML or JSON), list, inspect, start and stop jobs (admin only).

Submission goes through :func:`dpfl.server.jobs_control.submit_job`, the function behind
``dpfl-coordinator job submit``, so both accept exactly the same documents; a refused document is
422 with one ``path: problem`` line per mistake, and nothing is written. Starting and stopping go
through the app's :class:`~dpfl.server.jobs_control.JobControl` (the orchestrator's, in a
coordinator).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import JsonValue

from dpfl.server.api import queries
from dpfl.server.api.deps import AdminDep, JobId, JobsDep, SettingsDep, StoreDep
from dpfl.server.api.routes import error_responses
from dpfl.server.api.schemas import JobDetail, JobPublic
from dpfl.server.data_access import DataAccess
from dpfl.server.documents import MAX_JOB_BYTES, load_job_document
from dpfl.server.jobs_control import submit_job
from dpfl.server.store import JobStatus

router = APIRouter(prefix="/jobs", tags=["jobs"])

JSON_TYPES = frozenset({"application/json"})
YAML_TYPES = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}
)
#: The request body's OpenAPI description; ``JobDocument`` is added to the components by
#: :func:`dpfl.server.api.openapi.build_openapi` from the job models of ``dpfl.learning.jobs``.
#: Both media types carry the same document, so both are described by its schema (a schema
#: describes the value the body serialises, whatever the syntax): a YAML body that is a mere
#: string matches no job, and the document's schema says so.
JOB_BODY: dict[str, JsonValue] = {
    "required": True,
    "description": "A job document (see examples/*.yaml), as JSON or YAML.",
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/JobDocument"}},
        "application/yaml": {"schema": {"$ref": "#/components/schemas/JobDocument"}},
    },
}
_ERRORS = error_responses(401, 403, 422)
_ONE = error_responses(401, 403, 404, 422)
_CHANGE = error_responses(401, 403, 404, 409, 422)


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_JOB_BYTES:
        raise HTTPException(413, f"job document larger than {MAX_JOB_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_JOB_BYTES:
            raise HTTPException(413, f"job document larger than {MAX_JOB_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "",
    status_code=201,
    response_model=JobDetail,
    openapi_extra={"requestBody": JOB_BODY},
    responses=error_responses(401, 403, 404, 409, 413, 415, 422),
)
async def create_job(
    request: Request, response: Response, _: AdminDep, store: StoreDep, settings: SettingsDep
) -> JobDetail:
    """Submit a job (pending until started); validated exactly as ``dpfl-coordinator job
    submit`` validates it."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media and media not in JSON_TYPES | YAML_TYPES:
        raise HTTPException(
            415,
            f"unsupported content type {media!r}: send the job as application/json or "
            "application/yaml",
        )
    body = await _read_body(request)
    document = await anyio.to_thread.run_sync(
        partial(load_job_document, body, json_only=media in JSON_TYPES)
    )
    access = DataAccess.from_settings(settings)
    job = await anyio.to_thread.run_sync(partial(submit_job, store, document, access=access))
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    return await anyio.to_thread.run_sync(queries.job_detail, store, job.id)


@router.get("", response_model=list[JobPublic], responses=_ERRORS)
def list_jobs(
    _: AdminDep,
    store: StoreDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status.")] = None,
) -> list[JobPublic]:
    """Every job, oldest first."""
    return queries.list_jobs(store, status=status)


@router.get("/{job_id}", response_model=JobDetail, responses=_ONE)
def get_job(job_id: JobId, _: AdminDep, store: StoreDep) -> JobDetail:
    """A job with its document, members and each client's ε in it."""
    return queries.job_detail(store, job_id)


@router.post("/{job_id}/start", response_model=JobPublic, responses=_CHANGE)
async def start_job(job_id: JobId, _: AdminDep, jobs: JobsDep) -> JobPublic:
    """Run a pending or stopped job (a running one is left as it is)."""
    return queries.job_public(await jobs.start(job_id))


@router.post("/{job_id}/stop", response_model=JobPublic, responses=_CHANGE)
async def stop_job(job_id: JobId, _: AdminDep, jobs: JobsDep) -> JobPublic:
    """Stop a pending or running job (a stopped one is left as it is)."""
    return queries.job_public(await jobs.stop(job_id))
