"""``/api/v1/clients``: every figure equals what the store's ledger reports."""

from __future__ import annotations

import math

import httpx
import pytest
from support.api import (
    FEDAVG_EVENT,
    PATE_EVENT,
    FinishedJob,
    bearer,
    make_app,
)

from dpfl.accounting import GaussianEvent, event_to_json
from dpfl.learning.jobs import parse_job
from dpfl.server.store import Charge, JobStatus, ProtectedUnit, Store

pytestmark = pytest.mark.anyio

ISSUE_5_KEYS = {"client_id", "epsilon", "delta", "budget_epsilon", "remaining_epsilon"}


async def test_list_reports_every_client_with_spent_and_remaining(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    r = await admin.get("/api/v1/clients")
    assert r.status_code == 200
    assert r.headers["cache-control"] == "no-store"
    rows = {c["id"]: c for c in r.json()}
    assert set(rows) == set(finished.client_ids)
    for client_id, row in rows.items():
        b = store.client_budget(client_id)
        agent = store.get_agent(client_id)
        assert row["name"] == agent.name
        assert row["epsilon"] == pytest.approx(b.epsilon, rel=1e-12)
        assert row["delta"] == b.delta
        assert row["remaining_epsilon"] == (
            None if b.remaining_epsilon is None else pytest.approx(b.remaining_epsilon)
        )
        assert row["exceeded"] is False
        if agent.budget is None:
            assert row["budget"] is None
        else:
            assert row["budget"] == {"epsilon": agent.budget.epsilon, "delta": agent.budget.delta}
            assert row["epsilon"] + row["remaining_epsilon"] == pytest.approx(agent.budget.epsilon)
    # at an explicit δ every client is measured there, and a smaller δ costs more ε
    small = {c["id"]: c for c in (await admin.get("/api/v1/clients?delta=1e-9")).json()}
    for client_id, row in small.items():
        assert row["delta"] == 1e-9
        assert row["epsilon"] == pytest.approx(store.client_budget(client_id, delta=1e-9).epsilon)
        assert row["epsilon"] > rows[client_id]["epsilon"] or rows[client_id]["delta"] < 1e-9


async def test_get_client_has_its_jobs(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    first, last = finished.client_ids[0], finished.client_ids[-1]
    body = (await admin.get(f"/api/v1/clients/{first}")).json()
    assert body["id"] == first
    assert sorted(body["jobs"]) == sorted([finished.job.id, finished.pate_job.id])
    assert body["labels"] == {"site": "s0"}
    assert body["status"] == "active"
    body = (await admin.get(f"/api/v1/clients/{last}")).json()
    assert body["jobs"] == [finished.job.id]
    assert body["budget"] is None
    assert body["remaining_epsilon"] is None


async def test_budget_report_matches_the_ledger(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    client_id = finished.client_ids[0]  # charged by both jobs
    r = await admin.get(f"/api/v1/clients/{client_id}/budget", params={"delta": 1e-6})
    assert r.status_code == 200
    body = r.json()
    assert ISSUE_5_KEYS | {"events", "by_job"} <= set(body)
    b = store.client_budget(client_id, delta=1e-6)
    assert body["client_id"] == client_id
    assert body["delta"] == 1e-6
    assert body["epsilon"] == pytest.approx(b.epsilon, rel=1e-12)
    # DP-FedAvg and agent-level PATE-FL (both add/remove one agent) compose tightly; the
    # relation-agnostic figure is larger
    assert body["replace_one_epsilon"] == pytest.approx(b.replace_one_epsilon, rel=1e-12)
    assert body["replace_one_epsilon"] > body["epsilon"]
    assert body["method"] == "pld"
    assert body["epsilon"] < body["rdp_epsilon"]
    assert body["budget_epsilon"] == 4.5
    assert body["budget_delta"] == 1e-5
    # remaining is measured at the budget's own δ, not at the report's
    assert body["remaining_epsilon"] == pytest.approx(4.5 - store.client_budget(client_id).epsilon)
    assert set(body["by_job"]) == {finished.job.id, finished.pate_job.id}
    for job_id, j in body["by_job"].items():
        assert j["epsilon"] == pytest.approx(b.by_job[job_id].epsilon, rel=1e-12)
        assert j["entries"] == b.by_job[job_id].entries
    assert body["by_job"][finished.job.id]["entries"] == 3  # the aborted attempt charged nothing
    # the total composes the jobs' curves: more than either alone, less than their sum
    eps = [j["epsilon"] for j in body["by_job"].values()]
    assert max(eps) < body["epsilon"] < sum(eps)
    events = body["events"]
    assert [e["id"] for e in events] == [e.entry.id for e in b.events]
    kinds = {e["job_id"]: e["event"] for e in events}
    assert kinds[finished.job.id] == event_to_json(FEDAVG_EVENT)
    assert kinds[finished.pate_job.id] == event_to_json(PATE_EVENT)
    for e, report in zip(events, b.events, strict=True):
        assert e["epsilon"] == pytest.approx(report.epsilon, rel=1e-12)
        assert e["method"] == "rdp"
        assert e["unit"] in ("agent", "record")
        assert e["algorithm"] in ("dp-fedavg", "pate-fl")
        assert e["round_number"] >= 1


async def test_tight_budget_is_never_larger(
    admin: httpx.AsyncClient, finished: FinishedJob
) -> None:
    client_id = finished.client_ids[3]
    path = f"/api/v1/clients/{client_id}/budget"
    plain = (await admin.get(path)).json()
    tight = (await admin.get(path, params={"tight": "true"})).json()
    assert tight == plain  # every figure is the tight composition already
    assert plain["method"] == "pld"
    assert plain["epsilon"] <= plain["rdp_epsilon"]
    assert plain["epsilon_at_budget_delta"] == pytest.approx(plain["epsilon"])


async def test_history_ends_at_the_total(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    for client_id in finished.client_ids:
        body = (await admin.get(f"/api/v1/clients/{client_id}/history")).json()
        b = store.client_budget(client_id)
        assert body["delta"] == b.delta
        points = body["points"]
        assert len(points) == len(store.ledger_entries(agent_id=client_id))
        eps = [p["epsilon"] for p in points]
        assert eps == sorted(eps)  # privacy loss only grows
        assert eps[-1] == pytest.approx(b.epsilon, rel=1e-9)
        by_job: dict[str, float] = {}
        for p in points:
            by_job[p["job_id"]] = p["job_epsilon"]
            assert p["job_epsilon"] <= p["epsilon"] + 1e-12
        for job_id, last in by_job.items():
            # the history composes the same events as the job's reported figure
            assert last == pytest.approx(b.by_job[job_id].epsilon, rel=1e-9)
            assert last <= b.by_job[job_id].rdp_epsilon
        assert [p["round_number"] for p in points if p["job_id"] == finished.job.id] == [1, 2, 3]
        assert [p["attempt"] for p in points if p["job_id"] == finished.job.id] == [1, 1, 2]


async def test_a_client_without_charges_has_an_empty_history(
    admin: httpx.AsyncClient, store: Store, finished: FinishedJob
) -> None:
    fresh = store.create_agent(name="newcomer")
    body = (await admin.get(f"/api/v1/clients/{fresh.id}/history")).json()
    assert body == {"client_id": fresh.id, "delta": 1e-5, "points": []}
    budget = (await admin.get(f"/api/v1/clients/{fresh.id}/budget")).json()
    assert budget["epsilon"] == 0.0
    assert budget["replace_one_epsilon"] == 0.0
    assert budget["events"] == []
    assert budget["by_job"] == {}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # induced on purpose
async def test_an_unbounded_client_reads_infinity(empty_store: Store) -> None:
    """A ledger whose curves overflow has no finite bound: ε is sent as "Infinity", never as a
    made-up number or a 500."""
    store = empty_store
    agent = store.create_agent(name="leaky")
    spec = parse_job({"name": "j", "algorithm": "dp-fedavg", "privacy": {"noise_multiplier": 1}})
    job = store.create_job(spec, members=[agent.id])
    store.set_job_status(job.id, JobStatus.RUNNING)
    tiny = GaussianEvent(sigma=1 / 1.3e154)  # RDP ≈ 1e308·α per round: the sum overflows
    for number in (1, 2, 3):
        rnd = store.start_round(job.id, number, invited=[agent.id])
        store.update_round(rnd.id, accepted=[agent.id])
        store.commit_round(rnd.id, [Charge(agent.id, tiny, ProtectedUnit.AGENT)])
    assert store.client_budget(agent.id).epsilon == math.inf
    app = make_app(store)
    token = app.state.settings.admin_token.get_secret_value()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", headers=bearer(token)
    ) as c:
        assert (await c.get("/api/v1/clients")).json()[0]["epsilon"] == "Infinity"
        budget = (await c.get(f"/api/v1/clients/{agent.id}/budget")).json()
        assert budget["epsilon"] == "Infinity"
        assert budget["order"] is None
        history = (await c.get(f"/api/v1/clients/{agent.id}/history")).json()
        assert history["points"][-1]["epsilon"] == "Infinity"
        rounds = (await c.get(f"/api/v1/jobs/{job.id}/rounds")).json()
        assert rounds[-1]["epsilon"] == "Infinity"
        assert "dpfl_client_epsilon_max +Inf" in (await c.get("/metrics")).text


@pytest.mark.parametrize("delta", ["0", "1", "-0.5", "2", "abc", "nan", "inf"])
async def test_bad_delta_is_422_naming_it(
    admin: httpx.AsyncClient, finished: FinishedJob, delta: str
) -> None:
    client_id = finished.client_ids[0]
    for path in ("", f"/{client_id}", f"/{client_id}/budget", f"/{client_id}/history"):
        r = await admin.get(f"/api/v1/clients{path}", params={"delta": delta})
        assert r.status_code == 422, (path, delta, r.text)
        assert "query parameter 'delta'" in r.json()["detail"]


async def test_unknown_or_malformed_client(admin: httpx.AsyncClient, finished: FinishedJob) -> None:
    for suffix in ("", "/budget", "/history"):
        r = await admin.get(f"/api/v1/clients/agent-0000000000000000{suffix}")
        assert r.status_code == 404
        assert r.json() == {
            "detail": "agent 'agent-0000000000000000' not found",
            "code": "not_found",
        }
        r = await admin.get(f"/api/v1/clients/bad%20id!{suffix}")
        assert r.status_code == 422
        assert "path parameter 'client_id'" in r.json()["detail"]
