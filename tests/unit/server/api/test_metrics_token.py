"""The read-only metrics token (``DPFL_METRICS_TOKEN``): ``/metrics`` answers it and the admin
token, and nothing else answers it; every auth case, on SQLite and PostgreSQL."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
from support.api import FinishedJob, bearer, build_finished_job, make_app

from dpfl.server.settings import Settings
from dpfl.server.store import Store

pytestmark = pytest.mark.anyio

BASE = "http://testserver"
Federation = tuple[httpx.AsyncClient, FinishedJob, str, str]


def other_routes(f: FinishedJob) -> list[tuple[str, str]]:
    """Every protected route but /metrics (admin-only and a client's own)."""
    job, me = f.job.id, f.client_ids[0]
    return [
        ("GET", "/api/v1/clients"),
        ("GET", "/api/v1/jobs"),
        ("POST", "/api/v1/jobs"),
        ("GET", f"/api/v1/jobs/{job}"),
        ("POST", f"/api/v1/jobs/{job}/start"),
        ("POST", f"/api/v1/jobs/{job}/stop"),
        ("GET", f"/api/v1/jobs/{job}/rounds"),
        ("GET", f"/api/v1/jobs/{job}/models"),
        ("GET", f"/api/v1/jobs/{job}/models/0"),
        ("GET", f"/api/v1/clients/{me}"),
        ("GET", f"/api/v1/clients/{me}/budget"),
        ("GET", f"/api/v1/clients/{me}/history"),
    ]


@pytest.fixture
async def federation(backend_store: Store) -> AsyncIterator[Federation]:
    """(anonymous client, finished job, admin token, metrics token) over ``backend_url``."""
    finished = build_finished_job(backend_store)
    admin, metrics = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    app = make_app(backend_store, settings=Settings(admin_token=admin, metrics_token=metrics))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c, finished, admin, metrics


async def test_metrics_route_under_every_credential(federation: Federation) -> None:
    c, finished, admin, metrics = federation
    assert (await c.get("/metrics")).status_code == 401  # no token
    wrong = await c.get("/metrics", headers=bearer(secrets.token_urlsafe(32)))
    assert wrong.status_code == 401
    assert wrong.json()["code"] == "unauthenticated"
    by_metrics = await c.get("/metrics", headers=bearer(metrics))
    assert by_metrics.status_code == 200
    assert "dpfl_client_epsilon_max" in by_metrics.text
    assert by_metrics.headers["cache-control"] == "no-store"
    assert (await c.get("/metrics", headers=bearer(admin))).status_code == 200
    client = await c.get("/metrics", headers=bearer(finished.api_token(finished.client_ids[0])))
    assert client.status_code == 403
    assert "DPFL_METRICS_TOKEN" in client.json()["detail"]


async def test_the_metrics_token_reads_nothing_else(federation: Federation) -> None:
    c, finished, _, metrics = federation
    for method, path in other_routes(finished):
        headers = {**bearer(metrics), "Content-Type": "application/yaml"}
        r = await c.request(method, path, headers=headers, content="name: x\n")
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["detail"] == "the metrics token may read only /metrics"


async def test_without_a_metrics_token_metrics_needs_the_admin(
    federation: Federation, backend_store: Store
) -> None:
    app = make_app(backend_store, settings=Settings(admin_token=secrets.token_urlsafe(32)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as other:
        r = await other.get("/metrics", headers=bearer("dpfl_api_x" + secrets.token_urlsafe(16)))
        assert r.status_code == 401
        admin = app.state.settings.admin_token.get_secret_value()
        assert (await other.get("/metrics", headers=bearer(admin))).status_code == 200
