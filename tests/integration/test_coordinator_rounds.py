"""DP-FedAvg end to end over loopback gRPC: coordinator, real agents, secure aggregation, ledger.

Five agents, three rounds, on SQLite and on PostgreSQL. The ledger must hold exactly one charge
per client and round, and each client's ε reported by the store must equal the accountant's ε
recomputed from scratch from the stored event parameters
(docs/architecture.md#rule-2-every-event-can-be-recomputed).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from support.coordination import deadlines, small_job
from support.stored_rounds import secagg_of

from dpfl.accounting import epsilon_from_rdp, event_from_json, rdp_curve
from dpfl.simulation import Simulation


def test_dp_fedavg_five_agents_three_rounds_over_grpc(coordinator_db: str, tmp_path: Path) -> None:
    job = small_job()
    delta = job.privacy.delta

    async def main() -> None:
        sim = Simulation(
            job,
            agents=5,
            transport="grpc",
            database_url=coordinator_db,
            workdir=tmp_path,
            deadlines=deadlines(),
        )
        try:
            result = await sim.run()
            store = sim.coordinator.store
            rounds = store.list_rounds(sim.job_id)
            assert result.status == "completed", result.error
            assert result.rounds_completed == 3
            assert [r.status.value for r in rounds] == ["completed"] * 3
            assert [r.model_version for r in rounds] == [1, 2, 3]  # 0 is the initial model
            for agent in sim.agents:
                entries = store.ledger_entries(agent_id=agent.agent_id, job_id=sim.job_id)
                assert [e.round_number for e in entries] == [1, 2, 3]
                curve = np.sum([rdp_curve(event_from_json(e.event)) for e in entries], axis=0)
                recomputed, _ = epsilon_from_rdp(curve, delta=delta)
                budget = store.client_budget(agent.agent_id, delta=delta)
                assert budget.rdp_epsilon == pytest.approx(recomputed, rel=1e-9)
                # the job's own figure and the client's total (one job) are the same tight
                # composition (the Skellam release's dominating Gaussian), the figure the noise
                # was calibrated on and the budget is enforced on
                own = store.job_epsilon_reports(sim.job_id)[agent.agent_id]
                assert own.rdp_epsilon == pytest.approx(recomputed, rel=1e-9)
                assert budget.epsilon == pytest.approx(own.epsilon, rel=1e-9)
                assert budget.method in ("pld", "analytic_gaussian")
                assert result.epsilon[agent.agent_id] == pytest.approx(own.epsilon, rel=1e-9)
                assert own.epsilon <= min(recomputed, job.privacy.target_epsilon * (1 + 1e-6))
                # the agent recorded every round it took part in before sending its input
                assert len(agent.ledger.entries(job_id=sim.job_id)) == 3
            assert store.verify_ledger().ok
            for rnd in rounds:
                assert set(rnd.survivors["masked_input"]) == {a.agent_id for a in sim.agents}
                assert secagg_of(rnd).num_clients == 5
                assert rnd.committed_at is not None
                assert rnd.finished_at is not None
                assert rnd.committed_at <= rnd.finished_at
        finally:
            await sim.close()

    asyncio.run(main())
