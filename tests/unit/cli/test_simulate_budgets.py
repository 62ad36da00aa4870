"""``dpfl simulate``'s clients' budget flags: each one reaches the simulation, and bad values are
refused with exit 2 and a message naming the problem (no simulation starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dpfl.cli.main import main
from dpfl.client.policy import Policy, PolicyError
from dpfl.learning.jobs import load_job
from dpfl.simulation import agent_policy, client_budget, uniform_clients
from dpfl.simulation.result import StopReason, decline_rule, stop_reason

JOB = Path(__file__).resolve().parents[3] / "examples" / "demo-dpfedavg.yaml"


def test_client_budget_defaults_to_the_jobs_delta() -> None:
    job = load_job(JOB)
    assert client_budget(job, None) is None
    assert client_budget(job, 3.0) == (3.0, job.privacy.delta)
    assert client_budget(job, 3.0, 1e-3) == (3.0, 1e-3)


@pytest.mark.parametrize(
    ("epsilon", "delta", "message"),
    [
        (0.0, None, "budget ε must be a finite number > 0"),
        (float("inf"), None, "budget ε must be a finite number > 0"),
        (1.0, 1.0, "budget δ must be in (0, 1)"),
        (None, 1e-3, "needs a budget ε"),
    ],
)
def test_client_budget_refuses_bad_values(
    epsilon: float | None, delta: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        client_budget(load_job(JOB), epsilon, delta)


def test_agent_policy_overrides(tmp_path: Path) -> None:
    assert agent_policy() is None
    raised = agent_policy(max_epsilon_per_job=50.0)
    assert isinstance(raised, Policy)
    assert (raised.max_epsilon_per_job, raised.max_epsilon_total) == (50.0, 50.0)
    both = agent_policy(max_epsilon_per_job=5.0, max_epsilon_total=8.0, delta=1e-3)
    assert (both.max_epsilon_per_job, both.max_epsilon_total, both.delta) == (5.0, 8.0, 1e-3)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"max_epsilon_per_job": 2.0, "min_noise_multiplier": 0.1}))
    from_file = agent_policy(path, max_epsilon_total=4.0)
    assert (from_file.max_epsilon_per_job, from_file.max_epsilon_total) == (2.0, 4.0)
    assert from_file.min_noise_multiplier == 0.1
    assert agent_policy({"max_epsilon_total": 12.0}).max_epsilon_total == 12.0
    with pytest.raises(PolicyError, match="max_epsilon_per_job must not exceed"):
        agent_policy(max_epsilon_per_job=5.0, max_epsilon_total=4.0)


def test_uniform_clients_gives_every_agent_the_same() -> None:
    policy = Policy()
    out = uniform_clients(3, budget=(1.0, 1e-5), policy=policy)
    assert out.budgets == {0: (1.0, 1e-5), 1: (1.0, 1e-5), 2: (1.0, 1e-5)}
    assert out.policies == {0: policy, 1: policy, 2: policy}
    default = uniform_clients(3, budget=None, policy=None)
    assert (default.budgets, default.policies) == ({}, {})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--budget-epsilon", "-1"], "budget ε must be a finite number > 0"),
        (["--budget-epsilon", "2", "--budget-delta", "2"], "budget δ must be in (0, 1)"),
        (["--budget-delta", "0.001"], "a budget δ needs a budget ε"),
        (["--agent-max-epsilon-total", "-1"], "max_epsilon_total"),
        (["--agent-delta", "1.5"], "delta"),
        (["--agent-policy", "/nonexistent/policy.yaml"], "cannot read policy file"),
        (
            ["--agent-max-epsilon-per-job", "5", "--agent-max-epsilon-total", "1"],
            "max_epsilon_per_job must not exceed max_epsilon_total",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_problem(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", str(JOB), "--agents", "2", "--transport", "inproc", *flags])
    assert code == 2
    assert message in capsys.readouterr().err


def test_decline_rule_reads_the_policys_rule() -> None:
    assert decline_rule("max_epsilon_total: total ε would reach 31 > 30") == "max_epsilon_total"
    assert decline_rule("the task does not fit dp-fedavg: bad") == "other"
    assert decline_rule("no colon") == "other"
    assert decline_rule("Weird Rule: x") == "other"


class _Report:
    def __init__(self, *, completed: bool = False, skipped: bool = False, exhausted: bool = False):
        self.completed, self.skipped, self.exhausted = completed, skipped, exhausted


def test_stop_reason_kinds() -> None:
    def stop(status: str, reports: list[_Report], done: int = 1) -> StopReason | None:
        return stop_reason(
            status=status,
            error="why",
            rounds_planned=3,
            rounds_completed=done,
            rounds_skipped=0,
            reports=reports,
        )

    assert stop("completed", [_Report(completed=True)], done=3) is None
    assert stop("completed", [_Report(completed=True)]) == StopReason(
        "algorithm_done", "the algorithm finished after 1 of 3 rounds"
    )
    assert stop("failed", [_Report(exhausted=True)]) == StopReason("budget_exhausted", "why")
    assert stop("failed", [_Report()]) == StopReason("rounds_aborted", "why")
    assert stop("failed", []) == StopReason("error", "why")
    assert stop("stopped", []) == StopReason("stopped", "why")
