"""``benchmarks/helmet_validation.py`` at its quick size: one JSON line per recipe with the
plan's noise, a validation set disjoint from the public pool and the agents' shares and drawn
from the training split only, and a softmax recipe whose noise is below one-vs-rest's."""

from __future__ import annotations

import json
import subprocess
import sys
from types import ModuleType

import numpy as np
import pytest
from support.paths import ROOT
from support.scripts import load_script

from dpfl.learning.data import load_dataset

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "helmet_validation.py"


def _module() -> ModuleType:
    return load_script(SCRIPT, "helmet_validation", register=True)  # dataclasses look it up


def test_the_validation_set_is_training_records_no_one_else_holds() -> None:
    dataset = load_dataset("digits")
    script = _module()
    parts = script.split(
        dataset, public_fraction=0.2, data_seed=0, validation=200, agents=10, seed=5
    )
    shares = np.concatenate(parts.shares)
    every = np.concatenate([parts.public, parts.validation, shares])
    assert len(parts.validation) == 200
    assert len(np.unique(every)) == len(every) == len(dataset.y_train)  # disjoint, all of train
    assert max(len(s) for s in parts.shares) - min(len(s) for s in parts.shares) <= 1
    again = script.split(
        dataset, public_fraction=0.2, data_seed=0, validation=200, agents=10, seed=5
    )
    np.testing.assert_array_equal(again.validation, parts.validation)
    with pytest.raises(SystemExit, match="too few records"):
        script.split(
            dataset, public_fraction=0.2, data_seed=0, validation=10_000, agents=10, seed=5
        )


def test_quick_run_prints_one_line_per_recipe() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--noise-draws", "2"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [r["recipe"]["loss"] for r in rows] == ["huber", "softmax"]
    for r in rows:
        assert r["features"].startswith("public-kmeans?centroids=16")
        assert 0.0 <= r["validation_accuracy"] <= 1.0
        assert r["without_noise"] > 0.3  # digits, 10 agents: far above chance without noise
        assert r["noise_std"] == pytest.approx(r["noise_multiplier"] * r["sensitivity"] / 10)
    huber, softmax = rows
    assert softmax["local_size"] == huber["local_size"]
    assert softmax["noise_std"] < 0.5 * huber["noise_std"]  # √(2/K) of it at the same Λ and ε
