"""``/api/v1/jobs``: submission validated exactly like ``dpfl-coordinator job submit``, bad
documents refused with their problems named and nothing written; listing, details, start/stop."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from support.api import FinishedJob, snapshot
from support.paths import ROOT

from dpfl.learning.jobs import JobSpecError, job_to_dict, parse_job
from dpfl.server.api.routes.jobs import MAX_JOB_BYTES
from dpfl.server.orchestrator.state import plan_record
from dpfl.server.store import ROUND_SETUP_VERSION, AgentStatus, JobStatus, RoundSetup, Store

pytestmark = pytest.mark.anyio

DEMO = (ROOT / "examples" / "demo-dpfedavg.yaml").read_text()
PATE = (ROOT / "examples" / "demo-pate-fl.yaml").read_text()
YAML = "application/yaml"

#: (body, content type, what the error must say), each refused by parse_job itself
BAD_DOCUMENTS = [
    ("name: x\nalgorithm: [dp-fedavg\n", YAML, "invalid YAML at line"),
    ("name: x\nalgorithm: dp-magic\n", YAML, "unknown algorithm 'dp-magic'"),
    (
        "name: x\nalgorithm: dp-fedavg\nprivacy: {target_epsilon: -1}\n",
        YAML,
        "privacy.target_epsilon: must be > 0 (got -1)",
    ),
    (
        "name: x\nalgorithm: dp-fedavg\nprivacy: {noise_multiplier: 1}\ncolour: red\n",
        YAML,
        "colour: unknown field",
    ),
    (
        "name: x\nalgorithm: dp-fedavg\nprivacy: {noise_multiplier: 1}\nparams: {clipp: 1}\n",
        YAML,
        "params.clipp: unknown field",
    ),
    ("algorithm: dp-fedavg\nprivacy: {noise_multiplier: 1}\n", YAML, "name: required field"),
    ("name: x\nalgorithm: dp-fedavg\n", YAML, "privacy: set privacy.noise_multiplier"),
    ("name: x\nalgorithm: pate-fl\nparams: {sigma: 40}\n", YAML, "data.public: pate-fl needs"),
    ("", YAML, "empty document"),
    ("- a\n- b\n", YAML, "must be a mapping"),
    ('{"name": "x", "algorithm": ', "application/json", "invalid JSON at line 1"),
    ("[1, 2]", "application/json", "must be a JSON object"),
    ("name: x\nalgorithm: dp-fedavg\n", "application/json", "invalid JSON"),
    (
        json.dumps({"name": "x", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": -2}}),
        "application/json",
        "privacy.target_epsilon: must be > 0",
    ),
]


async def test_bad_documents_are_422_and_write_nothing(
    backend_admin: tuple[httpx.AsyncClient, Store, FinishedJob], backend_url: str
) -> None:
    """Every document of BAD_DOCUMENTS, on SQLite and PostgreSQL (one store each: building the
    finished job dominates the time)."""
    client, store, _ = backend_admin
    before = snapshot(backend_url)
    for body, media, says in BAD_DOCUMENTS:
        r = await client.post("/api/v1/jobs", content=body, headers={"Content-Type": media})
        assert r.status_code == 422, (body, r.text)
        error = r.json()
        assert error["code"] == "invalid_job"
        assert says in error["detail"], (body, error)
        assert error["problems"]
        assert all(isinstance(p, str) for p in error["problems"])
        if media == YAML:  # the same verdict, word for word, as the submit command's parse_job
            with pytest.raises(JobSpecError) as exc:
                parse_job(body)
            assert error["problems"] == list(exc.value.problems)
    assert snapshot(backend_url) == before
    assert len(store.list_jobs()) == 2


async def test_other_bad_bodies(admin: httpx.AsyncClient, db_url: str) -> None:
    before = snapshot(db_url)
    r = await admin.post("/api/v1/jobs", content="<job/>", headers={"Content-Type": "text/xml"})
    assert r.status_code == 415
    assert "unsupported content type 'text/xml'" in r.json()["detail"]
    big = "name: x\nalgorithm: dp-fedavg\n# " + "x" * MAX_JOB_BYTES + "\n"
    r = await admin.post("/api/v1/jobs", content=big, headers={"Content-Type": YAML})
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"
    r = await admin.post("/api/v1/jobs", content=b"name: \xff\xfe", headers={"Content-Type": YAML})
    assert r.status_code == 422
    assert "not UTF-8" in r.json()["detail"]
    assert snapshot(db_url) == before


@pytest.mark.parametrize(
    ("text", "media"),
    [
        (DEMO, YAML),
        (DEMO, "text/yaml; charset=utf-8"),
        (DEMO, None),
        (PATE, "application/x-yaml"),
        (json.dumps(job_to_dict(parse_job(DEMO))), "application/json"),
    ],
)
async def test_submit_stores_the_validated_document(
    admin: httpx.AsyncClient, store: Store, text: str, media: str | None
) -> None:
    headers = {} if media is None else {"Content-Type": media}
    r = await admin.post("/api/v1/jobs", content=text, headers=headers)
    assert r.status_code == 201, r.text
    body = r.json()
    assert r.headers["location"] == f"/api/v1/jobs/{body['id']}"
    stored = store.get_job(body["id"])
    assert stored.status == JobStatus.PENDING
    assert body["spec"] == stored.spec == job_to_dict(parse_job(text))
    assert body["status"] == "pending"
    assert body["members"] == []
    assert body["epsilons"] == {}
    assert body["rounds"] == parse_job(text).rounds


async def test_list_and_get(admin: httpx.AsyncClient, finished: FinishedJob, store: Store) -> None:
    jobs = (await admin.get("/api/v1/jobs")).json()
    assert [j["id"] for j in jobs] == [finished.job.id, finished.pate_job.id]
    assert {j["status"] for j in jobs} == {"completed"}
    assert (await admin.get("/api/v1/jobs", params={"status": "running"})).json() == []
    r = await admin.get("/api/v1/jobs", params={"status": "finished"})
    assert r.status_code == 422
    assert "query parameter 'status'" in r.json()["detail"]

    body = (await admin.get(f"/api/v1/jobs/{finished.job.id}")).json()
    assert body["algorithm"] == "dp-fedavg"
    assert body["rounds"] == 3
    assert body["members"] == sorted(finished.client_ids)
    assert body["epsilons"] == pytest.approx(store.job_epsilons(finished.job.id))
    assert body["started_at"] is not None
    assert body["finished_at"] is not None
    r = await admin.get("/api/v1/jobs/job-unknown")
    assert r.status_code == 404
    assert r.json()["detail"] == "job 'job-unknown' not found"


async def test_start_and_stop_follow_the_life_cycle(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    job_id = (await admin.post("/api/v1/jobs", content=DEMO)).json()["id"]
    steps = [("start", "running"), ("start", "running"), ("stop", "stopped"), ("stop", "stopped")]
    for action, status in [*steps, ("start", "running")]:
        r = await admin.post(f"/api/v1/jobs/{job_id}/{action}")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == status
        assert store.get_job(job_id).status == status
    r = await admin.post(f"/api/v1/jobs/{finished.job.id}/start")
    assert r.status_code == 409
    assert r.json() == {
        "detail": f"job {finished.job.id!r} cannot go from completed to running",
        "code": "invalid_transition",
    }
    assert store.get_job(finished.job.id).status == JobStatus.COMPLETED
    r = await admin.post("/api/v1/jobs/job-nope/stop")
    assert r.status_code == 404
    r = await admin.get(f"/api/v1/jobs/{job_id}/start")
    assert r.status_code == 405
    assert r.json()["code"] == "method_not_allowed"


async def test_a_start_the_members_cannot_run_is_409_with_the_reason(
    admin: httpx.AsyncClient, store: Store
) -> None:
    """The demo job's shards partition needs 4 agents: with 3 active its start is refused, the
    job stays pending without members, and the listing shows why."""
    job_id = (await admin.post("/api/v1/jobs", content=DEMO)).json()["id"]
    for agent in store.list_agents(status=AgentStatus.ACTIVE):
        store.set_agent_status(agent.id, AgentStatus.DISABLED)
    for i in range(3):
        store.create_agent(name=f"silo-{i}")
    r = await admin.post(f"/api/v1/jobs/{job_id}/start")
    assert r.status_code == 409
    assert r.json()["code"] == "cannot_start"
    assert "cannot start on 3 agents" in r.json()["detail"]
    assert "needs at least 4 agents" in r.json()["detail"]
    assert store.get_job(job_id).status == JobStatus.PENDING
    assert store.job_members(job_id) == []
    (listed,) = [j for j in (await admin.get("/api/v1/jobs")).json() if j["id"] == job_id]
    assert listed["status"] == "pending"
    assert "needs at least 4 agents" in listed["error"]


def test_examples_exist() -> None:
    assert Path(ROOT / "examples" / "demo-dpfedavg.yaml").is_file()


@pytest.mark.slow
async def test_a_claim_that_is_not_a_bound_is_shown_apart_from_the_charged_epsilon(
    admin: httpx.AsyncClient, store: Store, finished: FinishedJob
) -> None:
    """DP-FedSGD's sum-dominating figure: in the job view as ``claimed_epsilon`` with its
    ``claim`` label, while the ledger (``epsilons``) holds the guaranteed own-share charge."""
    from dpfl.learning.algorithms.dp_fedsgd import ALGORITHM
    from dpfl.learning.algorithms.parts.fedsgd_accounting import CLAIM_LABEL
    from dpfl.server.store import Charge, ProtectedUnit

    doc = {
        "name": "sum-dominating",
        "algorithm": "dp-fedsgd",
        "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
        "rounds": 1,
        "privacy": {"unit": "record", "target_epsilon": 4.0, "accounting": "sum-dominating"},
        "params": {"local_steps": 3, "batch_sampling_rate": 0.1},
    }
    spec = parse_job(doc)
    ids = [  # clients without a budget: the guaranteed charge is far above the claim
        store.redeem_enrollment_token(
            store.create_enrollment_token(ttl=timedelta(hours=1)).token, name=f"sgd-{i}"
        ).agent.id
        for i in range(2)
    ]
    plan = ALGORITHM.plan(spec, population=len(ids))
    job = store.create_job(spec, members=ids)
    store.set_job_status(job.id, JobStatus.RUNNING)
    setup = RoundSetup(version=ROUND_SETUP_VERSION, plan=plan_record(plan))
    rnd = store.start_round(job.id, 1, invited=ids, setup=setup)
    store.update_round(rnd.id, accepted=ids)
    charges = ALGORITHM.bind(spec, plan).round_charge(round_number=1, population=ids).charges(ids)
    store.commit_round(
        rnd.id, [Charge(a, c.event, ProtectedUnit.RECORD) for a, c in charges.items()]
    )
    body = (await admin.get(f"/api/v1/jobs/{job.id}")).json()
    assert body["claim"] == CLAIM_LABEL
    assert body["claimed_epsilon"] == pytest.approx(4.0, rel=0.02)
    assert set(body["epsilons"]) == set(ids)
    assert min(body["epsilons"].values()) > 1.5 * body["claimed_epsilon"]  # shares split over 1.9
    plain = (await admin.get(f"/api/v1/jobs/{finished.job.id}")).json()
    assert (plain["claimed_epsilon"], plain["claim"]) == (None, None)


@pytest.mark.parametrize("depth", [500, 5000])
@pytest.mark.parametrize("media", [YAML, "application/json", None])
async def test_deeply_nested_documents_are_one_line_422(
    admin: httpx.AsyncClient, db_url: str, depth: int, media: str | None
) -> None:
    """≥ 500 levels (3 KB) used to be a 500 with a RecursionError traceback per request."""
    before = snapshot(db_url)
    if media == "application/json":
        body = '{"name": "x", "algorithm": "dp-fedavg", "x": ' + "[" * depth + "]" * depth + "}"
    else:
        body = "name: x\nalgorithm: dp-fedavg\nx: " + "[" * depth + "]" * depth + "\n"
    headers = {"Content-Type": media} if media else {}
    r = await admin.post("/api/v1/jobs", content=body, headers=headers)
    assert r.status_code == 422, r.text[:300]
    error = r.json()
    assert error["code"] == "invalid_job"
    assert error["problems"] == [
        "job document nested too deeply: more than 32 levels of mappings and lists"
    ]
    assert "\n" not in error["detail"]
    assert snapshot(db_url) == before


async def test_many_problems_are_reported_briefly(admin: httpx.AsyncClient) -> None:
    fields = {f"field{i}": "v" * 100 for i in range(5000)}
    body = json.dumps({"name": "x", "algorithm": "dp-fedavg", **fields})
    r = await admin.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert len(r.content) < 10_000
    problems = r.json()["problems"]
    assert len(problems) == 21
    assert problems[-1].endswith("more problems")


async def test_a_large_document_below_the_byte_limit_is_413_when_declared_larger(
    admin: httpx.AsyncClient,
) -> None:
    r = await admin.post(
        "/api/v1/jobs",
        content=b"x" * (MAX_JOB_BYTES + 1),
        headers={"Content-Type": YAML},
    )
    assert r.status_code == 413
    assert str(MAX_JOB_BYTES) in r.json()["detail"]
