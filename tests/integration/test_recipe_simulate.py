"""``dpfl.simulate`` and ``dpfl recipe`` of a job that asks for a recipe search: the simulation's
coordinator chooses the recipe at submission and its JSON line shows the choice; the command
prints the candidates' validation figures and saves the job with its choice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.recipe_data import RecipeFiles, recipe_files

import dpfl
from dpfl.learning.jobs import load_job

pytestmark = pytest.mark.slow

CANDIDATES = [{"params": {"learning_rate": 1e-4}}, {"params": {"learning_rate": 1.0}}]


@pytest.fixture
def files(tmp_path: Path) -> RecipeFiles:
    return recipe_files(tmp_path)


def _calibrated(files: RecipeFiles) -> dict[str, Any]:
    document = files.job(candidates=CANDIDATES)
    document["privacy"] = {"unit": "agent", "target_epsilon": 8.0, "delta": 1e-5}
    return document


def test_the_simulation_reports_the_recipe_its_coordinator_chose(files: RecipeFiles) -> None:
    result = dpfl.simulate(
        _calibrated(files), 4, budget_epsilon=100.0, agent_max_epsilon_per_job=100.0
    )
    line = json.loads(result.to_json())
    recipe = line["recipe"]
    chosen = recipe["chosen"]
    assert chosen is not None
    assert chosen["agents"] == 4
    best = max(chosen["trials"], key=lambda t: t["validation_accuracy"])
    assert chosen["chosen"] == best["name"]
    assert "params.learning_rate" in recipe["defaults"]
    set_by_search = {f"params.{k}" for k in chosen["overrides"].get("params", {})}
    assert set(recipe["defaults_used"]) == set(recipe["defaults"]) - set_by_search
    assert line["status"] == "completed"


def test_a_job_without_a_search_reports_its_defaults_only(files: RecipeFiles) -> None:
    document = _calibrated(files)
    document.pop("recipe")
    line = json.loads(
        dpfl.simulate(document, 4, budget_epsilon=100.0, agent_max_epsilon_per_job=100.0).to_json()
    )
    assert line["recipe"]["chosen"] is None
    assert "params.clip" in line["recipe"]["defaults"]
    assert line["recipe"]["defaults_used"] == line["recipe"]["defaults"]


def test_dpfl_simulate_says_which_defaults_were_used(files: RecipeFiles, tmp_path: Path) -> None:
    document = _calibrated(files)
    document.pop("recipe")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    done = _dpfl(
        "simulate",
        str(job),
        "--agents",
        "4",
        "--transport",
        "inproc",
        "--budget-epsilon",
        "100",
        "--agent-max-epsilon-per-job",
        "100",
    )
    assert done.returncode == 0, done.stderr
    text = " ".join((done.stdout + done.stderr).split())
    assert "defaults used: model, params.features" in text
    assert "(their values: dpfl recipe JOB)" in text


def _dpfl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dpfl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_dpfl_recipe_prints_the_choice_and_writes_the_job(
    files: RecipeFiles, tmp_path: Path
) -> None:
    document = files.job(candidates=CANDIDATES)
    # no search in the job: --proxy asks; two runs of each candidate
    document["recipe"] = {"candidates": CANDIDATES, "repeats": 2}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    out = tmp_path / "chosen.yaml"
    done = _dpfl(
        "recipe",
        str(job),
        "--proxy",
        f"npz:{files.proxy}",
        "--agents",
        "4",
        "--json",
        "--write",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["chosen"]["chosen"] == "candidate-2"
    assert summary["defaults"]["params.learning_rate"] == 1.0
    assert "candidate-1: " in done.stderr  # each trial as it ends, with its runs
    assert re.search(r"candidate-2: 0\.\d{4} \(runs 0\.\d{4} / 0\.\d{4}\)", done.stderr)
    assert all(len(t["runs"]) == 2 for t in summary["chosen"]["trials"])
    written = load_job(out)
    assert written.recipe.chosen is not None
    assert written.recipe.chosen.chosen == "candidate-2"


def test_dpfl_recipe_without_a_search_lists_the_defaults(
    files: RecipeFiles, tmp_path: Path
) -> None:
    document = files.job()
    document.pop("recipe")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    done = _dpfl("recipe", str(job))
    assert done.returncode == 0, done.stderr
    assert "params.learning_rate" in done.stdout
    assert "0.1" in done.stdout


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--proxy", "imagenet"], "unknown dataset 'imagenet'"),
        (["--agents", "1"], "--agents must be >= 2"),
    ],
)
def test_dpfl_recipe_refuses_bad_arguments(
    files: RecipeFiles, tmp_path: Path, extra: list[str], says: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(files.job()))
    done = _dpfl("recipe", str(job), *extra)
    assert done.returncode == 2
    assert says in done.stderr
