"""The recipe search: candidates touch only what the document left unset, the best validation
accuracy on the proxy wins, each trial is recorded, and neither the agents' records nor the
proxy's test split is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.recipe_data import RecipeFiles, recipe_files

from dpfl.learning.algorithms.parts.data_sizes import simulated_federation
from dpfl.learning.data.registry import clear_dataset_cache, load_dataset
from dpfl.learning.jobs import RecipeTrial, parse_job
from dpfl.learning.recipes import AS_WRITTEN, RecipeError, candidates, proxy_job, search_recipe

pytestmark = pytest.mark.slow

#: Two candidates: a learning rate far too small to learn in two rounds, and a good one.
CANDIDATES = [{"params": {"learning_rate": 1e-4}}, {"params": {"learning_rate": 1.0}}]


@pytest.fixture
def files(tmp_path: Path) -> RecipeFiles:
    return recipe_files(tmp_path)


def test_candidates_set_only_what_the_document_left_unset() -> None:
    job = parse_job(
        {
            "name": "c",
            "algorithm": "dp-fedavg",
            "data": {"dataset": "digits"},
            "model": "logreg",
            "privacy": {"target_epsilon": 4.0},
            "params": {"learning_rate": 0.5, "clip": 1.0},
        }
    )
    found = candidates(job)
    assert found[0] == (AS_WRITTEN, {})
    for _, overrides in found[1:]:
        assert "model" not in overrides
        assert "learning_rate" not in overrides.get("params", {})  # type: ignore[operator]
    # candidates that differ only in what the user fixed collapse into one
    sets = [o for _, o in found]
    assert len(sets) == len({repr(o) for o in sets})
    assert any("features" in o.get("params", {}) for o in sets)  # type: ignore[operator]


def test_the_best_candidate_on_the_proxy_is_chosen_and_every_trial_kept(
    files: RecipeFiles,
) -> None:
    job = parse_job(files.job(candidates=CANDIDATES))
    seen: list[RecipeTrial] = []
    chosen = search_recipe(job, agents=4, progress=seen.append)
    record = chosen.recipe.chosen
    assert record is not None
    assert [t.name for t in record.trials] == [AS_WRITTEN, "candidate-1", "candidate-2"]
    assert list(record.trials) == seen
    slow, fast = record.trials[1].validation_accuracy, record.trials[2].validation_accuracy
    assert slow is not None
    assert fast is not None
    assert fast > slow + 0.2
    assert record.chosen == "candidate-2"
    assert chosen.params.learning_rate == 1.0  # type: ignore[attr-defined]
    assert chosen.params.sampling_rate == 1.0  # type: ignore[attr-defined]  # the user's
    assert chosen.privacy == job.privacy
    assert chosen.data == job.data
    assert record.proxy == f"npz:{files.proxy}"
    assert record.agents == 4
    # a chosen recipe is kept: searching again changes nothing
    assert search_recipe(chosen, agents=4) is chosen
    assert parse_job(chosen.model_dump(mode="json")) == chosen


def test_repeats_run_each_candidate_with_its_own_seeds_and_the_mean_decides(
    files: RecipeFiles,
) -> None:
    """``recipe.repeats: 2``: every trial lists two runs and is judged on their mean; its first
    run is the single-run search's figure (the first seed does not depend on ``repeats``)."""
    once = search_recipe(parse_job(files.job(candidates=CANDIDATES)), agents=4).recipe.chosen
    twice = search_recipe(
        parse_job(files.job(candidates=CANDIDATES, repeats=2)), agents=4
    ).recipe.chosen
    assert once is not None
    assert twice is not None
    assert [len(t.runs) for t in once.trials] == [1, 1, 1]
    assert [len(t.runs) for t in twice.trials] == [2, 2, 2]
    for single, double in zip(once.trials, twice.trials, strict=True):
        assert double.runs[0] == single.validation_accuracy
        assert double.validation_accuracy == pytest.approx(sum(double.runs) / 2, abs=1e-12)
    # the as-written job learns at a rate between the two: its two runs draw different noise
    assert twice.trials[0].runs[0] != twice.trials[0].runs[1]
    assert twice.chosen == "candidate-2"


def test_a_field_the_user_set_is_never_searched(files: RecipeFiles) -> None:
    """Both candidates set only the learning rate, which the user gave: nothing is left to
    search, and the search says so instead of running the job as written alone."""
    document = files.job(candidates=CANDIDATES)
    document["params"] = {**document["params"], "learning_rate": 1e-4}
    with pytest.raises(RecipeError, match=r"nothing to search: none of recipe\.candidates"):
        search_recipe(parse_job(document), agents=4)


def test_an_algorithm_without_candidates_needs_the_job_s_own() -> None:
    job = parse_job(
        {
            "name": "s",
            "algorithm": "dp-fedsgd",
            "data": {"dataset": "digits"},
            "privacy": {"unit": "record", "target_epsilon": 4.0},
            "recipe": {"search": True, "proxy": "mnist"},
        }
    )
    with pytest.raises(RecipeError, match="dp-fedsgd's candidates"):
        search_recipe(job, agents=4)


def test_a_candidate_that_cannot_run_is_a_trial_with_its_reason(files: RecipeFiles) -> None:
    bad: list[dict[str, Any]] = [{"model": "cnn"}, {"params": {"learning_rate": 1.0}}]
    chosen = search_recipe(parse_job(files.job(candidates=bad)), agents=4)
    record = chosen.recipe.chosen
    assert record is not None
    cnn = record.trials[1]
    assert cnn.validation_accuracy is None
    assert cnn.error is not None
    assert "image" in cnn.error
    assert record.chosen != cnn.name


def test_a_search_where_nothing_runs_names_every_reason(files: RecipeFiles) -> None:
    document = files.job(candidates=[{"model": "cnn"}])
    document["params"] = {"sampling_rate": 0.01}  # expects 0.04 participants of 4 agents
    with pytest.raises(RecipeError) as exc:
        search_recipe(parse_job(document), agents=4)
    assert "as-written:" in str(exc.value)
    assert "candidate-1:" in str(exc.value)


def test_the_search_reads_neither_the_agents_records_nor_the_proxy_test_split(
    files: RecipeFiles, tmp_path: Path
) -> None:
    # the proxy carries a test split of its own, which the holdout view must drop
    proxy = load_dataset(f"npz:{files.proxy}")
    poisoned = tmp_path / "proxy-with-test.npz"
    x, y = proxy.x_train.reshape(proxy.y_train.size, -1), proxy.y_train
    np.savez(poisoned, x=x, y=y, x_test=np.full((50, 64), 16.0), y_test=np.zeros(50, int))
    document = files.job(candidates=CANDIDATES[1:], proxy=f"npz:{poisoned}")
    job = parse_job(document)
    coordinator, agents = simulated_federation(proxy_job(job), 4)
    train_rows = {row.tobytes() for row in x}
    assert coordinator.test_x is not None
    assert all(r.tobytes() in train_rows for r in coordinator.test_x.reshape(-1, 64))
    assert all(r.tobytes() in train_rows for a in agents.values() for r in a.x.reshape(-1, 64))
    # the agents' file is gone: a search that read it would fail
    files.private.unlink()
    clear_dataset_cache()
    chosen = search_recipe(job, agents=4)
    assert chosen.recipe.chosen is not None
