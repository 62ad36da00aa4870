"""``/api/v1/agents`` and ``/api/v1/audit`` on SQLite and PostgreSQL: every kind of credential,
and what each action records (the live effect on sessions is tested in
``tests/integration/test_revocation.py``)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI
from support.api import FinishedJob, bearer, build_finished_job, make_app

from dpfl.server.store import AgentStatus, Store

pytestmark = pytest.mark.anyio

BASE = "http://testserver"


def routes(target: str) -> list[tuple[str, str]]:
    return [
        ("GET", "/api/v1/agents"),
        ("GET", "/api/v1/audit"),
        ("GET", f"/api/v1/audit?agent_id={target}"),
        ("POST", f"/api/v1/agents/{target}/disable"),
        ("POST", f"/api/v1/agents/{target}/enable"),
        ("POST", f"/api/v1/agents/{target}/revoke"),
    ]


async def test_every_credential_on_every_agent_route(backend_store: Store) -> None:
    finished: FinishedJob = build_finished_job(backend_store)
    app: FastAPI = make_app(backend_store)
    admin = app.state.settings.admin_token.get_secret_value()
    me, target = finished.client_ids[0], finished.client_ids[-1]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        cases = {
            "none": ({}, 401),
            "wrong": (bearer(admin + "x"), 401),
            "agent": (bearer(finished.api_token(me)), 403),
            "agent credential": (bearer("dpfl_agent_" + "x" * 40), 401),
        }
        for name, (headers, status) in cases.items():
            for method, path in routes(target):
                r = await c.request(method, path, headers=headers)
                assert r.status_code == status, (name, method, path, r.text)
        # nothing changed, nothing was audited
        assert backend_store.get_agent(target).status == AgentStatus.ACTIVE
        assert backend_store.audit_records() == []

        ok = bearer(admin)
        listed = (await c.get("/api/v1/agents", headers=ok)).json()
        assert {a["id"] for a in listed} == set(finished.client_ids)
        assert {a["status"] for a in listed} == {"active"}
        before = datetime.now(UTC)
        r = await c.post(
            f"/api/v1/agents/{target}/disable", headers=ok, json={"reason": "lost laptop"}
        )
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "disabled"
        assert backend_store.get_agent(target).status == AgentStatus.DISABLED
        assert (await c.post(f"/api/v1/agents/{target}/enable", headers=ok)).json()[
            "status"
        ] == "active"
        r = await c.post(f"/api/v1/agents/{target}/revoke", headers=ok)
        assert r.json()["status"] == "revoked"
        # a revocation is final; an unknown agent is 404; a bad body is 422
        assert (await c.post(f"/api/v1/agents/{target}/enable", headers=ok)).status_code == 409
        assert (await c.post("/api/v1/agents/agent-nope/disable", headers=ok)).status_code == 404
        bad = await c.post(f"/api/v1/agents/{me}/disable", headers=ok, json={"why": "x"})
        assert bad.status_code == 422
        # the revoked agent's REST token no longer works
        r = await c.get(f"/api/v1/clients/{target}", headers=bearer(finished.api_token(target)))
        assert r.status_code == 401
        audit = (await c.get(f"/api/v1/audit?agent_id={target}", headers=ok)).json()
        assert [a["action"] for a in audit] == ["agent.disable", "agent.enable", "agent.revoke"]
        for record in audit:
            assert record["actor"].startswith("admin (REST from ")
            assert datetime.fromisoformat(record["at"]) >= before.replace(microsecond=0)
            assert record["agent_id"] == target
        assert "reason: lost laptop" in audit[0]["detail"]
        assert "secrets revoked" in audit[2]["detail"]
        everything = (await c.get("/api/v1/audit?limit=1", headers=ok)).json()
        assert [a["action"] for a in everything] == ["agent.revoke"]
