"""The app as a whole: construction, the dashboard's static files, headers, the OpenAPI
document, unknown routes, and the job control seam."""

from __future__ import annotations

import re

import httpx
import pytest
from support.api import DEMO_PATH, FinishedJob, admin_settings, bearer

from dpfl.learning.jobs import JobSpecError
from dpfl.server.api import create_app
from dpfl.server.api.app import CONTENT_SECURITY_POLICY
from dpfl.server.api.routes.dashboard import STATIC_DIR
from dpfl.server.errors import CannotStart, InvalidTransition, NotFound
from dpfl.server.jobs_control import JobControl, StoreJobControl, submit_job
from dpfl.server.store import JobStatus, Store

pytestmark = pytest.mark.anyio

#: Anything that would make the browser contact another origin.
EXTERNAL = re.compile(r"""(https?:)?//(?!www\.w3\.org/2000/svg)[a-z0-9.-]+\.[a-z]{2,}""", re.I)


def test_create_app_needs_a_job_control(store: Store) -> None:
    with pytest.raises(TypeError, match="JobControl"):
        create_app(store=store, settings=admin_settings(), jobs=object())  # type: ignore[arg-type]
    assert isinstance(StoreJobControl(store), JobControl)


def test_two_apps_share_nothing(store: Store) -> None:
    a = create_app(store=store, settings=admin_settings(), jobs=StoreJobControl(store))
    b = create_app(store=store, settings=admin_settings(), jobs=StoreJobControl(store))
    assert a.state.metrics is not b.state.metrics
    assert a.state.metrics.registry is not b.state.metrics.registry
    assert a.state.health_checks is not b.state.health_checks


async def test_dashboard_is_served_locally_with_a_strict_policy(anon: httpx.AsyncClient) -> None:
    r = await anon.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    html = r.text
    assert '<script type="module" src="/static/app.js">' in html
    assert 'href="/static/style.css"' in html
    for name in ("app.js", "chart.js", "style.css", "index.html"):
        r = await anon.get(f"/static/{name}")
        assert r.status_code == 200, name
        assert r.text == (STATIC_DIR / name).read_text()
    for path in STATIC_DIR.iterdir():  # no asset refers to another origin
        assert not EXTERNAL.search(path.read_text()), path.name
    assert (await anon.get("/static/missing.js")).status_code == 404
    assert (await anon.get("/docs")).status_code == 404  # Swagger UI would load a CDN


async def test_openapi_documents_every_route_and_the_job_document(
    anon: httpx.AsyncClient,
) -> None:
    doc = (await anon.get("/api/v1/openapi.json")).json()
    assert set(doc["paths"]) == {
        "/api/v1/clients",
        "/api/v1/clients/{client_id}",
        "/api/v1/clients/{client_id}/budget",
        "/api/v1/clients/{client_id}/history",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/start",
        "/api/v1/jobs/{job_id}/stop",
        "/api/v1/jobs/{job_id}/rounds",
        "/api/v1/jobs/{job_id}/models",
        "/api/v1/jobs/{job_id}/models/{version}",
        "/api/v1/jobs/{job_id}/privacy-audits",
        "/api/v1/agents",
        "/api/v1/agents/{agent_id}/disable",
        "/api/v1/agents/{agent_id}/enable",
        "/api/v1/agents/{agent_id}/revoke",
        "/api/v1/audit",
        "/api/v1/dashboard/sessions",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    body = doc["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/JobDocument"}
    job_doc = doc["components"]["schemas"]["JobDocument"]
    assert job_doc["discriminator"]["propertyName"] == "algorithm"
    refs = re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', str(doc).replace("'", '"'))
    assert refs
    assert set(refs) <= set(doc["components"]["schemas"])
    assert "bearer" in doc["components"]["securitySchemes"]


async def test_unknown_routes_and_methods_answer_json(admin: httpx.AsyncClient) -> None:
    r = await admin.get("/api/v1/nothing")
    assert r.status_code == 404
    assert r.json() == {"detail": "no route '/api/v1/nothing'", "code": "not_found"}
    r = await admin.delete("/api/v1/clients")
    assert r.status_code == 405
    assert r.json()["detail"] == "method DELETE is not allowed on '/api/v1/clients'"


async def test_store_job_control_and_submit(empty_store: Store) -> None:
    store = empty_store
    job = submit_job(store, DEMO_PATH.read_text())
    assert job.status == JobStatus.PENDING
    with pytest.raises(JobSpecError):
        submit_job(store, "name: x\nalgorithm: nope\n")
    with pytest.raises(NotFound):
        submit_job(store, DEMO_PATH.read_text(), members=["agent-missing"])
    assert len(store.list_jobs()) == 1
    control = StoreJobControl(store)
    with pytest.raises(CannotStart, match="no agent is active"):
        await control.start(job.id)
    for i in range(3):
        store.create_agent(name=f"silo-{i}")
    with pytest.raises(CannotStart, match=r"on 3 agents .*needs at least 4 agents"):
        await control.start(job.id)
    refused = store.get_job(job.id)
    assert refused.status == JobStatus.PENDING
    assert refused.error is not None
    assert "needs at least 4 agents" in refused.error
    assert store.job_members(job.id) == []
    store.create_agent(name="silo-3")
    started = await control.start(job.id)
    assert started.status == JobStatus.RUNNING
    assert started.error is None
    assert len(store.job_members(job.id)) == 4
    assert (await control.stop(job.id)).status == JobStatus.STOPPED
    store.set_job_status(job.id, JobStatus.FAILED, error="boom")
    with pytest.raises(InvalidTransition):
        await control.start(job.id)
    with pytest.raises(NotFound):
        await control.stop("job-missing")


@pytest.mark.slow
async def test_every_route_on_both_backends(
    backend_admin: tuple[httpx.AsyncClient, Store, FinishedJob],
) -> None:
    """Each route once, with the admin token, on SQLite and PostgreSQL; the answers agree with
    the store."""
    c, store, finished = backend_admin
    job, me = finished.job.id, finished.client_ids[0]
    for path in ("/healthz", "/readyz", "/", "/api/v1/openapi.json", "/static/chart.js"):
        assert (await c.get(path)).status_code == 200, path
    assert "dpfl_client_epsilon_max" in (await c.get("/metrics")).text
    clients = (await c.get("/api/v1/clients")).json()
    assert {x["id"] for x in clients} == set(finished.client_ids)
    assert (await c.get(f"/api/v1/clients/{me}")).json()["jobs"] == sorted(store.agent_jobs(me))
    budget = (await c.get(f"/api/v1/clients/{me}/budget")).json()
    assert budget["epsilon"] == pytest.approx(store.client_budget(me).epsilon, rel=1e-12)
    history = (await c.get(f"/api/v1/clients/{me}/history")).json()
    assert history["points"][-1]["epsilon"] == pytest.approx(budget["epsilon"], rel=1e-9)
    own = bearer(finished.api_token(me))
    assert (await c.get(f"/api/v1/clients/{me}/budget", headers=own)).json() == budget
    other = finished.client_ids[1]
    assert (await c.get(f"/api/v1/clients/{other}", headers=own)).status_code == 403
    assert len((await c.get("/api/v1/jobs")).json()) == 2
    assert (await c.get(f"/api/v1/jobs/{job}")).json()["status"] == "completed"
    assert len((await c.get(f"/api/v1/jobs/{job}/rounds")).json()) == 4
    assert len((await c.get(f"/api/v1/jobs/{job}/models")).json()) == 4
    r = await c.get(f"/api/v1/jobs/{job}/models/3")
    assert r.content == store.get_model_version(job, 3).data
    created = await c.post("/api/v1/jobs", content=DEMO_PATH.read_text())
    assert created.status_code == 201
    new = created.json()["id"]
    assert (await c.post(f"/api/v1/jobs/{new}/start")).json()["status"] == "running"
    assert (await c.post(f"/api/v1/jobs/{new}/stop")).json()["status"] == "stopped"
    assert (await c.post(f"/api/v1/jobs/{job}/stop")).status_code == 409
    assert store.get_job(new).status == JobStatus.STOPPED
