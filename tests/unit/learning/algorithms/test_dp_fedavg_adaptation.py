"""DP-FedAvg+DA: local steps on the DANN loss against the public images the agents read. The job
refuses what cannot work, the task asks for the public images, the agent's delta is still one
clipped vector of the model's size, and a whole job runs with the ledger's ε within target."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData
from dpfl.learning.algorithms.dp_fedavg import ALGORITHM as FEDAVG
from dpfl.learning.domain_adaptation import dann_local_update
from dpfl.learning.errors import TrainingError
from dpfl.learning.jobs import JobSpecError, parse_job
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters
from dpfl.simulation import simulate_job

DANN = {"method": "dann", "weight": 0.5, "hidden": 16}


def _job(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "fedavg-da",
        "algorithm": "dp-fedavg",
        "data": {
            "dataset": "digits",
            "partition": {"scheme": "iid"},
            "public": {"source": "test", "fraction": 0.5},
        },
        "model": "mlp",
        "rounds": 3,
        "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 8.0, "noise": "skellam"},
        "params": {
            "clip": 1.0,
            "sampling_rate": 1.0,
            "local_steps": 5,
            "learning_rate": 0.3,
            "local_domain_adaptation": DANN,
        },
    }
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"data": {"dataset": "digits", "partition": {"scheme": "iid"}}}, "public pool"),
        ({"model": "logreg"}, "hidden layers"),
        (
            {
                "params": {
                    "local_steps": 5,
                    "features": "public-pca",
                    "local_domain_adaptation": DANN,
                }
            },
            "leave params.features out",
        ),
        ({"params": {"local_domain_adaptation": {"method": "dann", "weight": 0}}}, "weight"),
        ({"params": {"local_domain_adaptation": {"method": "none", "hidden": 5}}}, "only apply"),
    ],
)
def test_jobs_that_cannot_adapt_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        parse_job(_job(**changes))


def test_the_agent_trains_on_the_dann_loss_with_the_public_images(
    digits_public_split: tuple[CoordinatorData, AgentData],
) -> None:
    coordinator, agent = digits_public_split
    job = parse_job(_job())
    plan = FEDAVG.plan(job, population=4, data=coordinator)
    state = FEDAVG.bind(job, plan).initial_state(coordinator)
    task = FEDAVG.bind(job, plan).round_task(state, round_number=1)
    assert task.needs_public_data
    params = FEDAVG.parse_task(task.params.to_json())  # as the agent parses it
    assert params.domain_adaptation.method == "dann"
    public = np.asarray(coordinator.public_x)
    adapted = FEDAVG.agent(params).compute(agent, model=state.model, public_x=public, device="cpu")
    assert adapted.shape == (plan.details.dimension,)
    assert 0 < np.linalg.norm(adapted) <= 1.0 + 1e-9
    plain_task = parse_job(_job(params={**_job()["params"], "local_domain_adaptation": {}}))
    plain_params = FEDAVG.bind(plain_task, plan).round_task(state, round_number=1)
    assert not plain_params.needs_public_data
    plain = FEDAVG.agent(plain_params.params).compute(
        agent, model=state.model, public_x=None, device="cpu"
    )
    assert not np.allclose(adapted, plain)  # the domain loss moved the features
    with pytest.raises(AlgorithmError, match="no public images came"):
        FEDAVG.agent(params).compute(agent, model=state.model, public_x=None, device="cpu")


def test_dann_local_update_is_deterministic_and_leaves_the_model(
    digits_public_split: tuple[CoordinatorData, AgentData],
) -> None:
    coordinator, agent = digits_public_split
    net = build_model("mlp?hidden=16", input_shape=(1, 8, 8), num_classes=10, seed=0)
    before = flatten_parameters(net, dtype=np.float64)
    public = np.asarray(coordinator.public_x)

    def run(seed: int) -> np.ndarray:
        update = dann_local_update(
            net, agent.x, agent.y, public, steps=6, batch_size=16, hidden=8, seed=seed
        )
        assert update.steps == 6
        return update.delta

    first = run(3)
    assert np.array_equal(first, run(3))
    assert not np.array_equal(first, run(4))
    assert np.array_equal(flatten_parameters(net, dtype=np.float64), before)
    with pytest.raises(TrainingError, match="target images have shape"):
        dann_local_update(net, agent.x, agent.y, public[:, :, :4, :4], steps=1)
    logreg = build_model("logreg", input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(TrainingError, match="hidden layers"):
        dann_local_update(logreg, agent.x, agent.y, public, steps=1)


def test_dp_fedavg_with_dann_runs_end_to_end() -> None:
    """Four agents in process: every round asks for the public images, the job completes and
    the ledger's ε stays within the target (the public images cost nothing)."""
    result = simulate_job(parse_job(_job()), agents=4)
    assert result.status == "completed", result.error
    assert result.rounds_completed == 3
    assert max(result.epsilon.values()) <= 8.0 + 1e-9
    assert result.accuracy is not None
