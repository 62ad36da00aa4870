"""Faults with real agents over loopback gRPC: agents killed at chosen stages, a coordinator
killed between the ledger commit and unmasking, and too few survivors.

Agents are killed by cancelling their real task (their gRPC stream breaks, as when a process
dies); the coordinator is crashed by cancelling it at a fault-injection point, after which it
writes nothing, and a new coordinator is started on the same database and port.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support.coordination import deadlines, small_job

from dpfl.cli.simulate import Simulation
from dpfl.server.orchestrator import NO_HOOKS


class _Hooks:
    """Calls ``actions[(point, round)]`` when the engine reaches that point of that round."""

    def __init__(self, actions: Mapping[tuple[str, int], Any]) -> None:
        self.actions = dict(actions)

    async def at(self, point: str, context: Mapping[str, Any]) -> None:
        action = self.actions.get((point, context["round"]))
        if action is not None:
            await action(context)


def test_agents_killed_at_each_stage(tmp_path: Path) -> None:
    """Round 1: an agent dies right after sending its masked input (still summed, and charged);
    round 2: one dies after share keys (its masks are recovered, it is not summed); round 3: one
    dies after accepting, before advertising keys (excluded)."""
    job = small_job(rounds=3, secagg={"dropout_fraction": 0.4})
    sims: list[Simulation] = []
    killed: dict[int, str] = {}

    def kill(index: int, round_number: int) -> None:
        agent = sims[0].agents[index]
        killed[round_number] = agent.agent_id
        agent.kill()

    async def after_masked_inputs(context: Mapping[str, Any]) -> None:
        # every masked input has arrived; agent 0 dies before any unmask request reaches it
        kill(0, 1)

    async def after_shares(context: Mapping[str, Any]) -> None:
        kill(1, 2)

    async def after_invitations(context: Mapping[str, Any]) -> None:
        kill(2, 3)

    hooks = _Hooks(
        {
            ("masked_input_closed", 1): after_masked_inputs,
            ("share_keys_closed", 2): after_shares,
            ("invitations_closed", 3): after_invitations,
        }
    )

    async def main() -> None:
        sim = Simulation(
            job,
            agents=6,
            transport="grpc",
            workdir=tmp_path,
            deadlines=deadlines(),
            coordinator_options={"hooks": hooks, "max_attempts": 1},
        )
        sims.append(sim)
        try:
            result = await sim.run()
            assert result.status == "completed", result.error
            store = sim.coordinator.store
            r1, r2, r3 = store.list_rounds(sim.job_id)
            # round 1: summed although it never answered the unmask request
            assert killed[1] in r1.survivors["masked_input"]
            assert killed[1] not in r1.survivors["unmask"]
            assert r1.status.value == "completed"
            charged1 = {e.agent_id for e in store.ledger_entries(round_id=r1.id)}
            assert killed[1] in charged1
            # round 2: shared its keys, never sent a masked input: recovered without it
            assert killed[2] in r2.survivors["share_keys"]
            assert killed[2] not in r2.survivors["masked_input"]
            assert killed[2] in r2.dropped["masked_input"]
            assert r2.status.value == "completed"
            assert len(r2.survivors["masked_input"]) == 4
            # round 3: accepted, then died before advertising keys: excluded from A1
            assert killed[3] in r3.accepted
            assert killed[3] not in r3.survivors["advertise_keys"]
            assert r3.status.value == "completed"
            assert len(r3.survivors["masked_input"]) == 3
            # the released noise is every accepted agent's share: the coordinator drew the
            # shares of those whose vectors are missing (docs/accounting.md, (b))
            restored = [r.noise["restored_noise_shares"] for r in (r1, r2, r3)]
            assert restored == [0, len(r2.accepted) - 4, len(r3.accepted) - 3] == [0, 1, 1]
            assert store.verify_ledger().ok
        finally:
            await sim.close()

    asyncio.run(main())


def test_too_few_survivors_abort_without_model_change(tmp_path: Path) -> None:
    job = small_job(rounds=1, secagg={"dropout_fraction": 0.3})  # 5 agents: 4 must survive
    sims: list[Simulation] = []

    async def kill_two(context: Mapping[str, Any]) -> None:
        sims[0].agents[0].kill()
        sims[0].agents[1].kill()

    async def main() -> None:
        sim = Simulation(
            job,
            agents=5,
            transport="grpc",
            workdir=tmp_path,
            deadlines=deadlines(),
            coordinator_options={
                "hooks": _Hooks({("share_keys_closed", 1): kill_two}),
                "max_attempts": 1,
            },
        )
        sims.append(sim)
        try:
            result = await sim.run()
            store = sim.coordinator.store
            assert result.status == "failed"
            (rnd,) = store.list_rounds(sim.job_id)
            assert rnd.status.value == "aborted"
            assert rnd.committed_at is None
            assert "fewer than 4" in (rnd.abort_reason or "")
            assert [m.version for m in store.list_model_versions(sim.job_id)] == [0]
            assert store.ledger_entries(job_id=sim.job_id) == []
            # the three that sent masked inputs charged their own ledgers first (they cannot
            # know the round will abort): the local ledger errs on the side of over-counting
            for agent in sim.agents[2:]:
                assert len(agent.ledger.entries(job_id=sim.job_id)) == 1
        finally:
            await sim.close()

    asyncio.run(main())


def test_coordinator_crash_after_commit_keeps_the_charge_and_redoes_the_round(
    coordinator_db: str, tmp_path: Path
) -> None:
    job = small_job(rounds=1)
    state: dict[str, Any] = {}

    async def block(context: Mapping[str, Any]) -> None:
        state["round_id"] = context["round_id"]
        state["reached"].set()
        await asyncio.Event().wait()  # the crash cancels us here: no unmask request is sent

    async def main() -> None:
        state["reached"] = asyncio.Event()
        sim = Simulation(
            job,
            agents=4,
            transport="grpc",
            database_url=coordinator_db,
            workdir=tmp_path,
            deadlines=deadlines(),
            coordinator_options={"hooks": _Hooks({("after_ledger_commit", 1): block})},
        )
        try:
            await sim.start_coordinator()
            await sim.start_agents()
            await sim.submit()
            await asyncio.wait_for(state["reached"].wait(), 60)
            first = sim.coordinator
            charged = {e.agent_id for e in first.store.ledger_entries(job_id=sim.job_id)}
            assert charged == {a.agent_id for a in sim.agents}
            await first.crash()
            # restart on the same database and port, without the blocking hook
            sim.coordinator_options["hooks"] = NO_HOOKS
            await sim.start_coordinator()
            job_record = await sim.wait()
            store = sim.coordinator.store
            assert job_record.status.value == "completed", job_record.error
            attempts = store.list_rounds(sim.job_id, number=1)
            assert [(r.attempt, r.status.value) for r in attempts] == [
                (1, "aborted"),
                (2, "completed"),
            ]
            assert "charge stays" in (attempts[0].abort_reason or "")
            entries = store.ledger_entries(job_id=sim.job_id)
            by_attempt = {(e.agent_id, e.attempt) for e in entries}
            for agent in sim.agents:  # charged for both attempts: never under-counted
                assert (agent.agent_id, 1) in by_attempt
                assert (agent.agent_id, 2) in by_attempt
            assert store.verify_ledger().ok
        finally:
            await sim.close()

    asyncio.run(main())
