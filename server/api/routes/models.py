"""``/api/v1/jobs/{job_id}/models``: a job's model versions, and downloading one (admin only).

A download is the stored bytes as ``application/octet-stream`` with the SHA-256 in
``X-Checksum-SHA256`` (hex), ``Repr-Digest`` (RFC 9530) and the ``ETag``, so a client can verify
what it received.
"""

from __future__ import annotations

import base64
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Path, Response

from dpfl.server.api import queries
from dpfl.server.api.deps import AdminDep, JobId, StoreDep
from dpfl.server.api.routes import error_responses
from dpfl.server.api.schemas import ModelVersionPublic

router = APIRouter(prefix="/jobs/{job_id}/models", tags=["models"])

_ERRORS = error_responses(401, 403, 404, 422)
Version = Annotated[int, Path(ge=0, le=2**31 - 1, description="The model version (0: initial).")]


@router.get("", response_model=list[ModelVersionPublic], responses=_ERRORS)
def list_models(job_id: JobId, _: AdminDep, store: StoreDep) -> list[ModelVersionPublic]:
    """The job's model versions, oldest first, without their bytes."""
    return queries.model_versions(store, job_id)


@router.get(
    "/{version}",
    response_class=Response,
    responses={
        200: {
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            "description": "The model's bytes.",
        },
        **_ERRORS,
    },
)
async def download_model(job_id: JobId, version: Version, _: AdminDep, store: StoreDep) -> Response:
    """One model version's bytes (the format of ``dpfl.learning``'s model serialisation)."""
    model = await anyio.to_thread.run_sync(store.get_model_version, job_id, version)
    data = model.data or b""
    digest = base64.b64encode(bytes.fromhex(model.sha256)).decode("ascii")
    return Response(
        content=data,
        media_type="application/octet-stream",
        headers={
            "X-Checksum-SHA256": model.sha256,
            "Repr-Digest": f"sha-256=:{digest}:",
            "ETag": f'"{model.sha256}"',
            "Content-Disposition": f'attachment; filename="{job_id}-v{model.version}.model"',
        },
    )
