"""``benchmarks/fedls_validation.py`` at its quick size: the validation set is training records
that no agent holds, and each (recipe, sampling, ε) gets one JSON line from whole simulations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from support.limits import hang_guard
from support.paths import ROOT
from support.scripts import load_script

from dpfl.learning.data import load_dataset

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "fedls_validation.py"


def _module() -> ModuleType:
    return load_script(SCRIPT, "fedls_validation", register=True)


def _rows(a: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in a.reshape(len(a), -1)}


def test_the_validation_set_is_held_out_training_records(tmp_path: Path) -> None:
    script = _module()
    path = tmp_path / "split.npz"
    sizes = script.write_split("digits", path, validation=0.1, seed=3, data_dir=None)
    data = load_dataset("digits")
    with np.load(path) as split:
        x, x_test = split["x"], split["x_test"]
        assert (len(x), len(x_test)) == sizes
        assert len(x) + len(x_test) == len(data.y_train)
        assert abs(len(x_test) - 0.1 * len(data.y_train)) <= 10  # stratified: ~10 % per class
        assert _rows(x) | _rows(x_test) == _rows(data.x_train)
        assert not _rows(x_test) & _rows(x)  # no agent holds a validation record
        assert not _rows(x_test) & _rows(data.x_test)  # the test split is not among them
    again = tmp_path / "again.npz"
    script.write_split("digits", again, validation=0.1, seed=3, data_dir=None)
    with np.load(path) as one, np.load(again) as two:
        np.testing.assert_array_equal(one["y_test"], two["y_test"])
    recipe = {"sigma_ls": 2.0, "server_optimizer": {"learning_rate": 2.0}}
    rows = script.rows_for(recipe, 4, npz=path, samplings=["uniform"], epsilons=[6.0, 9.0])
    assert [r.name for r in rows] == ["recipe4-uniform-eps6", "recipe4-uniform-eps9"]
    doc = rows[0].document()
    assert doc["data"]["dataset"] == f"npz:{path}"
    assert doc["privacy"]["target_epsilon"] == 6.0
    assert doc["params"]["sigma_ls"] == 2.0
    assert doc["params"]["client_sampling"] == "uniform"
    assert doc["params"]["server_optimizer"] == {
        "kind": "momentum",
        "learning_rate": 2.0,
        "momentum": 0.9,
    }


def test_quick_run_prints_one_line_per_recipe_sampling_and_epsilon() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--seeds", "1", "--epsilons", "7"],
        capture_output=True,
        text=True,
        timeout=hang_guard(30),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [(r["recipe"]["sigma_ls"], r["sampling"]) for r in lines] == [
        (0.0, "poisson"),
        (0.0, "uniform"),
        (1.0, "poisson"),
        (1.0, "uniform"),
    ]
    for line in lines:
        assert line["quick"] is True
        assert line["stop_reasons"] == [None]
        assert 0.0 <= line["mean"] <= 1.0
        assert line["epsilon"] <= 7.0
        assert line["validation_records"] > 0
