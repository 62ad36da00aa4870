"""``dpfl simulate`` is a shell over the library: every flag lands in the
:class:`~dpfl.simulation.SimulationPlan` it builds, and the plan makes the
:class:`~dpfl.simulation.Simulation` with exactly those settings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from dpfl.cli.main import parser
from dpfl.cli.simulate import _plan
from dpfl.client.policy import Policy
from dpfl.simulation import SimulationPlan, resolve_job, uniform_clients
from dpfl.simulation.ray_backend import RayOptions

JOB = Path(__file__).resolve().parents[3] / "examples" / "demo-dpfedavg.yaml"


def _args(*flags: str) -> SimulationPlan:
    return _plan(parser().parse_args(["simulate", str(JOB), "--agents", "3", *flags]))


def test_every_flag_reaches_the_plan(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"max_epsilon_total": 90.0}))
    plan = _args(
        "--transport",
        "inproc",
        "--seed",
        "7",
        "--budget-epsilon",
        "2",
        "--agent-policy",
        str(policy),
        "--agent-max-epsilon-per-job",
        "5",
        "--database-url",
        "sqlite:////tmp/x.db",
    )
    assert (plan.agents, plan.transport, plan.database_url) == (3, "inproc", "sqlite:////tmp/x.db")
    assert plan.job.name == "demo-dpfedavg"
    assert plan.job.seed == 7
    assert plan.clients.budgets == dict.fromkeys(range(3), (2.0, plan.job.privacy.delta))
    assert sorted(plan.clients.policies) == [0, 1, 2]
    assert {
        (p.max_epsilon_per_job, p.max_epsilon_total) for p in plan.clients.policies.values()
    } == {(5.0, 90.0)}
    assert plan.data is None  # digits is embedded: no data folder
    assert (plan.backend, plan.ray) == ("local", None)


def test_without_flags_the_plan_keeps_the_defaults() -> None:
    plan = _args()
    assert (plan.transport, plan.database_url, plan.backend, plan.ray) == (
        "grpc",
        None,
        "local",
        None,
    )
    assert (plan.clients.budgets, plan.clients.policies) == ({}, {})


def test_ray_flags_reach_the_plan() -> None:
    plan = _args("--backend", "ray", "--agents-per-actor", "2", "--cpus-per-agent", "0.5")
    assert plan.backend == "ray"
    assert plan.ray == RayOptions(agents_per_actor=2, cpus_per_agent=0.5)


def test_the_plan_makes_its_simulation() -> None:
    job = resolve_job(JOB)
    policy = Policy(max_epsilon_total=30.0)
    clients = uniform_clients(2, budget=(1.0, 1e-5), policy=policy)
    sim = SimulationPlan(job, 2, "inproc", "sqlite:////tmp/y.db", clients).simulation()
    try:
        assert (sim.job, sim.num_agents, sim.transport) == (job, 2, "inproc")
        assert sim.database_url == "sqlite:////tmp/y.db"
        assert sim.budgets == {0: (1.0, 1e-5), 1: (1.0, 1e-5)}
        assert sim.policies == {0: policy, 1: policy}
        assert (sim.backend, sim.ray_options) == ("local", None)
    finally:
        asyncio.run(sim.close())
