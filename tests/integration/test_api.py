"""The researchers' API: ``dpfl.simulate`` on digits (also where an event loop already runs, as
in a notebook), the job given as a path, a mapping or a JobSpec, and ``dpfl.privacy``'s figures
equal to the plan the coordinator uses."""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path

import pytest
import yaml

import dpfl
from dpfl.accounting import GaussianEvent, SelfComposedEvent, compute_epsilon
from dpfl.learning.jobs import parse_job
from dpfl.simulation import resolve_job

JOB = {
    "name": "api",
    "algorithm": "dp-fedavg",
    "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
    "model": "logreg",
    "rounds": 2,
    "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 4.0, "noise": "skellam"},
    "params": {"clip": 1.0, "sampling_rate": 1.0, "local_steps": 2, "learning_rate": 0.5},
}


def test_resolve_job_accepts_path_mapping_and_spec(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB), encoding="utf-8")
    spec = parse_job(JOB)
    assert resolve_job(path) == resolve_job(str(path)) == resolve_job(JOB) == resolve_job(spec)
    assert resolve_job(JOB, seed=7).seed == 7
    with pytest.raises(TypeError, match="job must be"):
        resolve_job(42)  # type: ignore[arg-type]


def test_simulate_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="agents must be >= 1"):
        dpfl.simulate(JOB, 0)
    with pytest.raises(ValueError, match="transport"):
        dpfl.simulate(JOB, 2, transport="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget ε"):
        dpfl.simulate(JOB, 2, budget_epsilon=-1.0)


@pytest.mark.slow
def test_simulate_runs_inside_a_running_event_loop(tmp_path: Path) -> None:
    """A notebook cell runs inside the kernel's loop: the call still blocks and returns."""

    async def cell() -> dpfl.SimulationResult:
        return dpfl.simulate(JOB, 2, seed=3, data_dir=tmp_path)

    before = os.environ.get("DPFL_DATA_DIR")
    result = asyncio.run(cell())
    assert os.environ.get("DPFL_DATA_DIR") == before  # data_dir only for the call
    assert result.status == "completed"
    assert result.rounds_completed == 2
    assert result.accuracy is not None
    assert 0.0 <= result.accuracy <= 1.0
    line = result.to_dict()
    assert line["rounds_completed"] == 2
    assert line["accuracy"] == result.accuracy
    planned = dpfl.privacy.epsilon(JOB, agents=2).epsilon
    assert max(result.epsilon.values()) == pytest.approx(planned, rel=1e-6)
    assert max(result.epsilon.values()) <= 4.0


def test_privacy_of_a_job_is_its_plan() -> None:
    z = dpfl.privacy.noise_multiplier(JOB, agents=5)
    plan = dpfl.privacy.plan(JOB, agents=5)
    assert z == plan.noise_multiplier > 0
    report = dpfl.privacy.epsilon(JOB, agents=5)
    assert report.delta == 1e-5
    assert report.epsilon == pytest.approx(plan.calibration["epsilon"], rel=1e-9)
    assert report.epsilon <= 4.0
    looser = dpfl.privacy.noise_multiplier(JOB, agents=5, target_epsilon=8.0)
    assert looser < z
    assert dpfl.privacy.epsilon(JOB, agents=5, delta=1e-3).epsilon < report.epsilon
    with pytest.raises(ValueError, match="agents="):
        dpfl.privacy.epsilon(JOB)


def test_privacy_of_an_event_is_the_accountants() -> None:
    event = SelfComposedEvent(GaussianEvent.from_multiplier(1.0), 10)
    assert dpfl.privacy.epsilon(event, delta=1e-5) == compute_epsilon(event, delta=1e-5)
    with pytest.raises(ValueError, match="needs a delta"):
        dpfl.privacy.epsilon(event)
    calibrated = dpfl.privacy.calibrate(target_epsilon=2.0, delta=1e-5, steps=10)
    assert calibrated.epsilon <= 2.0
    assert math.isfinite(calibrated.noise_multiplier)
