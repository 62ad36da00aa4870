"""The REST API and ``dpfl budget`` over the database of a real simulated job.

``dpfl simulate`` (the console script: coordinator, five agents, secure aggregation, the ledger)
runs a two-round DP-FedAvg job into a SQLite file; the API is then built over that file the way
a restarted coordinator would (``support.api.app_for_url``) and must report exactly the ε the
simulation printed, every round, and downloadable model versions.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.api import app_for_url, bearer, live_server
from support.limits import hang_guard

pytestmark = pytest.mark.slow

JOB = """\
name: api-e2e
algorithm: dp-fedavg
data: {dataset: digits, partition: {scheme: shards, classes_per_agent: 3}}
model: logreg
rounds: 2
privacy: {unit: agent, delta: 1.0e-5, noise_multiplier: 1.0, noise: skellam}
secagg: {enabled: true, corrupt_fraction: 0.05, dropout_fraction: 0.05}
params: {clip: 1.0, sampling_rate: 1.0, local_steps: 2, learning_rate: 0.5}
"""


def test_api_reports_what_the_simulation_spent(tmp_path: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    bindir = Path(sys.executable).parent
    command = [str(bindir / "dpfl"), "simulate", str(job_file), "--agents", "5"]
    done = subprocess.run(
        [*command, "--transport", "inproc", "--database-url", url, "--json"],
        capture_output=True,
        text=True,
        timeout=hang_guard(30),  # 5 agents, 2 rounds in one process
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rounds_completed"] == 2
    spent: dict[str, float] = result["epsilon"]
    assert len(spent) == 5

    with app_for_url(url) as app:
        token = app.state.settings.admin_token.get_secret_value()
        store = app.state.store
        with live_server(app) as base, httpx.Client(base_url=base, headers=bearer(token)) as c:
            clients = c.get("/api/v1/clients", params={"delta": result["delta"]}).json()
            assert {x["id"]: x["epsilon"] for x in clients} == pytest.approx(spent, rel=1e-9)

            jobs = c.get("/api/v1/jobs").json()
            assert [(j["name"], j["status"]) for j in jobs] == [("api-e2e", "completed")]
            job_id = jobs[0]["id"]
            rounds = c.get(f"/api/v1/jobs/{job_id}/rounds").json()
            completed = [r for r in rounds if r["status"] == "completed"]
            assert [r["number"] for r in completed] == [1, 2]
            for r in completed:
                assert sorted(r["participants"]) == sorted(spent)
                assert r["epsilon"] is not None
                assert {"masked_input", "unmask"} <= set(r["stage_seconds"])
            assert completed[-1]["epsilon"] == pytest.approx(max(spent.values()), rel=1e-9)

            for client_id, eps in spent.items():
                report = c.get(f"/api/v1/clients/{client_id}/budget").json()
                assert report["epsilon"] == pytest.approx(eps, rel=1e-9)
                assert len(report["events"]) == 2
                assert report["by_job"][job_id]["entries"] == 2
                history = c.get(f"/api/v1/clients/{client_id}/history").json()["points"]
                assert history[-1]["epsilon"] == pytest.approx(eps, rel=1e-9)

            versions = c.get(f"/api/v1/jobs/{job_id}/models").json()
            assert len(versions) >= 3  # the initial model and one per completed round
            last = versions[-1]
            blob = c.get(f"/api/v1/jobs/{job_id}/models/{last['version']}")
            assert hashlib.sha256(blob.content).hexdigest() == last["sha256"]
            assert blob.content == store.get_model_version(job_id, last["version"]).data

            # the umbrella CLI reads the same figure from the live API
            some = next(iter(spent))
            out = subprocess.run(
                [
                    str(bindir / "dpfl"),
                    "budget",
                    some,
                    "--coordinator",
                    base,
                    "--json",
                    "--insecure",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
                env={"DPFL_TOKEN": token, "PATH": "/usr/bin:/bin"},
            )
            assert json.loads(out.stdout)["epsilon"] == pytest.approx(spent[some], rel=1e-9)
