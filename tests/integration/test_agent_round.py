"""Real agents through whole rounds against a scripted coordinator: in process and over gRPC.

Real task loop, real secagg state machines on both sides, real wire conversion, real SQLite
ledgers and policies; only the coordinator is a small test script (tests/support).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from support.agent_kit import JOB, ExactSum, fedavg_round, federation, publish

from dpfl.accounting import event_to_json
from dpfl.client.progress import EventKind


async def _exact_round(tmp_path: Path, transport: str) -> None:
    exact = ExactSum()
    setup = fedavg_round(exact, population=4)
    async with federation(tmp_path, transport, 4, algorithms={"dp-fedavg": exact}) as (
        coordinator,
        agents,
    ):
        publish(coordinator, setup)
        report = await coordinator.run_round(
            job_id=JOB,
            round=1,
            agents=[a.agent_id for a in agents],
            algorithm=exact,
            job=setup.job,
            plan=setup.plan,
            task=setup.task,
        )
        await asyncio.sleep(0.05)  # let the agents see RoundResult
        assert report.aborted == ""
        assert report.survivors == {a.agent_id for a in agents}
        dimension = setup.task.vector_length
        bits = int(setup.plan.details.scale_bits)
        expected = sum(
            ExactSum.vector_for(a.data, dimension=dimension, scale_bits=bits) for a in agents
        )
        assert report.aggregate is not None
        np.testing.assert_array_equal(report.aggregate, expected)
        assert np.count_nonzero(expected) > 0
        claimed = exact.bind(setup.job, setup.plan).invitation_events(
            round_number=1, population=[a.agent_id for a in agents]
        )
        recorded = exact.agent(setup.task.params).charge(claimed)
        for agent in agents:
            entries = agent.ledger.entries()
            assert [(e.job_id, e.round) for e in entries] == [(JOB, 1)]
            assert len(entries[0].attempt) == 32  # the agent's own random attempt id, hex
            assert len(entries[0].session_id) == 64  # the coordinator's session id, hex
            assert len(entries[0].sent_sha256) == 64  # the digest of what was sent
            assert [event_to_json(e) for e in entries[0].events] == [
                event_to_json(e) for e in recorded
            ]
            kinds = agent.kinds()
            assert kinds.index("charged") < kinds.index("masked-input-sent")
            result = [e for e in agent.events if e.kind is EventKind.RESULT]
            assert result[-1].data["completed"] is True


def test_a_round_in_process_sums_exactly(tmp_path: Path) -> None:
    asyncio.run(_exact_round(tmp_path, "inproc"))


def test_a_round_over_grpc_sums_exactly(tmp_path: Path) -> None:
    asyncio.run(_exact_round(tmp_path, "grpc"))


async def _dp_fedavg_round(tmp_path: Path) -> None:
    setup = fedavg_round(population=3)
    async with federation(tmp_path, "inproc", 3) as (coordinator, agents):
        publish(coordinator, setup)
        report = await coordinator.run_round(
            job_id=JOB,
            round=1,
            agents=[a.agent_id for a in agents],
            algorithm=setup.algorithm,
            job=setup.job,
            plan=setup.plan,
            task=setup.task,
        )
        assert report.aborted == ""
        assert report.aggregate is not None
        assert report.aggregate.shape == (setup.task.vector_length,)
        assert np.isfinite(report.aggregate).all()
        for agent in agents:
            assert len(agent.ledger.entries()) == 1
            trained = [e for e in agent.events if e.kind is EventKind.TRAINED]
            assert trained, agent.kinds()


def test_a_real_dp_fedavg_round_trains_encodes_and_charges(tmp_path: Path) -> None:
    asyncio.run(_dp_fedavg_round(tmp_path))
