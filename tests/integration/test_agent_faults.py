"""Agents refusing what their policy, ledger or the setup's noise forbid, and surviving faults.

Real agents against a scripted coordinator that ignores budgets and can misbehave; see
tests/integration/test_agent_round.py for the happy path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from pathlib import Path

import numpy as np
from support.agent_kit import (
    JOB,
    AgentHandle,
    ExactSum,
    fedavg_round,
    federation,
    publish,
    start_agent,
)
from support.scripted_coordinator import ScriptedCoordinator, start_grpc

from dpfl.client.local_ledger import LEDGER_FILENAME, LocalLedger
from dpfl.client.policy import Policy
from dpfl.client.progress import AgentEvent, EventKind
from dpfl.client.transport import GrpcTransport
from dpfl.mechanisms import EncodingConfig, NoiseSpec
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import SeededRandomSource


def _run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 90))  # type: ignore[arg-type]


async def _event(agent: AgentHandle, kind: EventKind, *, timeout: float = 10.0) -> AgentEvent:
    """The agent's first event of ``kind``, waiting for it."""
    async with asyncio.timeout(timeout):
        while True:
            found = [e for e in agent.events if e.kind is kind]
            if found:
                return found[0]
            await asyncio.sleep(0.01)


async def _entries(agent: AgentHandle, expected: int, *, timeout: float = 5.0) -> int:
    """The number of local ledger entries once it reaches ``expected`` (or the timeout)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while len(agent.ledger.entries()) != expected and loop.time() < end:
        await asyncio.sleep(0.01)
    return len(agent.ledger.entries())


def test_agents_decline_over_budget_or_disallowed_jobs(tmp_path: Path) -> None:
    async def main() -> None:
        setup = fedavg_round(population=2)
        strict = Policy(max_epsilon_per_job=0.01, max_epsilon_total=0.01)
        for policy, rule in (
            (strict, "max_epsilon_per_job"),
            (Policy(allowed_algorithms=("pate-fl",)), "allowed_algorithms"),
        ):
            async with federation(tmp_path / rule, "inproc", 2, policy=policy) as (coord, agents):
                publish(coord, setup)
                report = await coord.run_round(
                    job_id=JOB,
                    round=1,
                    agents=[a.agent_id for a in agents],
                    algorithm=setup.algorithm,
                    job=setup.job,
                    plan=setup.plan,
                    task=setup.task,
                )
                assert report.accepted == []
                assert set(report.declined) == {a.agent_id for a in agents}
                assert all(rule in reason for reason in report.declined.values())
                for agent in agents:
                    assert agent.ledger.entries() == []
                assert coord.downloads == []

    _run(main())


def test_a_setup_whose_noise_is_below_the_claim_is_refused_before_any_work(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        setup = fedavg_round(population=3)

        def thin_noise(encoding: EncodingConfig) -> EncodingConfig:
            return dataclasses.replace(encoding, noise=NoiseSpec.none())

        async with federation(tmp_path, "inproc", 3) as (coord, agents):
            publish(coord, setup)
            report = await coord.run_round(
                job_id=JOB,
                round=1,
                agents=[a.agent_id for a in agents],
                algorithm=setup.algorithm,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
                setup_hook=thin_noise,
            )
            assert len(report.accepted) == 3
            assert report.aborted.startswith("ADVERTISE_KEYS")
            for agent in agents:
                (error,) = report.errors[agent.agent_id]
                assert error.code == pb.ERROR_POLICY_DECLINED
                assert "does not back the claimed privacy" in error.message
                assert error.header.stage == pb.STAGE_ADVERTISE_KEYS
                assert agent.ledger.entries() == []
                kinds = agent.kinds()
                assert "left-round" in kinds
                assert "training" not in kinds

    _run(main())


def test_the_charge_is_on_disk_before_the_masked_input_leaves_and_survives_a_dropped_link(
    tmp_path: Path,
) -> None:
    """Each masked input is checked on arrival against the agent's ledger FILE (a separate
    connection); then one agent's link is cut right after its masked input: it is still summed,
    keeps its charge, reconnects, and takes part in the next round."""

    async def main() -> None:
        exact = ExactSum()
        setup = fedavg_round(exact, population=4)
        seen: dict[str, int] = {}
        async with federation(tmp_path, "inproc", 4, algorithms={"dp-fedavg": exact}) as (
            coord,
            agents,
        ):
            publish(coord, setup)
            victim = agents[1].agent_id

            async def on_masked_input(agent_id: str) -> None:
                path = tmp_path / agent_id / LEDGER_FILENAME
                with sqlite3.connect(path) as conn:
                    seen[agent_id] = conn.execute(
                        "SELECT COUNT(*) FROM charges WHERE job_id = ? AND round = 1", (JOB,)
                    ).fetchone()[0]
                if agent_id == victim:
                    coord.drop(agent_id)

            report = await coord.run_round(
                job_id=JOB,
                round=1,
                agents=[a.agent_id for a in agents],
                algorithm=exact,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
                masked_input_hook=on_masked_input,
            )
            assert seen == {a.agent_id: 1 for a in agents}
            assert report.aborted == ""
            assert victim in report.survivors  # counted after masking
            bits = int(setup.plan.details.scale_bits)
            expected = sum(
                ExactSum.vector_for(a.data, dimension=setup.task.vector_length, scale_bits=bits)
                for a in agents
            )
            np.testing.assert_array_equal(report.aggregate, expected)
            dropped = agents[1]
            left = [e for e in dropped.events if e.kind is EventKind.LEFT_ROUND]
            assert left[-1].data["charged"] is True
            assert len(dropped.ledger.entries()) == 1
            # it reconnects and serves the next round
            await coord.wait_connected([victim])
            assert dropped.runner.connections == 2
            task2 = exact.bind(setup.job, setup.plan).round_task(setup.state, round_number=2)
            report2 = await coord.run_round(
                job_id=JOB,
                round=2,
                agents=[a.agent_id for a in agents],
                algorithm=exact,
                job=setup.job,
                plan=setup.plan,
                task=task2,
            )
            assert report2.aborted == ""
            assert report2.survivors == {a.agent_id for a in agents}
            for agent in agents:
                assert [e.round for e in agent.ledger.entries()] == [1, 2]

    _run(main())


def test_agents_survive_the_coordinator_vanishing_mid_round(tmp_path: Path) -> None:
    """The gRPC server stops after the first masked input arrives; the agents drop the round
    (those that sent keep their charge), retry with backoff, and serve the restarted server."""

    async def main() -> None:
        exact = ExactSum()
        setup = fedavg_round(exact, population=3)
        coord = ScriptedCoordinator()
        publish(coord, setup)
        server, address = await start_grpc(coord)
        port = int(address.rsplit(":", 1)[1])
        channels = [GrpcTransport(address, insecure=True) for _ in range(3)]
        agents = []
        for i, channel in enumerate(channels):
            agent_id = f"agent-{i}"
            agents.append(
                start_agent(
                    agent_id=agent_id,
                    connector=channel.connector(
                        agent_id=agent_id, credential=coord.add_agent(agent_id)
                    ),
                    state_dir=tmp_path / agent_id,
                    index=i,
                    agents=3,
                    algorithms={"dp-fedavg": exact},
                )
            )
        ids = [a.agent_id for a in agents]
        try:
            await coord.wait_connected(ids)

            async def vanish(agent_id: str) -> None:
                if server is not None:
                    await server.stop(0)

            report = await coord.run_round(
                job_id=JOB,
                round=1,
                agents=ids,
                algorithm=exact,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
                masked_input_hook=vanish,
                timeout=10,  # under a loaded parallel suite, 3 s left no agent time to train
            )
            assert report.aggregate is None
            assert any("charged" in agent.kinds() for agent in agents)
            for agent in agents:
                # the link's end makes it leave round 1, saying whether its charge had started
                # (a write in flight when the link ends completes in its thread: never lost)
                left = await _event(agent, EventKind.LEFT_ROUND)
                expected = 1 if left.data["charged"] else 0
                assert await _entries(agent, expected) == expected
            await asyncio.sleep(0.3)  # reconnection attempts fail while nothing listens
            server, _ = await start_grpc(coord, port=port)
            await coord.wait_connected(ids, timeout=20)
            task2 = exact.bind(setup.job, setup.plan).round_task(setup.state, round_number=2)
            report2 = await coord.run_round(
                job_id=JOB,
                round=2,
                agents=ids,
                algorithm=exact,
                job=setup.job,
                plan=setup.plan,
                task=task2,
            )
            assert report2.aborted == ""
            assert report2.survivors == set(ids)
            for agent in agents:
                assert "left-round" in agent.kinds()
                assert agent.runner.connections >= 2
                assert any(e.kind is EventKind.DISCONNECTED for e in agent.events)
        finally:
            for agent in agents:
                await agent.close()
            for channel in channels:
                await channel.close()
            await server.stop(None)

    _run(main())


def test_a_coordinator_repeating_its_session_nonce_gets_no_uncharged_masked_input(
    tmp_path: Path,
) -> None:
    """A coordinator runs round 1 three times with ONE session nonce (a seeded nonce source),
    each time after a new invitation to the same round, and agent 0 restarts (same state
    directory) between the first and second run. Every run completes, so each agent made three
    releases; its local ledger holds one row per release, each under the agent's own attempt
    id, all naming the one session. Over real gRPC."""

    async def main() -> None:
        setup = fedavg_round(population=2)
        policy = Policy(max_epsilon_per_job=1000.0, max_epsilon_total=1000.0)
        seed = b"repeated-nonce-coordinator-seed!"
        coord = ScriptedCoordinator()
        publish(coord, setup)
        server, address = await start_grpc(coord)
        channels: list[GrpcTransport] = []

        def start(i: int) -> AgentHandle:
            agent_id = f"agent-{i}"
            channel = GrpcTransport(address, insecure=True)
            channels.append(channel)
            return start_agent(
                agent_id=agent_id,
                connector=channel.connector(
                    agent_id=agent_id, credential=coord.add_agent(agent_id)
                ),
                state_dir=tmp_path / agent_id,
                index=i,
                agents=2,
                policy=policy,
            )

        agents = [start(0), start(1)]
        ids = [a.agent_id for a in agents]
        summed = dict.fromkeys(ids, 0)
        sessions = set()
        try:
            for run in range(3):
                if run == 1:  # agent 0 restarts between attempts
                    old = coord.sessions.get(ids[0])
                    await agents[0].close()
                    agents[0] = start(0)
                    async with asyncio.timeout(20):  # its new stream, not the closing one
                        while coord.sessions.get(ids[0]) in (None, old):
                            await asyncio.sleep(0.01)
                await coord.wait_connected(ids, timeout=20)
                report = await coord.run_round(
                    job_id=JOB,
                    round=1,
                    agents=ids,
                    algorithm=setup.algorithm,
                    job=setup.job,
                    plan=setup.plan,
                    task=setup.task,
                    rng=SeededRandomSource(seed),
                    timeout=30,
                )
                assert report.aborted == "", (run, report)
                assert report.aggregate is not None  # a fresh release of both agents' data
                assert report.params is not None
                for agent_id in report.survivors:
                    summed[agent_id] += 1
                await asyncio.sleep(0.05)
            assert summed == dict.fromkeys(ids, 3)
            for i, agent_id in enumerate(ids):
                ledger = LocalLedger.open(tmp_path / agent_id)  # the file, as a restart reads it
                try:
                    entries = ledger.entries(job_id=JOB)
                finally:
                    ledger.close()
                assert len(entries) == summed[agent_id], (agent_id, entries)
                assert len({e.attempt for e in entries}) == len(entries)
                assert len({e.sent_sha256 for e in entries}) == len(entries)
                sessions |= {e.session_id for e in entries}
                assert agents[i].ledger.epsilon(delta=1e-5) > 0
            assert len(sessions) == 1  # one session id, three releases, three rows
        finally:
            for agent in agents:
                await agent.close()
            for channel in channels:
                await channel.close()
            await server.stop(None)

    _run(main())
