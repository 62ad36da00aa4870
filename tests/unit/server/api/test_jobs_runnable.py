"""A job that can never run is refused at submission, not at start (issue 29, item 4).

``rounds: 2**63`` and ``rounds: true`` were stored (the latter as 1), and so were δ = 1e-320, a
target ε of 1e-300 or 1e308, ``clip: 1e308``, ``local_steps: 10**9`` and
``classes_per_agent: 10**9``; a job whose noise could not be calibrated failed at start with
"noise calibration failed". Now the ranges refuse the first ones (422 naming the field), and the
job is planned at submission as its start plans it, on the population it would have: its
members, else the agents active now, else a nominal 100. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.api import FinishedJob, snapshot

from dpfl.learning.jobs import JobSpecError
from dpfl.server.errors import NotFound
from dpfl.server.jobs_control import NOMINAL_POPULATION, submit_job
from dpfl.server.store import AgentStatus, Store, open_store


def fedavg(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "runnable",
        "algorithm": "dp-fedavg",
        "rounds": 2,
        "privacy": {"target_epsilon": 4.0},
        "params": {"local_steps": 2},
    }
    for key, value in changes.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return doc


#: (document, what the one problem names), each refused at submission
NEVER_RUN = [
    (fedavg(rounds=2**63), "rounds: must be <= 100000 (got 9223372036854775808)"),
    (fedavg(rounds=1e30), "rounds: "),
    (fedavg(rounds=True), "rounds: must be a number, not a boolean (got true)"),
    (fedavg(privacy={"delta": 1e-320}), "privacy.delta: must be >= 1e-30"),
    (fedavg(privacy={"target_epsilon": 1e-300}), "privacy.target_epsilon: must be >= 0.001"),
    (fedavg(privacy={"target_epsilon": 1e308}), "privacy.target_epsilon: must be <= 1000"),
    (fedavg(params={"clip": 1e308}), "params.clip: must be <= 1e+06 (got 1e+308)"),
    (fedavg(params={"local_steps": 10**9}), "params.local_steps: must be <= 10000"),
    (
        fedavg(data={"partition": {"scheme": "shards", "classes_per_agent": 10**9}}),
        "data.partition.classes_per_agent: must be <= 1000",
    ),
    # in range, and still never runs: no noise reaches the target over so many rounds
    (
        fedavg(rounds=100_000, privacy={"target_epsilon": 0.01}),
        "noise calibration failed: no noise multiplier ≤ 100000 reaches ε = 0.01",
    ),
    # digits has 10 classes
    (
        fedavg(data={"partition": {"scheme": "shards", "classes_per_agent": 12}}),
        "classes_per_agent=12 exceeds the 10 classes present in the data",
    ),
]


@pytest.mark.anyio
async def test_documents_that_can_never_run_are_refused_at_submit(
    backend_admin: tuple[httpx.AsyncClient, Store, FinishedJob], backend_url: str
) -> None:
    client, store, _ = backend_admin
    before = snapshot(backend_url)
    active = len(store.list_agents(status=AgentStatus.ACTIVE))
    for doc, says in NEVER_RUN:
        body = json.dumps(doc)
        r = await client.post(
            "/api/v1/jobs", content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 422, (doc, r.text)
        (problem,) = r.json()["problems"]
        assert says in problem, (doc, problem)
        if problem.startswith("the job cannot run"):
            assert problem.startswith(f"the job cannot run on {active} agents (the agents ")
    assert snapshot(backend_url) == before
    r = await client.post("/api/v1/jobs", content=json.dumps(fedavg()))
    assert r.status_code == 201, r.text


def _enrol(store: Store, count: int) -> list[str]:
    return [
        store.redeem_enrollment_token(
            store.create_enrollment_token(ttl=timedelta(hours=1)).token, name=f"pop-{i}"
        ).agent.id
        for i in range(count)
    ]


@pytest.mark.slow
def test_the_population_a_job_is_planned_for_at_submit(backend_url: str) -> None:
    """q = 0.05 expects q·N participants a round, and a round needs one: it runs on the nominal
    100 agents (none active yet), not on the 3 active ones, and on 20 members."""
    sampled = fedavg(params={"sampling_rate": 0.05})
    with open_store(backend_url) as store:
        assert submit_job(store, sampled).status.value == "pending"  # 100 × 0.05 = 5
        assert NOMINAL_POPULATION == 100
        ids = _enrol(store, 23)
        for agent_id in ids[3:]:
            store.set_agent_status(agent_id, AgentStatus.DISABLED)
        with pytest.raises(JobSpecError) as refused:
            submit_job(store, sampled)
        (problem,) = refused.value.problems
        assert problem == (
            "the job cannot run on 3 agents (the agents active now): sampling_rate 0.05 x "
            "population 3 expects 0.15 participants per round; at least 1 is needed"
        )
        job = submit_job(store, sampled, members=ids[:20])  # 20 × 0.05 = 1
        assert len(store.job_members(job.id)) == 20
        with pytest.raises(JobSpecError, match=r"on 19 agents \(its members\)"):
            submit_job(store, sampled, members=ids[:19])
        with pytest.raises(NotFound):
            submit_job(store, sampled, members=[*ids[:20], "agent-missing"])
        assert len(store.list_jobs()) == 2


@pytest.mark.slow
def test_job_submit_names_why_the_job_cannot_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPFL_")}
    doc = tmp_path / "job.json"
    database = f"sqlite:///{tmp_path / 'c.db'}"

    def submit(document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        doc.write_text(json.dumps(document))
        command = ["job", "submit", str(doc), "--database-url", database]
        return subprocess.run(
            [sys.executable, "-m", "dpfl.server.cli.main", *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    never = submit(fedavg(rounds=100_000, privacy={"target_epsilon": 0.01}))
    assert never.returncode == 2, never.stderr
    assert "dpfl-coordinator job: invalid job: the job cannot run on 100 agents" in never.stderr
    assert "noise calibration failed" in never.stderr
    boolean = submit(fedavg(rounds=True))
    assert boolean.returncode == 2
    assert "rounds: must be a number, not a boolean (got true)" in boolean.stderr
    done = submit(fedavg())
    assert done.returncode == 0, done.stderr
    with open_store(database) as store:
        assert [j.spec["rounds"] for j in store.list_jobs()] == [2]
