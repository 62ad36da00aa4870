"""The gate reads the task's privacy parameters before the policy decides: a value outside what
every dpfl algorithm sends is declined, whatever the algorithm's own parsing let through."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dpfl.accounting import SkellamEvent
from dpfl.client.gate import InvitationReview, LocalGate
from dpfl.client.local_ledger import LocalLedger
from dpfl.client.policy import Policy

SKELLAM = SkellamEvent(
    mu=(2.0 * 1024.6) ** 2 / 2, l1_sensitivity=26121.9, l2_sensitivity=1024.6, dimension=650
)
BASE = {"secure_aggregation": True, "honest_fraction": 1.0, "noise": "skellam"}


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[LocalGate]:
    with LocalLedger.open(tmp_path) as ledger:
        yield LocalGate(
            policy=Policy(require_secure_aggregation=True, allow_approximate=False), ledger=ledger
        )


def _review(params: Mapping[str, Any]) -> InvitationReview:
    return InvitationReview(
        job_id="j",
        job_name="demo",
        round=1,
        algorithm="dp-fedavg",
        params=params,
        claimed=(SKELLAM,),
        charge=(SKELLAM,),
    )


def test_the_task_params_reach_the_policy(gate: LocalGate) -> None:
    assert gate.review(_review(BASE)).accept
    assert gate.review(_review({})).accept  # the defaults: secure, t = 1, Skellam, provable
    off = gate.review(_review({**BASE, "secure_aggregation": False}))
    assert not off.accept
    assert "require_secure_aggregation" in off.reason
    approximate = gate.review(_review({**BASE, "noise": "gaussian"}))
    assert not approximate.accept
    assert "allow_approximate" in approximate.reason
    opted = gate.review(_review({**BASE, "accounting": "sum-dominating"}))
    assert opted.accept, opted.reason


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("secure_aggregation", "yes", "secure_aggregation"),
        ("honest_fraction", "all", "honest_fraction"),
        ("honest_fraction", True, "honest_fraction"),
        ("honest_fraction", 0.0, "honest_fraction"),
        ("honest_fraction", -0.5, "honest_fraction"),
        ("honest_fraction", 1.5, "honest_fraction"),
        ("honest_fraction", float("nan"), "honest_fraction"),
        ("noise", "laplace", "noise"),
        ("noise", None, "noise"),
        ("accounting", "optimistic", "accounting"),
    ],
)
def test_a_malformed_privacy_parameter_is_declined_naming_it(
    gate: LocalGate, key: str, value: object, problem: str
) -> None:
    decision = gate.review(_review({**BASE, key: value}))
    assert not decision.accept
    assert f"params.{problem}" in decision.reason
