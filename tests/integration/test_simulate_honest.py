"""The honest simulation, on digits with a few in-process agents: the agents' local policy and
the clients' coordinator-side budget set from ``dpfl.simulate`` (as ``dpfl simulate`` sets them),
declines counted per rule of the policy with the agents' own words, and a job that stops early
saying why, in the result and in its JSON line; ``dpfl simulate --json`` prints exactly what
``dpfl.simulate`` returns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.limits import hang_guard

import dpfl

pytestmark = pytest.mark.slow

#: 3 rounds of DP-FedAvg, every agent invited each round; the whole job costs ε 4 per client,
#: about 2.2 after round 1 and 3.2 (agent side, un-amplified) after round 2.
JOB: dict[str, Any] = {
    "name": "honest",
    "algorithm": "dp-fedavg",
    "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
    "model": "logreg",
    "rounds": 3,
    "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 4.0, "noise": "skellam"},
    "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.05},
    "params": {"clip": 1.0, "sampling_rate": 1.0, "local_steps": 2, "learning_rate": 0.5},
}


def test_declines_of_the_agents_policy_are_counted_per_rule() -> None:
    result = dpfl.simulate(JOB, 3, agent_max_epsilon_per_job=2.5)
    assert result.status == "failed"
    assert result.rounds_completed == 1
    inv = result.invitations
    # round 1 accepted by all; round 2 then declined by all, in each of its attempts
    assert inv.accepted == 3
    assert inv.declined == inv.sent - 3 > 0
    assert inv.declined_by_rule == {"max_epsilon_per_job": inv.declined}
    assert "> 2.5" in inv.example["max_epsilon_per_job"]
    assert [r.declined for r in result.per_round[1:]] == [{"max_epsilon_per_job": 3}] * (
        len(result.per_round) - 1
    )
    assert result.stop is not None
    assert result.stop.kind == "rounds_aborted"
    assert "0 of 3 invited clients accepted" in result.stop.message
    line = result.to_dict()
    assert line["invitations"]["declined_by_rule"] == {"max_epsilon_per_job": inv.declined}
    assert line["stop_reason"] == {"kind": "rounds_aborted", "message": result.stop.message}
    assert max(result.epsilon.values()) < 2.5  # only round 1 was charged


def test_a_spent_coordinator_budget_stops_the_job_saying_so() -> None:
    result = dpfl.simulate(JOB, 2, budget_epsilon=2.5)
    assert (result.status, result.rounds_completed, result.rounds_planned) == ("failed", 1, 3)
    assert result.stop is not None
    assert result.stop.kind == "budget_exhausted"
    assert "no client of the population can afford another round" in result.stop.message
    assert result.to_dict()["stop_reason"]["kind"] == "budget_exhausted"
    assert result.invitations.declined == 0
    assert max(result.epsilon.values()) <= 2.5


def test_a_generous_policy_lets_every_agent_take_part_and_the_json_line_matches(
    tmp_path: Path,
) -> None:
    result = dpfl.simulate(JOB, 3, agent_max_epsilon_per_job=100.0, budget_epsilon=100.0)
    assert result.status == "completed"
    assert result.stop is None
    assert result.to_dict()["stop_reason"] is None
    assert (result.invitations.sent, result.invitations.accepted) == (9, 9)
    assert result.invitations.declined_by_rule == {}
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(JOB), encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpfl.cli.main",
            "simulate",
            str(job_file),
            "--agents",
            "3",
            "--transport",
            "inproc",
            "--agent-max-epsilon-per-job",
            "100",
            "--budget-epsilon",
            "100",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=hang_guard(25),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    mine = json.loads(json.dumps(result.to_dict()))
    assert set(line) == set(mine)
    # the agents' noise comes from the system CSPRNG: accuracy, metrics and timing differ
    for key in ("accuracy", "metrics", "wall_s"):
        line.pop(key), mine.pop(key)
    # agent ids are fresh per run; the charges themselves are fixed by the plan
    assert sorted(line.pop("epsilon").values()) == sorted(mine.pop("epsilon").values())
    assert line == mine
    assert "invitations: 9 sent, 9 accepted, 0 declined" in done.stderr.replace("\n", " ")


def test_each_clients_epsilon_is_its_figure_for_the_job_in_the_ledger(tmp_path: Path) -> None:
    """The reported ε per client is the ledger's per-job figure (the smaller of RDP and tight),
    read for the whole job at once; a client the job never charged shows 0."""
    from dpfl.server.store import open_store

    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    result = dpfl.simulate(JOB, 3, budget_epsilon=2.5, database_url=url)
    store = open_store(url)
    try:
        for agent, epsilon in result.epsilon.items():
            by_job = store.client_budget(agent, delta=1e-5).by_job
            assert epsilon == by_job[result.job_id].epsilon
            assert 0 < epsilon <= 2.5
    finally:
        store.close()
    assert len(result.epsilon) == 3
    # no client can afford round 1 (about 2.2): the job charges nobody, every figure is 0
    poor = dpfl.simulate(JOB, 3, budget_epsilon=1.0)
    assert poor.stop is not None
    assert poor.stop.kind == "budget_exhausted"
    assert poor.epsilon == dict.fromkeys(poor.epsilon, 0.0)
    assert len(poor.epsilon) == 3
