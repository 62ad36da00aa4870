"""PATE-FL end to end with the paper's split: 30 % of the test split is the public pool, the other
70 % the test set; the coordinator's own data load (the one the job runs on) is checked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpfl.learning.data import load_dataset
from dpfl.learning.jobs import parse_job
from dpfl.server.orchestrator import runner
from dpfl.server.orchestrator.data import JobData
from dpfl.simulation import simulate_job

JOB = {
    "name": "it-pate-test-pool",
    "algorithm": "pate-fl",
    "data": {
        "dataset": "digits",
        "partition": "iid",
        "public": {"source": "test", "fraction": 0.3},
    },
    "model": "logreg",
    "rounds": 2,
    "privacy": {"unit": "record", "delta": 1e-5, "target_epsilon": 8.0, "noise": "skellam"},
    "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.05},
    "params": {"queries": 40, "teacher_epochs": 5, "student_epochs": 10, "vote": "one-hot"},
}


def test_pate_fl_with_a_pool_from_the_test_split(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[JobData] = []
    original = runner.load_job_data

    def spy(*args: Any, **kwargs: Any) -> JobData:
        loaded.append(original(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(runner, "load_job_data", spy)
    job = parse_job(JOB)
    result = simulate_job(job, agents=4, transport="inproc")
    assert result.status == "completed", result.error
    assert result.rounds_completed == 2
    assert result.accuracy is not None

    digits = load_dataset("digits")
    n_test = len(digits.y_test)  # 450: digits' own stratified 25 % test split
    per_class = np.bincount(digits.y_test, minlength=10)
    pool_size = int(sum(round(0.3 * n) for n in per_class))
    assert loaded, "the coordinator never loaded the job's data"
    data = loaded[-1].data
    assert data.public_x is not None
    assert data.test_x is not None
    assert len(data.public_x) == pool_size  # 30 % of the test split, stratified
    assert len(data.test_x) == n_test - pool_size  # the other 70 %: the test set
    assert loaded[-1].public is not None  # agents download the whole pool to vote on it
