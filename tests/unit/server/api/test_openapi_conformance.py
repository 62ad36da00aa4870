"""The two findings of issue 29 (item 8) against the OpenAPI document.

- ``Allow``: a 405 (``OPTIONS`` included) must list every method the document declares for the
  path. Starlette's names only the first route whose path matched, so ``OPTIONS /api/v1/jobs``
  answered ``Allow: POST`` without ``GET``.
- The YAML body of ``POST /api/v1/jobs`` was described as ``{"type": "string"}``, so a bare
  string was a valid body under the schema and still got 422. Both media types carry one job
  document and are described by its schema; a YAML body and the JSON of the same document get
  the same answer.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
import schemathesis
import yaml
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from support.api import bearer

from dpfl.server.api.routes.jobs import YAML_TYPES

pytestmark = pytest.mark.anyio

_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _concrete(template: str) -> str:
    return re.sub(r"\{[^}/]+\}", "x1", template)


async def test_405_lists_every_method_the_document_declares_for_the_path(
    anon: httpx.AsyncClient,
) -> None:
    doc = (await anon.get("/api/v1/openapi.json")).json()
    paths: Mapping[str, Mapping[str, Any]] = doc["paths"]
    assert {m for m in paths["/api/v1/jobs"] if m in _METHODS} == {"get", "post"}
    for template, item in paths.items():
        declared = sorted(m.upper() for m in item if m in _METHODS)
        unsupported = [m for m in ("OPTIONS", "DELETE", "PUT", "PATCH") if m not in declared]
        for method in unsupported:
            r = await anon.request(method, _concrete(template))
            assert r.status_code == 405, (method, template, r.text)
            allowed = sorted(m.strip() for m in r.headers["allow"].split(","))
            assert allowed == declared, (method, template)
            assert r.json()["code"] == "method_not_allowed"


async def test_options_on_the_jobs_collection_allows_get_and_post(anon: httpx.AsyncClient) -> None:
    r = await anon.options("/api/v1/jobs")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, POST"


async def test_both_media_types_of_a_job_are_described_by_the_job_schema(
    anon: httpx.AsyncClient,
) -> None:
    doc = (await anon.get("/api/v1/openapi.json")).json()
    content = doc["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]
    job = {"$ref": "#/components/schemas/JobDocument"}
    assert content == {"application/json": {"schema": job}, "application/yaml": {"schema": job}}


@pytest.mark.slow
def test_a_yaml_job_is_judged_as_the_same_document_in_json(app: FastAPI, admin_token: str) -> None:
    """Positive YAML bodies generated from the document (schemathesis, as the fuzzing test
    draws them) are job documents, and each gets the answer its JSON gets: same status, same
    problems."""
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    (operation,) = [
        result.ok()
        for result in schema.get_all_operations()
        if result.ok().path == "/api/v1/jobs" and result.ok().method.upper() == "POST"
    ]
    yaml_cases = operation.as_strategy(GenerationMode.POSITIVE).filter(
        lambda case: case.media_type in YAML_TYPES
    )
    headers = bearer(admin_token)
    seen: list[int] = []

    async def submit(body: str, media: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await c.post(
                "/api/v1/jobs", content=body, headers={**headers, "Content-Type": media}
            )

    @given(case=yaml_cases)
    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        assert isinstance(case.body, Mapping), case.body
        as_yaml = asyncio.run(submit(yaml.safe_dump(case.body), case.media_type))
        as_json = asyncio.run(submit(json.dumps(case.body), "application/json"))
        assert as_yaml.status_code == as_json.status_code, (as_yaml.text, as_json.text)
        assert as_yaml.status_code in (201, 422), as_yaml.text
        if as_yaml.status_code == 422:
            assert as_yaml.json()["problems"] == as_json.json()["problems"]
        seen.append(as_yaml.status_code)

    run()
    assert seen
