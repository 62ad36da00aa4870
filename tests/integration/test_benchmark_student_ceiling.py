"""``benchmarks/student_ceiling.py`` at its quick size: one JSON line per query count and seed,
the queries covering the classes, a student well above chance on records outside the pool, and
clear refusals of a pool the validation split cannot hold."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import ROOT
from support.scripts import load_script

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "student_ceiling.py"


def test_quick_run_prints_one_line_per_seed() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--seeds", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = map(json.loads, done.stdout.strip().splitlines())
    assert line["dataset"] == "digits"
    assert (line["queries"], line["pool"], line["steps"]) == (40, 100, 200)
    assert line["student"] == "consistency"  # the MNIST recipe's student
    assert line["classes_asked"] == 10  # k-means queries reach every class
    assert line["validation_accuracy"] > 0.5  # ten classes: chance is 0.1


def test_the_recipe_is_the_mnist_recipes_student() -> None:
    from dpfl.learning.algorithms.pate_fl import MNIST_TEACHERS

    script = load_script(SCRIPT, "student_ceiling")
    student, batch, rate = script.recipe()
    assert student.model_dump(exclude_defaults=True) == MNIST_TEACHERS["student"]
    assert (batch, rate) == (MNIST_TEACHERS["batch_size"], MNIST_TEACHERS["student_learning_rate"])


def test_a_pool_larger_than_the_validation_split_is_refused() -> None:
    script = load_script(SCRIPT, "student_ceiling")
    with pytest.raises(SystemExit, match="more than the 136 records of the validation split"):
        script.ceiling("digits", queries=10, pool=500, seed=1, steps=1)
