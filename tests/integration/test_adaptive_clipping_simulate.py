"""Adaptive clipping through the whole system (``dpfl.simulate``: the coordinator, its store,
secure aggregation and in-process agents): the clip the coordinator learns survives from round
to round in the stored state, and the JSON line reports it."""

from __future__ import annotations

from typing import Any

import pytest

import dpfl

pytestmark = pytest.mark.slow

JOB: dict[str, Any] = {
    "name": "adaptive-clip",
    "algorithm": "dp-fedavg",
    "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
    "model": "logreg",
    "rounds": 3,
    "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 4.0, "noise": "skellam"},
    "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.05},
    "params": {
        "clip": 5.0,
        "sampling_rate": 1.0,
        "local_steps": 2,
        "learning_rate": 0.5,
        "adaptive_clipping": {"clip_learning_rate": 2.0, "count_noise": 1.5},
    },
}


def test_the_learned_clip_is_kept_between_rounds_and_reported() -> None:
    result = dpfl.simulate(JOB, 10)
    assert (result.status, result.rounds_completed) == ("completed", 3)
    # round 3 ran at the clip that rounds 1 and 2 learned: a state that lost it would run at 5
    clip = result.metrics["clip"]
    assert clip != 5.0
    assert 0 < clip < 5.0 * 2.0**20
    assert result.to_dict()["metrics"]["clip"] == clip
    assert "clipped_fraction" in result.metrics
    assert max(result.epsilon.values()) <= 4.0 + 1e-6
