"""The job's ``recipe`` section: what it refuses, the defaults it records, and the ``holdout``
view of a data set that a search validates on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpfl.learning.data.registry import load_dataset
from dpfl.learning.errors import DatasetError
from dpfl.learning.jobs import JobSpecError, job_to_dict, parse_job

BASE: dict[str, Any] = {
    "name": "r",
    "algorithm": "dp-fedavg",
    "privacy": {"target_epsilon": 4.0},
}


def _job(**extra: Any) -> Any:
    return parse_job({**BASE, **extra})


def test_the_fields_left_to_defaults_are_recorded_once_and_survive_storage() -> None:
    job = _job(model="logreg", params={"clip": 2.0, "learning_rate": 0.5})
    defaults = job.recipe.defaults
    assert defaults is not None
    assert "rounds" in defaults
    assert "params.sampling_rate" in defaults
    assert "model" not in defaults
    assert "params.clip" not in defaults
    assert "params.learning_rate" not in defaults
    stored = parse_job(job_to_dict(job))  # every default is filled in there
    assert stored == job
    assert stored.recipe.defaults == defaults


def test_a_job_that_states_every_field_leaves_nothing_to_defaults() -> None:
    full = job_to_dict(_job())
    full.pop("recipe")
    assert parse_job(full).recipe.defaults == ()


@pytest.mark.parametrize(
    ("recipe", "says"),
    [
        ({"search": True}, "recipe.proxy: a search simulates the job on a labelled public"),
        ({"proxy": "digits"}, "recipe.proxy: 'digits' is the agents' own data set"),
        ({"proxy": "mnist?holdout=0.1"}, "give the proxy's holdout as recipe.holdout"),
        ({"proxy": "imagenet"}, "unknown dataset 'imagenet'"),
        ({"holdout": 0.9, "proxy": "mnist"}, "recipe.holdout"),
        ({"agents": 1, "proxy": "mnist"}, "recipe.agents"),
        ({"repeats": 0, "proxy": "mnist"}, "recipe.repeats"),
        ({"repeats": 4, "proxy": "mnist"}, "recipe.repeats"),
        ({"colour": "red"}, "recipe.colour: unknown field"),
    ],
)
def test_bad_recipes_are_refused_naming_the_field(recipe: dict[str, Any], says: str) -> None:
    with pytest.raises(JobSpecError) as exc:
        _job(recipe=recipe)
    assert says in str(exc.value)


def test_a_stored_choice_must_name_one_of_its_trials() -> None:
    trial = {"name": "as-written", "overrides": {}, "validation_accuracy": 0.5}
    chosen = {"proxy": "mnist", "agents": 10, "overrides": {}, "trials": [trial]}
    assert _job(recipe={"chosen": {**chosen, "chosen": "as-written"}}).recipe.chosen is not None
    with pytest.raises(JobSpecError, match="names none of the trials"):
        _job(recipe={"chosen": {**chosen, "chosen": "other"}})


@pytest.mark.parametrize(
    ("trial", "says"),
    [
        ({"validation_accuracy": 0.5, "runs": [0.4, 0.5]}, "not the mean of its runs"),
        ({"runs": [0.4, 0.6]}, "not the mean of its runs"),
        ({"validation_accuracy": 0.75, "runs": [0.5, 1.0001]}, "outside [0, 1]"),
        ({"validation_accuracy": 0.5, "runs": [0.5] * 4}, "runs"),
    ],
)
def test_a_stored_trial_s_runs_must_give_its_figure(trial: dict[str, Any], says: str) -> None:
    """A stored choice is shown by REST and the dashboard as it is: its figure must be the mean
    of the runs it lists, and it lists at most ``MAX_REPEATS``."""
    good = {"name": "as-written", "overrides": {}, "validation_accuracy": 0.5, "runs": [0.4, 0.6]}
    chosen = {"proxy": "mnist", "agents": 10, "overrides": {}, "chosen": "as-written"}
    assert _job(recipe={"chosen": {**chosen, "trials": [good]}}).recipe.chosen is not None
    bad = {"name": "as-written", "overrides": {}, **trial}
    with pytest.raises(JobSpecError) as exc:
        _job(recipe={"chosen": {**chosen, "trials": [bad]}})
    assert says in str(exc.value)


def test_the_holdout_view_reads_the_training_split_only() -> None:
    base = load_dataset("digits")
    view = load_dataset("digits?holdout=0.25&holdout_seed=3")
    assert view.y_train.size + view.y_test.size == base.y_train.size
    train_rows = {row.tobytes() for row in base.x_train.reshape(base.y_train.size, -1)}
    test_rows = {row.tobytes() for row in base.x_test.reshape(base.y_test.size, -1)}
    held = [row.tobytes() for row in view.x_test.reshape(view.y_test.size, -1)]
    assert all(row in train_rows for row in held)
    assert not any(row in test_rows and row not in train_rows for row in held)
    # stratified: every class keeps its share in the held-out part
    shares = np.bincount(view.y_test, minlength=10) / np.bincount(base.y_train, minlength=10)
    assert np.allclose(shares, 0.25, atol=0.02)
    again = load_dataset("digits?holdout=0.25&holdout_seed=3", cache=False)
    assert np.array_equal(again.y_test, view.y_test)


@pytest.mark.parametrize(
    "spec", ["digits?holdout=0", "digits?holdout=0.95", "digits?holdout_seed=1"]
)
def test_a_bad_holdout_is_refused(spec: str) -> None:
    with pytest.raises(DatasetError, match="holdout"):
        load_dataset(spec)


def test_a_job_may_validate_on_a_holdout_view() -> None:
    job = _job(data={"dataset": "digits?holdout=0.2"})
    assert job.data.dataset == "digits?holdout=0.2"


def test_every_algorithm_s_candidates_make_valid_jobs() -> None:
    """Each candidate of each algorithm's list parses on a job of that algorithm with a public
    pool (a broken table would only show as a failed trial)."""
    from dpfl.learning.algorithms.registry import algorithm_names, get_algorithm
    from dpfl.learning.recipes import with_recipe

    tried = 0
    for name in algorithm_names():
        document = {
            "name": "c",
            "algorithm": name,
            "data": {"dataset": "mnist", "public": {"source": "test", "fraction": 0.3}},
            "privacy": {"target_epsilon": 4.0},
        }
        base = parse_job(document)
        for candidate, overrides in get_algorithm(name).recipe_candidates.items():
            job = with_recipe(base, overrides)
            assert job.algorithm == name, candidate
            tried += 1
    assert tried >= 13


def test_the_defaults_used_are_those_the_chosen_recipe_left() -> None:
    trial = {
        "name": "x",
        "overrides": {"params": {"learning_rate": 1.0}},
        "validation_accuracy": 0.9,
    }
    chosen = {"proxy": "mnist", "agents": 10, "chosen": "x", "trials": [trial]}
    job = _job(recipe={"chosen": {**chosen, "overrides": trial["overrides"]}})
    assert job.recipe.defaults is not None
    assert "params.learning_rate" in job.recipe.defaults
    assert "params.learning_rate" not in job.recipe.defaults_used()
    assert set(job.recipe.defaults_used()) == set(job.recipe.defaults) - {"params.learning_rate"}


def test_a_search_runs_at_most_sixteen_candidates() -> None:
    many = [{"params": {"learning_rate": 0.1 * (i + 1)}} for i in range(17)]
    with pytest.raises(JobSpecError, match=r"recipe\.candidates"):
        _job(recipe={"candidates": many})
    assert _job(recipe={"candidates": many[:16]}).recipe.candidates is not None
