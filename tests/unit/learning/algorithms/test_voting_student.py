"""Voting jobs: free query selection, the semi-supervised student, the teachers' recipe."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_pate_job

from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData
from dpfl.learning.algorithms.parts import teachers
from dpfl.learning.algorithms.pate_fl import ALGORITHM as PATE
from dpfl.learning.algorithms.private_knn_fl import ALGORITHM as KNN
from dpfl.learning.algorithms.voting import select_queries
from dpfl.learning.jobs import JobSpecError, job_to_dict, parse_job

AGENTS = [f"agent-{i}" for i in range(10)]


def test_query_selection_is_deterministic_distinct_and_public_only(digits_public: Any) -> None:
    data, _ = digits_public
    x = np.asarray(data.public_x)
    for method in ("random", "kmeans"):
        first = select_queries(x, 40, method=method, seed=5)
        assert first == select_queries(x, 40, method=method, seed=5)
        assert len(set(first)) == 40
        assert all(0 <= i < len(x) for i in first)
        assert first != select_queries(x, 40, method=method, seed=6)
    # k-means picks cover the pool: every record is closer to some pick than random picks manage
    flat = x.reshape(len(x), -1)

    def coverage(picks: list[int]) -> float:
        d = ((flat[:, None, :] - flat[picks][None, :, :]) ** 2).sum(-1)
        return float(d.min(axis=1).mean())

    kmeans = select_queries(x, 40, method="kmeans", seed=0)
    randoms = [coverage(select_queries(x, 40, method="random", seed=s)) for s in range(5)]
    assert coverage(kmeans) < min(randoms)
    with pytest.raises(AlgorithmError, match="cannot select 0"):
        select_queries(x, 0, method="kmeans", seed=0)
    with pytest.raises(AlgorithmError, match="unknown query selection"):
        select_queries(x, 3, method="farthest", seed=0)


def test_initial_state_selects_from_the_public_records_alone(digits_public: Any) -> None:
    data, _ = digits_public
    job = make_pate_job(params={"queries": 50, "sigma": 3.0, "query_selection": "kmeans"})
    plan = PATE.plan(job, population=10, data=data)
    state = PATE.bind(job, plan).initial_state(data)
    expected = select_queries(np.asarray(data.public_x), 50, method="kmeans", seed=job.seed)
    assert state.details["query_order"] == expected
    # the true public labels play no part: hiding them changes nothing
    blind = replace(data, public_y=None)
    assert PATE.bind(job, plan).initial_state(blind).details["query_order"] == expected


def _run_votes(job: Any, data: CoordinatorData, algorithm: Any = PATE) -> dict[str, float]:
    plan = algorithm.plan(job, population=10, data=data)
    state = algorithm.bind(job, plan).initial_state(data)
    batch = list(algorithm.bind(job, plan).round_task(state, round_number=1).params.queries)
    votes = np.zeros((len(batch), 10))
    votes[np.arange(len(batch)), np.asarray(data.public_y)[batch]] = 9.0
    outcome = algorithm.bind(job, plan).finish_round(
        state, data, round_number=1, aggregate=votes.reshape(-1), survivors=10
    )
    assert outcome.done
    assert outcome.state.model is not None
    return outcome.metrics


@pytest.mark.slow
def test_semi_supervised_student_trains_on_the_pool(digits_public: Any) -> None:
    data, _ = digits_public
    student = {"method": "vat", "steps": 60, "vat_epsilon": 1.0}
    job = make_pate_job(rounds=1, params={"queries": 30, "sigma": 3.0, "student": student})
    metrics = _run_votes(job, data)
    assert metrics["pseudo_label_accuracy"] == 1.0
    assert 0.0 < metrics["accuracy"] <= 1.0
    consistency = make_pate_job(
        rounds=1,
        params={"queries": 30, "sigma": 3.0, "student": {"method": "consistency", "steps": 30}},
    )
    reported = _run_votes(consistency, data)
    assert "student_confident_fraction" in reported
    assert reported["student_restarts"] in (0.0, 1.0, 2.0)
    assert 0.0 <= reported["student_labelled_fit"] <= 1.0
    if reported["student_restarts"] == 0.0:  # no restart: the first training cleared the bar
        assert reported["student_labelled_fit"] >= 0.5


def test_private_knn_fl_keeps_working_with_the_student(digits_public: Any) -> None:
    data, _ = digits_public
    params = {"queries": 30, "k": 5, "sigma": 2.0, "student": {"method": "self-training"}}
    job = make_pate_job(
        algorithm="private-knn-fl",
        name="knn",
        rounds=1,
        privacy={"unit": "record"},
        params={**params, "student": {"method": "self-training", "steps": 20}},
    )
    assert job.params.student.method == "self-training"
    assert 0.0 < _run_votes(job, data, KNN)["accuracy"] <= 1.0


def test_the_student_keeps_only_pseudo_labels_with_a_large_noisy_margin(
    digits_public: Any,
) -> None:
    """A filter on the released histogram: the first half of the queries gets a clear vote (9
    of 10 agents), the second half a split one (4 to 3); with min_margin 0.5 only the first
    half labels the student; with 0 all do; a margin no query reaches is refused by name."""
    data, _ = digits_public

    def run(min_margin: float) -> dict[str, float]:
        student = {"method": "supervised", "min_margin": min_margin}
        job = make_pate_job(rounds=1, params={"queries": 30, "sigma": 3.0, "student": student})
        plan = PATE.plan(job, population=10, data=data)
        state = PATE.bind(job, plan).initial_state(data)
        batch = list(PATE.bind(job, plan).round_task(state, round_number=1).params.queries)
        truth = np.asarray(data.public_y)[batch]
        votes = np.zeros((len(batch), 10))
        votes[np.arange(15), truth[:15]] = 9.0
        votes[np.arange(15, 30), truth[15:]] = 4.0
        votes[np.arange(15, 30), (truth[15:] + 1) % 10] = 3.0
        outcome = PATE.bind(job, plan).finish_round(
            state, data, round_number=1, aggregate=votes.reshape(-1), survivors=10
        )
        return dict(outcome.metrics)

    assert run(0.0)["student_labels"] == 30
    assert run(0.5)["student_labels"] == 15
    with pytest.raises(AlgorithmError, match=r"min_margin 0\.95: no answered query"):
        run(0.95)
    with pytest.raises(JobSpecError, match=r"student\.min_margin"):
        make_pate_job(params={"queries": 10, "student": {"min_margin": 1.0}})


def test_bad_student_and_teacher_params_are_refused() -> None:
    cases = [
        ({"student": {"method": "mixmatch"}}, "student.method"),
        ({"student": {"steps": 0}}, "student.steps"),
        ({"student": {"threshold": 1.5}}, "student.threshold"),
        ({"student": {"bogus": 1}}, "student.bogus"),
        ({"query_selection": "farthest"}, "query_selection"),
        ({"teacher_schedule": "linear"}, "teacher_schedule"),
        ({"teacher_validation_fraction": 1.0}, "teacher_validation_fraction"),
        ({"teacher_augment_shift": -1}, "teacher_augment_shift"),
        ({"teacher_max_grad_norm": 0}, "teacher_max_grad_norm"),
    ]
    for params, where in cases:
        with pytest.raises(JobSpecError, match=where.replace(".", r"\.")):
            make_pate_job(params={"queries": 10, **params})


@pytest.mark.slow
def test_teacher_recipe_travels_in_the_task_and_the_agent_accepts_it(
    digits_public: tuple[CoordinatorData, list[AgentData]],
) -> None:
    data, agents = digits_public
    job = make_pate_job(
        params={
            "queries": 40,
            "sigma": 3.0,
            "teacher_epochs": 4,
            "teacher_augment_shift": 1.0,
            "teacher_schedule": "cosine",
            "teacher_validation_fraction": 0.2,
            "teacher_patience": 2,
            "query_selection": "kmeans",
            "student": {"method": "consistency", "steps": 10},
        }
    )
    assert parse_job(job_to_dict(job)) == job
    plan = PATE.plan(job, population=10, data=data)
    state = PATE.bind(job, plan).initial_state(data)
    task = PATE.bind(job, plan).round_task(state, round_number=1)
    parsed = PATE.parse_task(task.params.to_json())
    assert parsed == task.params
    recipe = parsed.teacher
    assert (recipe.augment_shift, recipe.schedule) == (1.0, "cosine")
    assert (recipe.validation_fraction, recipe.patience) == (0.2, 2)
    assert recipe.max_grad_norm == 3.0  # the default bound (docs/algorithms.md)
    unbounded = make_pate_job(params={"queries": 40, "teacher_max_grad_norm": None})
    bound = PATE.bind(unbounded, PATE.plan(unbounded, population=10, data=data))
    assert bound.round_task(state, round_number=1).params.teacher.max_grad_norm is None
    config = PATE.bind(job, plan).encoding(task, participants=10, min_survivors=9)
    events = list(PATE.bind(job, plan).invitation_events(round_number=1, population=AGENTS))
    PATE.agent(parsed).check(events, config, num_clients=10, min_survivors=9, honest_fraction=1.0)
    teachers.clear_teacher_cache()
    votes = (
        PATE.agent(parsed)
        .compute(agents[0], model=None, public_x=data.public_x, device="cpu")
        .reshape(20, 10)
    )
    assert np.all(votes.sum(axis=1) == 1.0)
    # an old task without the new recipe fields still parses (plain recipe)
    raw = task.params.to_json()
    for key in ("augment_shift", "schedule", "validation_fraction", "patience", "max_grad_norm"):
        raw["teacher"].pop(key)
    old = PATE.parse_task(raw).teacher
    assert (old.schedule, old.max_grad_norm) == ("constant", None)
