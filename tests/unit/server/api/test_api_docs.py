"""``/api/docs``: Swagger UI over the OpenAPI document, every file served by the coordinator
itself (no CDN) under the dashboard's Content-Security-Policy."""

from __future__ import annotations

import re

import httpx
import pytest

from dpfl.server.api.app import CONTENT_SECURITY_POLICY

pytestmark = pytest.mark.anyio


async def test_the_page_and_everything_it_loads_come_from_this_origin(
    anon: httpx.AsyncClient,
) -> None:
    page = await anon.get("/api/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "<script>" not in page.text  # no inline script: script-src 'self' forbids it
    assert "style=" not in page.text
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert len(refs) == 4
    refs.remove("data:,")  # no favicon request
    for ref in refs:
        assert ref.startswith("/"), ref  # same origin, no CDN
        asset = await anon.get(ref)
        assert asset.status_code == 200, ref
        assert asset.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    init = await anon.get("/static/api-docs.js")
    assert "/api/v1/openapi.json" in init.text
    assert "validatorUrl: null" in init.text  # the online validator would leave the origin
    bundle = await anon.get("/api/docs/assets/swagger-ui-bundle.js")
    assert bundle.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert len(bundle.content) > 500_000  # the real Swagger UI, from the installed package


async def test_the_document_it_shows_is_public_and_the_routes_stay_protected(
    anon: httpx.AsyncClient,
) -> None:
    doc = await anon.get("/api/v1/openapi.json")
    assert doc.status_code == 200
    assert "/api/v1/jobs" in doc.json()["paths"]
    assert "/api/docs" not in doc.json()["paths"]
    assert (await anon.get("/api/v1/clients")).status_code == 401


async def test_only_the_two_swagger_files_are_served(anon: httpx.AsyncClient) -> None:
    for name in ("swagger-editor-bundle.js", "index.html", "..%2F__init__.py", "LICENSE"):
        r = await anon.get(f"/api/docs/assets/{name}")
        assert r.status_code == 404, name
