"""Budgets on both sides (docs/architecture.md#rule-3-budgets-are-enforced-on-both-sides), with real
agents over loopback gRPC.

- The coordinator does not invite (nor charge) a client whose next round would exceed its budget.
- A coordinator that ignores budgets (a test switch, never in production settings) still cannot
  make an agent overspend: the agent declines from its own local ledger and policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support.coordination import deadlines, small_job

from dpfl.client.policy import Policy
from dpfl.client.progress import EventKind
from dpfl.server.store import Budget
from dpfl.simulation import Simulation


class _AfterRound:
    def __init__(self, action: Any) -> None:
        self.action = action

    async def at(self, point: str, context: Mapping[str, Any]) -> None:
        if point == "round_completed" and context["round"] == 1:
            self.action()


def test_client_over_budget_is_not_invited(coordinator_db: str, tmp_path: Path) -> None:
    job = small_job(rounds=2)
    sims: list[Simulation] = []

    def tighten() -> None:
        # after round 1, agent 0's budget is exactly what it has spent: round 2 would exceed it
        sim = sims[0]
        agent = sim.agents[0].agent_id
        spent = sim.coordinator.store.client_budget(agent, delta=1e-5).epsilon
        sim.coordinator.store.set_agent_budget(agent, Budget(spent * 1.0001, 1e-5))

    async def main() -> None:
        sim = Simulation(
            job,
            agents=4,
            transport="grpc",
            database_url=coordinator_db,
            workdir=tmp_path,
            deadlines=deadlines(),
            coordinator_options={"hooks": _AfterRound(tighten)},
        )
        sims.append(sim)
        try:
            result = await sim.run()
            assert result.status == "completed", result.error
            store = sim.coordinator.store
            poor = sim.agents[0].agent_id
            r1, r2 = store.list_rounds(sim.job_id)
            assert poor in r1.invited
            assert poor not in r2.invited
            assert r2.setup.excluded_over_budget == [poor]
            assert len(store.ledger_entries(agent_id=poor)) == 1
            for agent in sim.agents[1:]:
                assert len(store.ledger_entries(agent_id=agent.agent_id)) == 2
            budget = store.client_budget(poor)
            assert not budget.exceeded
            # the agent was never asked, so its own ledger holds round 1 only
            assert len(sim.agents[0].ledger.entries(job_id=sim.job_id)) == 1
        finally:
            await sim.close()

    asyncio.run(main())


def test_agent_declines_from_its_local_ledger_when_the_coordinator_ignores_budgets(
    tmp_path: Path,
) -> None:
    job = small_job(rounds=1)

    async def main() -> None:
        sim = Simulation(
            job,
            agents=4,
            transport="grpc",
            workdir=tmp_path,
            deadlines=deadlines(),
            policies={0: Policy(max_epsilon_per_job=0.5)},
            budgets={0: (0.5, 1e-5)},
            coordinator_options={"enforce_budgets": False},
        )
        try:
            result = await sim.run()
            assert result.status == "completed", result.error
            store = sim.coordinator.store
            frugal = sim.agents[0]
            (rnd,) = store.list_rounds(sim.job_id)
            assert frugal.agent_id in rnd.invited  # the careless coordinator asked anyway
            assert frugal.agent_id not in rnd.accepted
            assert frugal.ledger.entries(job_id=sim.job_id) == []
            declined = [e for e in frugal.events if e.kind == EventKind.DECLINED]
            assert declined
            assert "max_epsilon_per_job" in declined[0].message
        finally:
            await sim.close()

    asyncio.run(main())
