"""The reported plain PATE-FL job is calibrated (issue 34, item 4).

Fashion-MNIST, shards of 2 classes, the public pool from 30 % of the test split, agent level,
δ = 1e-5, ε = 2: the calibration used to fail before the first round with an ``IndexError`` of
dp_accounting (the search tried vote noise σ = 64; from σ = 32 on scipy's Bessel function of the
Skellam masses is NaN: tests/unit/accounting/test_tight_failures.py). The calibration depends on
the data only through the number of classes, so this also covers the digits job of the same
privacy spec.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpfl.learning.algorithms.pate_fl import ALGORITHM
from dpfl.learning.jobs import parse_job

REPORTED_JOB = {
    "name": "pate-fashion",
    "algorithm": "pate-fl",
    "data": {
        "dataset": "fashion-mnist",
        "partition": {"scheme": "shards", "classes_per_agent": 2},
        "public": {"source": "test", "fraction": 0.3},
    },
    "privacy": {"unit": "agent", "delta": 1.0e-5, "target_epsilon": 2.0},
}


@pytest.mark.parametrize("agents", [20, 100])
def test_the_reported_job_is_calibrated_on_the_tight_path(
    agents: int, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPFL_DATA_DIR", str(shared_data_dir))
    plan = ALGORITHM.plan(parse_job(REPORTED_JOB), population=agents)
    record = plan.calibration
    assert record["mode"] == "calibrated"
    assert record["method"] == "pld"
    assert record["epsilon"] <= 2.0
    assert record["epsilon"] == record["tight_epsilon"] < record["rdp_epsilon"]
    # 200 one-hot queries at agent level, Skellam noise: σ ≈ 28.3 votes (RDP alone needs more)
    assert plan.noise_multiplier == pytest.approx(28.33, rel=2e-3)
