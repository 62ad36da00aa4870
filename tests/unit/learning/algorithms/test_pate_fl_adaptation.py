"""PATE-FL's teacher_domain_adaptation: job -> task -> agent check -> DANN teacher; defaults."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from support.algorithm_harness import make_pate_job

from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData
from dpfl.learning.algorithms.parts import teachers
from dpfl.learning.algorithms.pate_fl import ALGORITHM
from dpfl.learning.params import flatten_parameters
from dpfl.learning.training import fit_teacher

AGENTS = [f"agent-{i}" for i in range(10)]
DANN = {"method": "dann", "weight": 0.5, "hidden": 32}


def _task(job: Any, data: CoordinatorData) -> tuple[dict[str, Any], list[Any], Any]:
    plan = ALGORITHM.plan(job, population=10, data=data)
    state = ALGORITHM.bind(job, plan).initial_state(data)
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    config = ALGORITHM.bind(job, plan).encoding(task, participants=10, min_survivors=10)
    events = list(ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=AGENTS))
    return task.params.to_json(), events, config


def test_dann_round_trips_job_task_check_and_trains(digits_public: Any) -> None:
    data, agents = digits_public
    job = make_pate_job(
        model="mlp", params={"teacher_epochs": 2, "teacher_domain_adaptation": DANN}
    )
    params, events, config = _task(job, data)
    assert params["teacher"]["domain_adaptation"] == DANN
    task = ALGORITHM.parse_task(params)
    ALGORITHM.agent(task).check(
        events, config, num_clients=10, min_survivors=10, honest_fraction=1.0
    )
    teachers.clear_teacher_cache()
    votes = (
        ALGORITHM.agent(task)
        .compute(agents[0], model=None, public_x=data.public_x, device="cpu")
        .reshape(100, 10)
    )
    assert np.all(votes.sum(axis=1) == 1.0)
    # the plain teacher of the same recipe is another teacher (another cache entry)
    plain = {**params, "teacher": {**params["teacher"], "domain_adaptation": {"method": "none"}}}
    ALGORITHM.agent(ALGORITHM.parse_task(plain)).compute(
        agents[0], model=None, public_x=data.public_x, device="cpu"
    )
    assert teachers.teacher_cache_size() == 2
    # another public pool is another target domain: a new teacher
    ALGORITHM.agent(task).compute(
        agents[0], model=None, public_x=data.public_x[::-1].copy(), device="cpu"
    )
    assert teachers.teacher_cache_size() == 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"params": {"teacher_domain_adaptation": {"method": "coral"}}}, "method"),
        ({"params": {"teacher_domain_adaptation": {"method": "dann", "weight": 0}}}, "weight"),
        ({"params": {"teacher_domain_adaptation": {"method": "dann", "hidden": 0}}}, "hidden"),
        ({"params": {"teacher_domain_adaptation": {"weight": 2.0}}}, "only apply to method dann"),
        ({"params": {"teacher_domain_adaptation": {"method": "dann", "lr": 1}}}, "lr"),
        ({"params": {"teacher_domain_adaptation": {"method": "dann"}}}, "model is logreg"),
    ],
)
def test_bad_options_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=message):
        make_pate_job(**overrides)


def test_bad_task_options_are_refused(digits_public: Any) -> None:
    data, _ = digits_public
    params, _, _ = _task(make_pate_job(), data)
    bad = {**params, "teacher": {**params["teacher"], "domain_adaptation": {"method": "x"}}}
    with pytest.raises(AlgorithmError, match="domain_adaptation"):
        ALGORITHM.parse_task(bad)


def test_default_is_the_plain_teacher(digits_public: Any) -> None:
    data, agents = digits_public
    job = make_pate_job(model="mlp", params={"teacher_epochs": 2})
    params, _, _ = _task(job, data)
    assert params["teacher"]["domain_adaptation"] == {
        "method": "none",
        "weight": 1.0,
        "hidden": 100,
    }
    # an older task without the field still parses, to the same recipe
    old = {
        **params,
        "teacher": {k: v for k, v in params["teacher"].items() if k != "domain_adaptation"},
    }
    assert ALGORITHM.parse_task(old) == ALGORITHM.parse_task(params)
    teachers.clear_teacher_cache()
    task = ALGORITHM.parse_task(params)
    ALGORITHM.agent(task).compute(agents[0], model=None, public_x=data.public_x, device="cpu")
    recipe = task.teacher  # type: ignore[attr-defined]
    # abstaining changes the votes, not the teacher: it is not part of the key
    key = {"model": "mlp", **recipe.model_dump(exclude={"domain_adaptation", "abstain"})}

    def missing() -> Any:
        raise AssertionError("the plain teacher was cached under its old key")

    cached = teachers.teacher_for(task.job_key, key, agents[0].x, agents[0].y, missing)  # type: ignore[attr-defined]
    from dpfl.learning.algorithms.parts import common

    net = common.build_model("mlp", agents[0].input_shape, 10, seed=recipe.seed)
    fit_teacher(
        net,
        agents[0].x,
        agents[0].y,
        epochs=recipe.epochs,
        batch_size=recipe.batch_size,
        learning_rate=recipe.learning_rate,
        momentum=recipe.momentum,
        max_grad_norm=recipe.max_grad_norm,
        seed=recipe.seed,
        device="cpu",
    )
    assert flatten_parameters(cached).tobytes() == flatten_parameters(net).tobytes()
