"""Probes and Prometheus metrics: ``/healthz``, ``/readyz``, ``/metrics`` after a job, and the
``Metrics`` object the orchestrator feeds."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import httpx
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.api import FinishedJob, bearer, make_app

from dpfl.server.metrics import Metrics, MetricsError
from dpfl.server.store import STAGES, Store, open_store

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_after_a_job(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store, metrics: Metrics
) -> None:
    rounds = [r for job in (finished.job, finished.pate_job) for r in store.list_rounds(job.id)]
    for rnd in rounds:  # what the orchestrator reports as each round ends
        metrics.observe_round(rnd)
    metrics.agents_connected(4)
    r = await admin.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    got = samples(r.text)
    job, pate = finished.job.id, finished.pate_job.id
    assert got[("dpfl_rounds_completed_total", (("job_id", job),))] == 3
    assert got[("dpfl_rounds_aborted_total", (("job_id", job),))] == 1
    assert got[("dpfl_rounds_completed_total", (("job_id", pate),))] == 1
    assert ("dpfl_rounds_aborted_total", (("job_id", pate),)) not in got
    for stage in STAGES:
        timed = [rnd.stage_seconds[stage] for rnd in rounds if stage in rnd.stage_seconds]
        key = (("stage", stage),)
        if not timed:  # a stage these jobs never run (consistency: malicious-secure rounds)
            assert got.get(("dpfl_stage_latency_seconds_count", key), 0) == 0
            continue
        assert got[("dpfl_stage_latency_seconds_count", key)] == len(timed)
        assert got[("dpfl_stage_latency_seconds_sum", key)] == pytest.approx(sum(timed))
        inf_bucket = (("le", "+Inf"), ("stage", stage))
        assert got[("dpfl_stage_latency_seconds_bucket", inf_bucket)] == len(timed)
    assert got[("dpfl_agents_connected", ())] == 4
    spent = [store.client_budget(a).epsilon for a in finished.client_ids]
    assert got[("dpfl_client_epsilon_max", ())] == pytest.approx(max(spent), rel=1e-12)
    assert got[("dpfl_clients", ())] == 5
    assert got[("dpfl_clients_over_budget", ())] == 0
    assert got[("dpfl_jobs", (("status", "completed"),))] == 2
    assert got[("dpfl_jobs", (("status", "running"),))] == 0
    assert got[("dpfl_store_up", ())] == 1
    # the privacy gauges follow the ledger without being pushed: a new client shows up
    store.create_agent(name="late")
    again = samples((await admin.get("/metrics")).text)
    assert again[("dpfl_clients", ())] == 6


def test_each_metrics_object_has_its_own_registry(store: Store) -> None:
    a, b = Metrics(store=store), Metrics()
    a.round_finished("job-1", True)
    a.agents_connected(3)
    assert a.registry.get_sample_value("dpfl_rounds_completed_total", {"job_id": "job-1"}) == 1
    assert b.registry.get_sample_value("dpfl_rounds_completed_total", {"job_id": "job-1"}) is None
    assert b.registry.get_sample_value("dpfl_agents_connected") == 0
    assert prometheus_client.REGISTRY.get_sample_value("dpfl_agents_connected") is None
    assert b"dpfl_client_epsilon_max" not in b.render()  # no store: no privacy gauges
    assert b"dpfl_client_epsilon_max" in a.render()


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda m: m.stage_latency("bogus", 1.0), "unknown stage 'bogus'"),
        (lambda m: m.stage_latency("unmask", -1.0), "finite and >= 0"),
        (lambda m: m.stage_latency("unmask", math.nan), "finite and >= 0"),
        (lambda m: m.stage_latency("unmask", "1"), "must be a number"),
        (lambda m: m.agents_connected(-1), "int >= 0"),
        (lambda m: m.agents_connected(True), "int >= 0"),
        (lambda m: m.round_finished("", True), "non-empty string"),
    ],
)
def test_impossible_updates_are_refused(call: object, says: str) -> None:
    m = Metrics()
    with pytest.raises(MetricsError, match=says):
        call(m)  # type: ignore[operator]
    assert b"dpfl_stage_latency_seconds_count" not in m.render()


def test_stage_latency_accepts_the_whole_round(store: Store) -> None:
    m = Metrics()
    m.stage_latency("round", 2.5)
    m.stage_latency("masked_input", 0)
    assert m.registry.get_sample_value("dpfl_stage_latency_seconds_sum", {"stage": "round"}) == 2.5


async def test_healthz_reflects_registered_checks(anon: httpx.AsyncClient, app: object) -> None:
    r = await anon.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "checks": {}}
    checks = app.state.health_checks  # type: ignore[attr-defined]
    checks["grpc"] = lambda: True
    assert (await anon.get("/healthz")).json() == {"status": "ok", "checks": {"grpc": True}}
    checks["grpc"] = lambda: False
    checks["broken"] = lambda: 1 / 0
    r = await anon.get("/healthz")
    assert r.status_code == 503
    assert r.json() == {"detail": "not serving: broken, grpc", "code": "unavailable"}


async def test_readyz_and_metrics_when_the_database_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    store = open_store(f"sqlite:///{folder / 'dpfl.db'}")
    app = make_app(store)
    headers = bearer(app.state.settings.admin_token.get_secret_value())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/readyz")
        assert r.status_code == 200
        assert r.json()["checks"] == {"database": True}
        store.close()
        shutil.rmtree(folder)
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["detail"].startswith("database unreachable")
        assert (await c.get("/healthz")).status_code == 200  # the process itself still serves
        r = await c.get("/metrics", headers=headers)
        assert r.status_code == 200
        assert samples(r.text)[("dpfl_store_up", ())] == 0
