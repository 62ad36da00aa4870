"""``dpfl simulate`` end to end, as a user runs it: the issue's DP-FedAvg job with 100 agents.

100 agents in-process (the same agents, state machines, store and ledger as over gRPC; every
message still crosses the link as bytes), client sampling q = 0.3, 10 rounds, ε ≤ 4 at δ = 1e-5,
non-IID shards of digits: the test accuracy must reach 60 %. The command's last line is the
documented JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from support.limits import hang_guard

from dpfl.cli.demo import DEMO_JOB


def test_simulate_100_agents_inproc_reaches_60_percent_at_epsilon_4(tmp_path: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(DEMO_JOB), encoding="utf-8")
    assert DEMO_JOB["params"]["sampling_rate"] == 0.3
    assert DEMO_JOB["rounds"] == 10
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpfl.cli.main",
            "simulate",
            str(job_file),
            "--agents",
            "100",
            "--transport",
            "inproc",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=hang_guard(60),  # the job: ~15 s of CPU; 52 s in the suite on 2 cores
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {
        "job",
        "algorithm",
        "rounds_completed",
        "accuracy",
        "epsilon",
        "delta",
        "noise_multiplier",
        "wall_s",
        "claimed_epsilon",
        "claim",
        "status",
        "rounds_planned",
        "rounds_skipped",
        "metrics",
        "invitations",
        "per_round",
        "stop_reason",
        "recipe",
    }
    assert result["status"] == "completed"
    assert result["stop_reason"] is None
    assert result["claimed_epsilon"] is None  # only DP-FedSGD's opt-in shows a claim
    assert result["algorithm"] == "dp-fedavg"
    assert result["rounds_completed"] == 10  # every sample is released, even of 0 or 1 clients
    assert result["delta"] == 1e-5
    assert len(result["epsilon"]) == 100
    assert max(result["epsilon"].values()) <= 4.0
    assert min(result["epsilon"].values()) > 3.0  # every client of the population is charged
    assert result["accuracy"] >= 0.60, result
    assert result["noise_multiplier"] > 0
