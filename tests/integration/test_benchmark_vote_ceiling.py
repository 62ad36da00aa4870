"""``benchmarks/vote_ceiling.py`` at its quick size: one JSON line per voting rule, the plan's
σ, the oracle's votes exactly its holders', abstaining teachers casting fewer votes than
voting ones, and noise that costs the oracle accuracy."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from support.paths import ROOT
from support.scripts import load_script

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "vote_ceiling.py"


def test_quick_run_prints_one_line_per_rule() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--noise-draws", "3"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["rule"]: r for r in map(json.loads, done.stdout.strip().splitlines())}
    assert set(rows) == {
        "nearest",
        "oracle",
        "abstain-0.8",
        "abstain-0.9",
        "abstain-0.95",
        "public-0.05",
        "public-0.1",
        "public-0.2",
    }
    sigma = {r["sigma_votes"] for r in rows.values()}
    assert len(sigma) == 1  # one calibration
    assert sigma.pop() > 1.0  # several votes of noise
    assert rows["nearest"]["mean_votes_cast"] == 20.0  # every teacher votes on every query
    # 20 agents on shards of 3 of 10 classes: each class has 6 holders
    assert rows["oracle"]["mean_votes_cast"] == 6.0
    assert rows["oracle"]["noiseless_accuracy"] == 1.0
    assert rows["oracle"]["noisy_accuracy"] < 1.0
    cast = [rows[f"abstain-{q}"]["mean_votes_cast"] for q in ("0.8", "0.9", "0.95")]
    assert cast == sorted(cast)
    assert cast[-1] < 20.0
    # a higher share of own neighbours asked for: fewer teachers vote
    cast = [rows[f"public-{t}"]["mean_votes_cast"] for t in ("0.05", "0.1", "0.2")]
    assert cast == sorted(cast, reverse=True)
    assert cast[-1] < 20.0


def test_the_oracle_counts_each_querys_holders_and_nearest_votes_once_per_teacher() -> None:
    script = load_script(SCRIPT, "vote_ceiling", register=True)  # dataclasses look it up
    setting = script.Setting(
        dataset="digits",
        agents=10,
        classes_per_agent=2,
        queries=30,
        epsilon=4.0,
        delta=1e-5,
        dim=8,
        noise_draws=1,
    )
    hist, truth = script.votes(setting)
    np.testing.assert_array_equal(hist["nearest"].sum(1), 10.0)
    oracle = hist["oracle"]
    assert (oracle[np.arange(30), truth] == oracle.sum(1)).all()  # only the true class
    assert (oracle.sum(1) == 2.0).all()  # 10 agents × 2 classes / 10 classes
    for rule in ("abstain-0.8", "abstain-0.9", "abstain-0.95", "public-0.05", "public-0.2"):
        assert (hist[rule] <= hist["nearest"]).all()  # abstaining only removes votes
    assert script.accuracy(oracle, truth, 0.0, 1) == 1.0


def test_the_own_share_counts_the_teachers_records_among_the_nearest() -> None:
    script = load_script(SCRIPT, "vote_ceiling", register=True)
    k = script.NEIGHBOURS
    # query 0: the k nearest are k/2 own records and k/2 public ones; query 1: all public;
    # query 2: all own
    to_own = np.array(
        [[1.0] * (k // 2) + [9.0] * k, [9.0] * (k // 2) + [9.0] * k, [0.5] * (k // 2) + [0.5] * k]
    )
    to_public = np.array([[2.0] * (k // 2) + [9.0] * k, [1.0] * (3 * k // 2), [5.0] * (3 * k // 2)])
    np.testing.assert_allclose(script._own_share(to_own, to_public), [0.5, 0.0, 1.0])
