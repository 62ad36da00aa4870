"""Server optimizers (FedAvg, FedAvgM, FedAdam, FedYogi), local learning-rate decay and local
epochs of the DP-FedAvg family: the math against hand computations, the task fields the agent
receives and checks, the job validation, and a small FedAdam federation that learns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_job, run_job

from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData
from dpfl.learning.algorithms.dp_fedavg import ALGORITHM, DpFedAvg
from dpfl.learning.algorithms.parts.server_optimizers import (
    AdaptiveServer,
    MomentumServer,
    SgdServer,
    server_step,
)
from dpfl.learning.jobs import JobSpec, JobSpecError, job_to_dict, parse_job
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters, model_from_bytes
from dpfl.learning.training import local_update
from dpfl.secagg import SeededRandomSource


def _job(params: dict[str, Any], **sections: Any) -> JobSpec:
    """The harness's DP-FedAvg job with exactly these params (beside clip, q and the rate)."""
    doc = job_to_dict(make_job(**sections))
    doc["params"] = {"clip": 1.0, "sampling_rate": 0.3, "learning_rate": 0.5, **params}
    return parse_job(doc)


U1 = np.array([1.0, -2.0, 0.5])
U2 = np.array([0.5, 1.0, -1.0])


def test_adam_matches_a_hand_computation() -> None:
    adam = AdaptiveServer(kind="adam", learning_rate=0.1, betas=(0.9, 0.99), epsilon=1e-3)
    blobs: dict[str, bytes] = {}
    step1 = server_step(adam, U1, blobs, step_number=1)
    # m = 0.1·u1, v = 0.01·u1²; bias-corrected m̂ = u1, v̂ = u1²: a step of η·u/(|u| + τ)
    np.testing.assert_allclose(step1, [0.1 / 1.001, -0.2 / 2.001, 0.05 / 0.501], rtol=1e-12)
    step2 = server_step(adam, U2, blobs, step_number=2)
    # m = 0.9·(0.1, −0.2, 0.05) + 0.1·(0.5, 1, −1) = (0.14, −0.08, −0.055)
    # v = 0.99·(0.01, 0.04, 0.0025) + 0.01·(0.25, 1, 1) = (0.0124, 0.0496, 0.012475)
    m_hat = np.array([0.14, -0.08, -0.055]) / (1 - 0.81)
    v_hat = np.array([0.0124, 0.0496, 0.012475]) / (1 - 0.9801)
    np.testing.assert_allclose(step2, 0.1 * m_hat / (np.sqrt(v_hat) + 1e-3), rtol=1e-12)


def test_yogi_moves_the_second_moment_additively() -> None:
    yogi = AdaptiveServer(kind="yogi", learning_rate=0.1, betas=(0.9, 0.99), epsilon=1e-3)
    blobs: dict[str, bytes] = {}
    server_step(yogi, U1, blobs, step_number=1)
    step2 = server_step(yogi, U2, blobs, step_number=2)
    # v₁ = 0.01·u1² = (0.01, 0.04, 0.0025) < u2², so v₂ = v₁ + 0.01·u2² = (0.0125, 0.05, 0.0125)
    v_hat = np.array([0.0125, 0.05, 0.0125]) / (1 - 0.9801)
    m_hat = np.array([0.14, -0.08, -0.055]) / (1 - 0.81)
    np.testing.assert_allclose(step2, 0.1 * m_hat / (np.sqrt(v_hat) + 1e-3), rtol=1e-12)


def test_sgd_and_momentum_steps() -> None:
    blobs: dict[str, bytes] = {}
    np.testing.assert_allclose(
        server_step(SgdServer(kind="sgd", learning_rate=2.0), U1, blobs, step_number=1), 2 * U1
    )
    assert blobs == {}
    heavy = MomentumServer(kind="momentum", learning_rate=2.0, momentum=0.5)
    server_step(heavy, U1, blobs, step_number=1)
    np.testing.assert_allclose(server_step(heavy, U2, blobs, step_number=2), 2.0 * (0.5 * U1 + U2))
    with pytest.raises(AlgorithmError, match="buffer has 3 entries, the model 2"):
        server_step(heavy, U1[:2], blobs, step_number=3)
    with pytest.raises(AlgorithmError, match="start at 1"):
        server_step(heavy, U1, blobs, step_number=0)


def test_fedadam_through_the_coordinator(digits_coordinator: CoordinatorData) -> None:
    """finish_round keeps the moments between rounds and counts steps by the model version."""
    optimizer = {"kind": "adam", "learning_rate": 0.05, "betas": [0.9, 0.99], "epsilon": 1e-3}
    job = _job({"server_optimizer": optimizer})
    plan = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    theta = [flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64)]
    rng = np.random.default_rng(1)
    aggregates = [rng.normal(size=650), rng.normal(size=650)]
    for r, a in enumerate(aggregates, start=1):
        state = (
            ALGORITHM.bind(job, plan)
            .finish_round(state, digits_coordinator, round_number=r, aggregate=a, survivors=30)
            .state
        )
        theta.append(flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64))
    reference = AdaptiveServer(kind="adam", learning_rate=0.05)
    blobs: dict[str, bytes] = {}
    for r, a in enumerate(aggregates, start=1):
        expected = server_step(reference, a / 30.0, blobs, step_number=r)
        np.testing.assert_allclose(theta[r] - theta[r - 1], expected, rtol=1e-4, atol=1e-6)
    assert set(state.blobs) == {"adam_m", "adam_v"}


def test_older_fields_still_mean_fedavgm() -> None:
    params = _job({"server_learning_rate": 2.0, "server_momentum": 0.5}).params
    assert params.optimizer() == MomentumServer(kind="momentum", learning_rate=2.0, momentum=0.5)
    assert _job({}).params.optimizer() == MomentumServer(kind="momentum", momentum=0.8)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"local_epochs": 2, "local_steps": 3}, "local_steps or local_epochs, not both"),
        ({"local_epochs": 0}, "local_epochs"),
        ({"learning_rate_decay": 0.0}, "learning_rate_decay"),
        ({"learning_rate_decay": 1.5}, "learning_rate_decay"),
        (
            {"server_optimizer": {"kind": "adam"}, "server_momentum": 0.5},
            "server_optimizer or server_momentum, not both",
        ),
        ({"server_optimizer": {"kind": "adam", "betas": [0.9, 1.0]}}, r"betas\[1\]"),
        ({"server_optimizer": {"kind": "adam", "momentum": 0.9}}, "momentum"),
        ({"server_optimizer": {"kind": "lamb"}}, "kind"),
        ({"server_optimizer": {"kind": "sgd", "learning_rate": -1}}, "learning_rate"),
    ],
)
def test_job_validation_names_the_problem(params: dict[str, Any], message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        _job(params)


def test_decayed_rate_and_local_epochs_are_sent_and_applied(
    digits_coordinator: CoordinatorData, digits_agents: list[Any]
) -> None:
    job = _job({"local_epochs": 2, "learning_rate": 0.4, "learning_rate_decay": 0.5, "clip": 100.0})
    plan = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    params = ALGORITHM.bind(job, plan).round_task(state, round_number=3).params.to_json()
    assert params["learning_rate"] == pytest.approx(0.4 * 0.5**2)
    assert params["local_epochs"] == 2
    assert "local_steps" not in params
    agent = digits_agents[0]
    vector = ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
        agent, model=state.model, public_x=None, device="cpu"
    )
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    model_from_bytes(state.model, model=net)
    expected = local_update(
        net,
        agent.x,
        agent.y,
        epochs=2,
        batch_size=32,
        learning_rate=0.1,
        seed=params["train_seed"],
        device="cpu",
    )
    assert expected.steps == 2 * -(-len(agent.y) // 32)
    np.testing.assert_allclose(vector, expected.delta.astype(np.float64), rtol=1e-6)
    first = ALGORITHM.bind(job, plan).round_task(state, round_number=1).params.to_json()
    assert first["learning_rate"] == pytest.approx(0.4)


def test_agent_accepts_the_new_fields_and_refuses_inconsistent_ones(
    digits_coordinator: CoordinatorData,
) -> None:
    job = _job({"local_epochs": 1, "learning_rate_decay": 0.9})
    plan = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=2)
    config = ALGORITHM.bind(job, plan).encoding(task, participants=30, min_survivors=29)
    events = list(
        ALGORITHM.bind(job, plan).invitation_events(round_number=2, population=["a"] * 100)
    )
    params = task.params.to_json()
    kw = {"num_clients": 30, "min_survivors": 29, "honest_fraction": 1.0}
    ALGORITHM.agent(ALGORITHM.parse_task(params)).check(events, config, **kw)
    for bad in (
        {**params, "local_steps": 5},
        {k: v for k, v in params.items() if k != "local_epochs"},
    ):
        with pytest.raises(AlgorithmError, match="exactly one of local_steps and local_epochs"):
            ALGORITHM.parse_task(bad)
    for field, value in (("local_epochs", 0), ("learning_rate", 0.0)):
        with pytest.raises(AlgorithmError, match=rf"params\.{field}"):
            ALGORITHM.parse_task({**params, field: value})
    with pytest.raises(AlgorithmError, match=r"params\.learning_rate_decay"):
        ALGORITHM.parse_task({**params, "learning_rate_decay": 0.9})  # not a task field


@pytest.mark.slow
def test_fedadam_federation_learns_digits() -> None:
    """20 IID agents, every one each round, ε = 8: FedAdam must beat chance (0.1) by far."""
    job = _job(
        {
            "sampling_rate": 1.0,
            "local_epochs": 1,
            "learning_rate_decay": 0.95,
            "server_optimizer": {"kind": "adam", "learning_rate": 0.1},
        },
        data={"partition": {"scheme": "iid"}},
        rounds=6,
        privacy={"target_epsilon": 8.0},
    )
    result = run_job(
        job,
        num_agents=20,
        algorithm=DpFedAvg(random_source=SeededRandomSource(b"fedadam-sampling-seed0")),
        seed=b"fedadam-harness-seed-0000",
    )
    assert len(result.rounds) == 6
    accuracy = result.final_metrics["accuracy"]
    assert accuracy >= 0.5, f"accuracy {accuracy:.3f}"


def test_dp_fedsgd_applies_its_server_optimizer_to_the_mean_delta(
    digits_coordinator: CoordinatorData,
) -> None:
    """DP-FedSGD: the mean local delta −γ·A/(B·survivors) goes through the optimizer; without
    one it is added as before."""
    from dpfl.learning.algorithms.dp_fedsgd import ALGORITHM as FEDSGD

    doc: dict[str, Any] = {
        "name": "fedsgd-adam",
        "algorithm": "dp-fedsgd",
        "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
        "model": "logreg",
        "rounds": 4,
        "privacy": {"unit": "record", "target_epsilon": 4.0, "delta": 1e-5},
        "params": {
            "clip": 1.0,
            "local_steps": 1,
            "batch_sampling_rate": 0.1,
            "learning_rate": 0.5,
            "server_optimizer": {"kind": "yogi", "learning_rate": 0.02},
        },
    }
    job = parse_job(doc)
    plan = FEDSGD.plan(job, population=10, data=digits_coordinator)
    state = FEDSGD.bind(job, plan).initial_state(digits_coordinator)
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    theta = [flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64)]
    rng = np.random.default_rng(7)
    aggregates = [rng.normal(size=650) * 30, rng.normal(size=650) * 30]
    for r, a in enumerate(aggregates, start=1):
        state = (
            FEDSGD.bind(job, plan)
            .finish_round(state, digits_coordinator, round_number=r, aggregate=a, survivors=7)
            .state
        )
        theta.append(flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64))
    reference = AdaptiveServer(kind="yogi", learning_rate=0.02)
    blobs: dict[str, bytes] = {}
    for r, a in enumerate(aggregates, start=1):
        mean_delta = -0.5 * a / (plan.details.expected_batch_size * 7)
        expected = server_step(reference, mean_delta, blobs, step_number=r)
        np.testing.assert_allclose(theta[r] - theta[r - 1], expected, rtol=1e-4, atol=1e-6)
    assert parse_job(
        {**doc, "params": {**doc["params"], "server_optimizer": None}}
    ).params.optimizer() == SgdServer(kind="sgd")
