"""The OpenAPI document: FastAPI's, plus the job document's schema for ``POST /jobs``.

``POST /api/v1/jobs`` reads its body itself (YAML or JSON, validated by ``parse_job``), so FastAPI
cannot describe it; the JSON schema of ``dpfl.learning.jobs.JobSpec`` (one variant per
algorithm, every number with its range: ``dpfl.learning.jobs.job_json_schema``) is added to the
components as ``JobDocument`` with its sub-schemas.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import JsonValue

from dpfl.learning.jobs import job_json_schema

__all__ = ["JOB_DOCUMENT", "build_openapi"]

JOB_DOCUMENT = "JobDocument"
_REF = "#/components/schemas/{model}"


def _job_schemas() -> dict[str, JsonValue]:
    schema = job_json_schema(ref_template=_REF)
    defs: dict[str, JsonValue] = schema.pop("$defs", {})
    return {**defs, JOB_DOCUMENT: schema}


def build_openapi(app: FastAPI) -> dict[str, JsonValue]:
    """The document, built once per app and cached on it (FastAPI's convention)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _job_schemas().items():
        if name in schemas and schemas[name] != schema:
            raise RuntimeError(f"OpenAPI schema name {name!r} is used twice")
        schemas[name] = schema
    app.openapi_schema = doc
    return doc
