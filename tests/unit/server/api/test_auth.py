"""Who may call what: every route under every kind of credential (401 / 403 / 200)."""

from __future__ import annotations

import httpx
import pytest
from support.api import FinishedJob, bearer, snapshot

from dpfl.server.store import AgentStatus, CredentialKind, Store

pytestmark = pytest.mark.anyio

YAML = "name: by-client\nalgorithm: dp-fedavg\nprivacy: {target_epsilon: 2}\n"


def admin_routes(f: FinishedJob) -> list[tuple[str, str]]:
    job = f.job.id
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
        ("GET", f"/api/v1/jobs/{job}/privacy-audits"),
        ("GET", "/metrics"),
        ("GET", "/api/v1/agents"),
        ("GET", "/api/v1/audit"),
        ("POST", f"/api/v1/agents/{f.client_ids[-1]}/enable"),
        ("POST", f"/api/v1/agents/{f.client_ids[-1]}/disable"),
        ("POST", f"/api/v1/agents/{f.client_ids[-1]}/revoke"),
    ]


def own_routes(client_id: str) -> list[str]:
    return [
        f"/api/v1/clients/{client_id}",
        f"/api/v1/clients/{client_id}/budget",
        f"/api/v1/clients/{client_id}/history",
    ]


PUBLIC = ["/", "/healthz", "/readyz", "/api/v1/openapi.json", "/static/app.js"]


async def call(
    c: httpx.AsyncClient, method: str, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    if method == "POST" and path == "/api/v1/jobs":
        headers = {**(headers or {}), "Content-Type": "application/yaml"}
        return await c.post(path, content=YAML, headers=headers)
    return await c.request(method, path, headers=headers)


def all_protected(f: FinishedJob) -> list[tuple[str, str]]:
    me = f.client_ids[0]
    return admin_routes(f) + [("GET", p) for p in own_routes(me)]


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token abc",
        "Bearer dpfl_api_unknown-token-0123456789abcdef",
        "Bearer dpfl_agent_not-a-rest-token",
        "Bearer just-some-random-string",
    ],
)
async def test_no_or_unknown_token_is_401_on_every_protected_route(
    anon: httpx.AsyncClient, finished: FinishedJob, header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    for method, path in all_protected(finished):
        r = await call(anon, method, path, headers)
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
        body = r.json()
        assert body["code"] == "unauthenticated"
        assert "token" in body["detail"]
        secret = (header or "").partition(" ")[2].strip()
        if secret:
            assert secret not in body["detail"]  # never echoed back


async def test_admin_token_is_compared_exactly(
    anon: httpx.AsyncClient, admin_token: str, finished: FinishedJob
) -> None:
    for wrong in (admin_token[:-1], admin_token + "x", admin_token.upper(), "x" + admin_token):
        r = await anon.get("/api/v1/clients", headers=bearer(wrong))
        assert r.status_code == 401, wrong
    # the scheme is case-insensitive (RFC 7235), the token is not
    r = await anon.get("/api/v1/clients", headers={"Authorization": f"bearer {admin_token}"})
    assert r.status_code == 200


async def test_admin_may_use_every_route(admin: httpx.AsyncClient, finished: FinishedJob) -> None:
    for method, path in all_protected(finished):
        r = await call(admin, method, path)
        assert r.status_code not in (401, 403), (method, path, r.text)
    for other in finished.client_ids[1:]:
        for path in own_routes(other):
            assert (await admin.get(path)).status_code == 200


async def test_public_routes_need_no_token(anon: httpx.AsyncClient) -> None:
    for path in PUBLIC:
        r = await anon.get(path)
        assert r.status_code == 200, (path, r.text)


async def test_client_token_reads_only_its_own_records(
    anon: httpx.AsyncClient, finished: FinishedJob, store: Store, db_url: str
) -> None:
    me, other = finished.client_ids[0], finished.client_ids[1]
    mine = bearer(finished.api_token(me))
    for path in own_routes(me):
        r = await anon.get(path, headers=mine)
        assert r.status_code == 200, (path, r.text)
    body = (await anon.get(f"/api/v1/clients/{me}/budget", headers=mine)).json()
    assert body["client_id"] == me
    before = snapshot(db_url)
    for path in [*own_routes(other), *own_routes("agent-does-not-exist")]:
        r = await anon.get(path, headers=mine)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["code"] == "forbidden"
        assert me in r.json()["detail"]
    for method, path in admin_routes(finished):
        r = await call(anon, method, path, mine)
        assert r.status_code == 403, (method, path, r.text)
        assert "admin token" in r.json()["detail"]
    assert snapshot(db_url) == before  # the refused POSTs wrote nothing


async def test_revoked_token_and_disabled_client_are_401(
    anon: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    first, second = finished.client_ids[0], finished.client_ids[1]
    path = f"/api/v1/clients/{first}/budget"
    assert (await anon.get(path, headers=bearer(finished.api_token(first)))).status_code == 200
    store.revoke_credentials(first, kind=CredentialKind.API)
    assert (await anon.get(path, headers=bearer(finished.api_token(first)))).status_code == 401

    path = f"/api/v1/clients/{second}"
    store.set_agent_status(second, AgentStatus.DISABLED)
    r = await anon.get(path, headers=bearer(finished.api_token(second)))
    assert r.status_code == 401
    # a rotated token works again for the (re-enabled) client
    store.set_agent_status(second, AgentStatus.ACTIVE)
    fresh = store.issue_credential(second, kind=CredentialKind.API, rotate=True)
    assert (await anon.get(path, headers=bearer(fresh))).status_code == 200
    assert (await anon.get(path, headers=bearer(finished.api_token(second)))).status_code == 401
