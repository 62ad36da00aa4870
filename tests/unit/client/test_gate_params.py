"""The task's privacy parameters reach the policy typed: a value outside what every dpfl algorithm
sends is refused when the task is parsed, naming the field, and a well-formed one is decided by
the local policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.algorithm_harness import make_job

from dpfl.client.gate import InvitationReview, LocalGate
from dpfl.client.local_ledger import LocalLedger
from dpfl.client.policy import Policy
from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData
from dpfl.learning.algorithms.dp_fedavg import DpFedAvg

ALGORITHM = DpFedAvg()
DATA = CoordinatorData(input_shape=(64,), num_classes=10)
JOB = make_job(name="gate-params", params={"sampling_rate": 0.3})
PLAN = ALGORITHM.plan(JOB, population=10, data=DATA)
TASK: dict[str, Any] = (
    ALGORITHM.bind(JOB, PLAN)
    .round_task(ALGORITHM.bind(JOB, PLAN).initial_state(DATA), round_number=1)
    .params.to_json()
)


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[LocalGate]:
    with LocalLedger.open(tmp_path) as ledger:
        yield LocalGate(
            policy=Policy(require_secure_aggregation=True, allow_approximate=False), ledger=ledger
        )


def _review(**changes: object) -> InvitationReview:
    task = ALGORITHM.parse_task({**TASK, **changes})
    claimed = tuple(
        ALGORITHM.bind(JOB, PLAN).invitation_events(round_number=1, population=["a"] * 10)
    )
    return InvitationReview(
        job_id="j",
        job_name=JOB.name,
        round=1,
        algorithm=ALGORITHM.name,
        task=task,
        claimed=claimed,
        charge=ALGORITHM.agent(task).charge(claimed),
    )


def test_the_task_params_reach_the_policy(gate: LocalGate) -> None:
    assert gate.review(_review()).accept
    off = gate.review(_review(secure_aggregation=False))
    assert not off.accept
    assert "require_secure_aggregation" in off.reason
    approximate = gate.review(_review(noise="gaussian"))
    assert not approximate.accept
    assert "allow_approximate" in approximate.reason


def test_the_charge_records_the_tasks_unit(gate: LocalGate) -> None:
    review = _review()
    gate.charge(review, attempt="a1", session_id=b"\x5e" * 32, sent_sha256=b"\xab" * 32)
    (entry,) = gate.ledger.entries()
    assert entry.unit == review.task.unit == JOB.privacy.unit == "agent"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("secure_aggregation", "yes"),
        ("secure_aggregation", 1),
        ("honest_fraction", "all"),
        ("honest_fraction", True),
        ("honest_fraction", 0.0),
        ("honest_fraction", -0.5),
        ("honest_fraction", 1.5),
        ("honest_fraction", float("nan")),
        ("noise", "laplace"),
        ("noise", None),
    ],
)
def test_a_malformed_privacy_parameter_is_refused_naming_it(key: str, value: object) -> None:
    wire = json.dumps({**TASK, key: value})  # as it arrives: NaN is the text ``NaN`` here
    with pytest.raises(AlgorithmError, match=f"params.{key}"):
        ALGORITHM.parse_task(wire)
