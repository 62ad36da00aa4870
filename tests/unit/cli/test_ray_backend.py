"""The Ray backend's options and actor plan: bad input is refused with the reason, before any
cluster is contacted, and a request larger than the cluster is refused instead of pending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpfl.cli.main import main
from dpfl.simulation.ray_backend import RayOptions, plan_actors


def test_the_plan_groups_agents_and_scales_requests() -> None:
    plan = plan_actors(
        10, RayOptions(agents_per_actor=4, cpus_per_agent=0.5), cluster_cpus=8, cluster_gpus=0
    )
    assert plan.groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert plan.cpus_per_actor == [2.0, 2.0, 1.0]
    assert plan.gpus_per_actor == [0.0, 0.0, 0.0]
    assert plan.torch_threads == [2, 2, 1]


def test_defaults_share_the_cluster_evenly_with_fractional_gpus() -> None:
    plan = plan_actors(1000, RayOptions(), cluster_cpus=16, cluster_gpus=2)
    assert len(plan.groups) == 16  # one actor per CPU
    assert sum(len(g) for g in plan.groups) == 1000
    assert sum(plan.cpus_per_actor) <= 16
    assert sum(plan.gpus_per_actor) <= 2
    assert all(0 < g < 1 for g in plan.gpus_per_actor)  # fractional GPUs
    assert plan.torch_threads == [1] * 16


def test_a_request_larger_than_the_cluster_is_refused() -> None:
    with pytest.raises(ValueError, match=r"need 4 CPUs; the Ray cluster has 2"):
        plan_actors(4, RayOptions(cpus_per_agent=1.0), cluster_cpus=2, cluster_gpus=0)
    with pytest.raises(ValueError, match=r"GPUs; the Ray cluster has 0"):
        plan_actors(4, RayOptions(gpus_per_agent=0.5), cluster_cpus=2, cluster_gpus=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"agents_per_actor": 0}, "agents per actor must be >= 1"),
        ({"cpus_per_agent": -1.0}, "cpus per agent must be >= 0"),
        ({"gpus_per_agent": float("nan")}, "gpus per agent must be >= 0"),
        ({"gpus_per_agent": 2.0}, "gpus per agent must be <= 1"),
    ],
)
def test_bad_options_are_named(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayOptions(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--address", "auto"], "--address need --backend ray"),
        (["--agents-per-actor", "3"], "--agents-per-actor need --backend ray"),
        (["--backend", "ray", "--transport", "inproc"], "connects over gRPC"),
        (["--backend", "ray", "--cpus-per-agent", "-2"], "cpus per agent must be >= 0"),
    ],
)
def test_the_command_refuses_inconsistent_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps({"name": "j", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}}),
        encoding="utf-8",
    )
    assert main(["simulate", str(job), "--agents", "4", *flags]) == 2
    assert message in capsys.readouterr().err
