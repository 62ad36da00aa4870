"""The coordinator's own-share figure is what the agents' own ledgers record
(docs/accounting.md#what-the-agent-can-verify), over loopback gRPC with real agents.

Five agents with an explicit ``Policy()`` (they trust no peer: their ledgers keep only their
own noise share; budgets large enough, no noise-multiplier floor) run three rounds of the small
DP-FedAvg job with secure aggregation, on SQLite and PostgreSQL. Every ledger entry of a round
carries the f₁ its agents verified (below 1: the noise is split), and for each client the REST
API's ``own_share_epsilon`` equals the ε of its agent's local ledger, while ``epsilon`` (the
announced cohort's) stays the population figure, below it. A job without secure aggregation
(each agent adds the whole noise) stores f₁ = 1, and the two figures coincide.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.coordination import deadlines, small_job

from dpfl.accounting import event_from_json, event_to_json
from dpfl.client.policy import Policy
from dpfl.simulation import Simulation

AGENTS = 5
#: what an agent that trusts no peer runs: budgets that never refuse these rounds
POLICY = Policy(max_epsilon_per_job=1e4, max_epsilon_total=1e4, min_noise_multiplier=0)


async def _rest(sim: Simulation, path: str) -> Any:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{sim.api_port}/api/v1",
        headers={"Authorization": f"Bearer {sim.admin_token}"},
    ) as client:
        r = await client.get(path)
    assert r.status_code == 200, r.text
    return r.json()


def _run(job: Any, database_url: str, workdir: Path, check: Any) -> None:
    async def main() -> None:
        sim = Simulation(
            job,
            agents=AGENTS,
            transport="grpc",
            database_url=database_url,
            workdir=workdir,
            deadlines=deadlines(),
            serve_api=True,
            policies=dict.fromkeys(range(AGENTS), POLICY),
        )
        try:
            result = await sim.run()
            assert result.status == "completed", result.error
            assert result.rounds_completed == 3
            await check(sim)
        finally:
            await sim.close()

    asyncio.run(main())


def test_the_own_share_figure_is_the_agents_ledger(coordinator_db: str, tmp_path: Path) -> None:
    job = small_job()
    delta = job.privacy.delta

    async def check(sim: Simulation) -> None:
        store = sim.coordinator.store
        listed = {c["id"]: c for c in await _rest(sim, "/clients")}
        fractions = set()
        for agent in sim.agents:
            entries = store.ledger_entries(agent_id=agent.agent_id, job_id=sim.job_id)
            assert [e.round_number for e in entries] == [1, 2, 3]
            recorded = agent.ledger.entries(job_id=sim.job_id)
            assert [r.round for r in recorded] == [1, 2, 3]
            for entry, record in zip(entries, recorded, strict=True):
                f = entry.own_noise_fraction
                assert f is not None
                assert 0 < f < 1  # the noise is split over the cohort
                fractions.add(f)
                # the agent recorded exactly the charged event scaled by that f₁
                scaled = event_from_json(entry.event).with_noise_fraction(f)
                assert [event_to_json(e) for e in record.events] == [event_to_json(scaled)]
            report = await _rest(sim, f"/clients/{agent.agent_id}/budget?delta={delta}")
            mine = agent.ledger.epsilon(delta=delta)
            assert report["own_share_epsilon"] == pytest.approx(mine, rel=1e-9)
            assert report["own_share_unknown"] is None
            assert report["epsilon"] == pytest.approx(
                store.client_budget(agent.agent_id, delta=delta).epsilon, rel=1e-12
            )
            assert report["epsilon"] < report["own_share_epsilon"]
            assert report["epsilon"] <= job.privacy.target_epsilon * (1 + 1e-6)
            assert {e["own_noise_fraction"] for e in report["events"]} == {
                e.own_noise_fraction for e in entries
            }
            if listed[agent.agent_id]["delta"] == delta:
                assert listed[agent.agent_id]["own_share_epsilon"] == pytest.approx(mine, rel=1e-9)
        assert len(fractions) == 1  # one f₁ per round, the same setup every round
        assert store.verify_ledger().ok

    _run(job, coordinator_db, tmp_path, check)


def test_without_secure_aggregation_both_figures_coincide(tmp_path: Path) -> None:
    job = small_job(secagg={"enabled": False})
    delta = job.privacy.delta

    async def check(sim: Simulation) -> None:
        store = sim.coordinator.store
        for agent in sim.agents:
            entries = store.ledger_entries(agent_id=agent.agent_id, job_id=sim.job_id)
            assert {e.own_noise_fraction for e in entries} == {1.0}
            report = await _rest(sim, f"/clients/{agent.agent_id}/budget?delta={delta}")
            assert report["own_share_epsilon"] == report["epsilon"]
            assert report["own_share_epsilon"] == pytest.approx(
                agent.ledger.epsilon(delta=delta), rel=1e-9
            )

    _run(job, f"sqlite:///{tmp_path / 'coordinator.db'}", tmp_path, check)
