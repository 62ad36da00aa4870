"""The README's deployment walk-through, run end to end: ``examples/walkthrough.sh`` (which the
README quotes byte for byte, tests/unit/test_walkthrough_readme.py) with the installed console
scripts on PATH, its own work folder and two free ports chosen now.

It makes the coordinator's CA, the federation CA, keys on the silos and their certificates,
serves with mutual TLS, issues the tokens, starts three agents with their peer identities,
submits and starts a malicious-secure job that fits them, waits for it on the jobs' progress
(each wait bounded by the script's generous ``WAIT_LIMIT``, naming what it waited for), then
reads the budgets with ``dpfl budget`` and the job over REST. The script exits non-zero at the
first step that fails and stops the processes it started before it exits.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SCRIPT = ROOT / "examples" / "walkthrough.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_readme_walkthrough_runs(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    grpc_port, api_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "WORK": str(tmp_path),
        "GRPC_PORT": str(grpc_port),
        "API_PORT": str(api_port),
        # the README's default job is semi-honest DP-FedSGD; the test runs the same script with
        # the malicious-secure DP-FedAvg job, so the federation CA and the peer certificates
        # it makes are what lets the round run at all
        "JOB_FILE": "examples/dp-fedavg-malicious.yaml",
    }
    env.pop("DPFL_ADMIN_TOKEN", None)
    env.pop("DPFL_DATABASE_URL", None)
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,  # only against a hang: each wait inside is bounded by WAIT_LIMIT
        check=False,
    )
    coordinator_log = (tmp_path / "coordinator.log").read_text(encoding="utf-8", errors="replace")
    report = f"stderr:\n{done.stderr[-4000:]}\ncoordinator.log:\n{coordinator_log[-4000:]}"
    assert done.returncode == 0, report

    rest = json.loads(done.stdout.strip().splitlines()[-1])
    assert rest["status"] == "completed"
    assert rest["error"] is None
    assert rest["spec"]["secagg"]["threat_model"] == "malicious"
    for i in (1, 2, 3):  # each agent ran with its peer identity of the federation CA
        log = (tmp_path / f"silo-{i}" / "agent.log").read_text(encoding="utf-8")
        assert f"peer 'silo-{i}' of federation CA" in log, log[-2000:]
    assert len(rest["members"]) == 3
    target = rest["spec"]["privacy"]["target_epsilon"]
    assert set(rest["epsilons"]) == set(rest["members"])
    assert all(0 < eps <= target + 1e-9 for eps in rest["epsilons"].values()), rest["epsilons"]

    # dpfl budget: one row per agent, each with the job's ε spent of its budget of 8
    rows = [line for line in done.stdout.splitlines() if re.search(r"│ agent-[0-9a-f]+ │", line)]
    assert len(rows) == 3, done.stdout
    assert all("8.0000" in row for row in rows), rows
    assert f"{rest['id']}\texample-dp-fedavg-malicious\tdp-fedavg\tcompleted" in done.stdout

    assert "Traceback" not in coordinator_log
    assert "Handshake failed" not in coordinator_log
    for i in (1, 2, 3):
        agent_log = (tmp_path / f"silo-{i}" / "agent.log").read_text(errors="replace")
        assert "Traceback" not in agent_log, agent_log[-2000:]
