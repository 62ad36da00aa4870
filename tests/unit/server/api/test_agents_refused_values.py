"""Text a database cannot hold, sent to the agents' routes: 422 naming the field, on SQLite and
PostgreSQL alike (issue 29, item 2: ``{"reason": "a\\u0000b"}`` was a 500 with a psycopg
traceback on PostgreSQL, and no audit record); and text that would display as other text
(item 6: control and format characters, such as U+202E, in a reason or a job's name)."""

from __future__ import annotations

import httpx
import pytest
from support.api import FinishedJob

from dpfl.server.store import AgentStatus, Store

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ('{"reason": "a\\u0000b"}', "U+0000"),
        ('{"reason": "a\\ud800b"}', "unicode"),  # pydantic's own refusal
        ('{"reason": "a\\u202eb"}', "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ('{"reason": "a\\u001bb"}', "U+001B ESCAPE"),
    ],
)
async def test_a_refused_reason_is_422_and_changes_nothing(
    backend_admin: tuple[httpx.AsyncClient, Store, FinishedJob], body: str, code: str
) -> None:
    client, store, finished = backend_admin
    target = finished.client_ids[0]
    for action in ("disable", "revoke", "enable"):
        r = await client.post(
            f"/api/v1/agents/{target}/{action}",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 422, r.text
        answer = r.json()
        assert answer["code"] == "invalid_request"
        assert "body field 'reason'" in answer["detail"]
        assert code in answer["detail"]
    assert store.get_agent(target).status == AgentStatus.ACTIVE
    assert store.audit_records() == []
    # a reason with line breaks and tabs is text like any other
    r = await client.post(f"/api/v1/agents/{target}/disable", json={"reason": "lost\n\tlaptop"})
    assert r.status_code == 200, r.text
    assert store.audit_records()[-1].detail.endswith("reason: lost\n\tlaptop")


async def test_a_job_name_with_a_control_character_is_422(
    backend_admin: tuple[httpx.AsyncClient, Store, FinishedJob],
) -> None:
    client, store, _ = backend_admin
    jobs = [j.id for j in store.list_jobs()]
    # the job document's pattern ends in "$", which also matches before a final line feed
    document = {"name": "demo\n", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}}
    r = await client.post("/api/v1/jobs", json=document)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("job name: character U+000A LINE FEED")
    assert [j.id for j in store.list_jobs()] == jobs
