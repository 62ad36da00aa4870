"""PATE-FL end to end over loopback gRPC: ten agents with teachers, a public query split, votes
summed by secure aggregation, a student trained by the coordinator.

The ledger must charge each voting client exactly the queries answered in each round, at the
configured level (record level: one record changes every vote of its agent's teacher).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.coordination import deadlines

from dpfl.accounting import SelfComposedEvent, SkellamEvent, event_from_json
from dpfl.client.local_ledger import LocalLedger
from dpfl.learning.jobs import JobSpec, parse_job
from dpfl.simulation import Simulation

JOB = {
    "name": "it-pate",
    "algorithm": "pate-fl",
    "data": {
        "dataset": "digits",
        "partition": {"scheme": "iid"},
        "public_fraction": 0.2,
        "test_fraction": 0.2,
    },
    "model": "logreg",
    "rounds": 2,
    "privacy": {"unit": "record", "delta": 1e-5, "target_epsilon": 8.0, "noise": "skellam"},
    "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.2},
    "params": {"queries": 20, "teacher_epochs": 5, "student_epochs": 10, "vote": "one-hot"},
}


def _run(job: JobSpec, database_url: str, workdir: Path, check: Callable[[Any, Any], None]) -> None:
    """Ten agents over loopback gRPC run ``job`` to completion; ``check`` reads the finished
    simulation and its result."""

    async def main() -> None:
        sim = Simulation(
            job,
            agents=10,
            transport="grpc",
            database_url=database_url,
            workdir=workdir,
            deadlines=deadlines(),
        )
        try:
            result = await sim.run()
            assert result.status == "completed", result.error
            check(sim, result)
        finally:
            await sim.close()

    asyncio.run(main())


def test_pate_fl_ten_agents_charges_exactly_the_answered_queries(
    coordinator_db: str, tmp_path: Path
) -> None:
    def check(sim: Any, result: Any) -> None:
        assert result.rounds_completed == 2
        assert "pseudo_label_accuracy" in result.metrics
        # 20 noisy labels, each right with p ≈ 0.55 here (12 runs: 0.40 to 0.70). "At least
        # 5 right" fails once in about 650 runs (P[Bin(20, 0.55) ≤ 4]); "at least 6" failed
        # once in about 160. Chance (p = 0.1) gets 5 or more in 4 % of runs.
        assert 0.25 <= result.metrics["pseudo_label_accuracy"] <= 1.0
        assert result.accuracy is not None
        store = sim.coordinator.store
        for rnd in store.list_rounds(sim.job_id):
            voters = set(rnd.survivors["masked_input"])
            entries = store.ledger_entries(round_id=rnd.id)
            assert {e.agent_id for e in entries} == voters  # only those whose votes counted
            for e in entries:
                event = event_from_json(e.event)
                assert isinstance(event, SelfComposedEvent)
                assert event.count == 10  # 20 queries answered in 2 batches
                inner = event.event
                assert isinstance(inner, SkellamEvent)
                assert inner.dimension == 10  # one vote per class
                # record level, one-hot votes: L1 = 2u, L2 = √2·u per query
                assert inner.l1_sensitivity == pytest.approx(
                    2**0.5 * inner.l2_sensitivity, rel=1e-9
                )
                assert e.unit.value == "record"
        assert store.verify_ledger().ok

    _run(parse_job(JOB), coordinator_db, tmp_path, check)


def test_capped_votes_are_charged_the_cap_in_both_ledgers(
    coordinator_db: str, tmp_path: Path
) -> None:
    """Agent level with ``vote_share`` 0.3: each round of 10 queries charges 3 one-coordinate
    releases, on the coordinator's ledger and on each agent's own, and the job stays within its
    target ε (docs/accounting.md#capped-votes)."""
    doc = {
        **JOB,
        "name": "it-pate-capped",
        "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 8.0, "noise": "skellam"},
        "params": {**JOB["params"], "vote_share": 0.3},
    }

    def check(sim: Any, result: Any) -> None:
        del result
        store = sim.coordinator.store
        for rnd in store.list_rounds(sim.job_id):
            for e in store.ledger_entries(round_id=rnd.id):
                event = event_from_json(e.event)
                assert isinstance(event, SelfComposedEvent)
                assert event.count == 3  # ⌈0.3·10⌉ of each round's 10 queries
                assert isinstance(event.event, SkellamEvent)
                assert event.event.dimension == 1
        assert store.verify_ledger().ok
        states = sorted((tmp_path / "agents").iterdir())
        assert len(states) == 10
        for state in states:
            ledger = LocalLedger.open(state)
            try:
                entries = ledger.entries()
                assert len(entries) == 2
                assert all(e.events[0].count == 3 for e in entries)  # type: ignore[attr-defined]
                assert ledger.epsilon(delta=1e-5) <= 8.0 + 1e-6
            finally:
                ledger.close()

    _run(parse_job(doc), coordinator_db, tmp_path, check)
