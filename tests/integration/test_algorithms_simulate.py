"""Four algorithms end to end, as ``dpfl simulate`` runs them: the job files under
``examples/``, a coordinator and ten real agents over loopback gRPC, secure aggregation, the SQL
ledger.

Each run must complete, beat the accuracy floor stated below (measured with the in-process
harness, ``tests/support/algorithm_harness.py``, over ten noise seeds), and leave a ledger whose
ε per client equals the accountant's ε recomputed from scratch from the stored event parameters
(docs/architecture.md#rule-2-every-event-can-be-recomputed), within the job's target.

| example | unit | ε (δ = 1e-5) | harness accuracy, 10 seeds: mean (min) | floor |
|---|---|---|---|---|
| dp-fedsgd.yaml | record | 4 | 0.74 (0.70) | 0.55 |
| dp-fed-ls.yaml | agent | 8 | 0.53 (0.46) | 0.30 |
| dp-helmet.yaml | record | 8 | 0.70 (0.63) | 0.40 |
| private-knn-fl.yaml | record | 4 | student 0.70 (0.63), pseudo-labels (0.63) | 0.45 |

Each floor is at least four standard deviations of the seeds' spread below the mean (the
agents' noise is drawn from the system CSPRNG here, so runs differ). dp-fedsgd is charged with
the provable (local-DP) accounting of its 5 local steps, every agent adding the whole step
noise, at learning rate 1.0 (docs/algorithms.md#dp-fedsgd compares the accounting modes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.coordination import deadlines
from support.paths import ROOT

from dpfl.accounting import (
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    epsilon_from_rdp,
    event_from_json,
    rdp_curve,
)
from dpfl.learning.jobs import job_to_dict, load_job, parse_job
from dpfl.simulation import Simulation

EXAMPLES = ROOT / "examples"
AGENTS = 10
FLOORS = {
    "dp-fedsgd": 0.55,
    "dp-fed-ls": 0.30,
    "dp-helmet": 0.40,
    "private-knn-fl": 0.45,
}


def _simulate(
    job: Any, database_url: str, workdir: Path, check: Callable[[Any, Simulation, Any], None]
) -> None:
    """Run ``job`` with ten agents over gRPC and ``check(result, simulation, store)`` before
    the simulation closes (the agents' ledgers are open until then)."""

    async def main() -> None:
        sim = Simulation(
            job,
            agents=AGENTS,
            transport="grpc",
            database_url=database_url,
            workdir=workdir,
            deadlines=deadlines(),
        )
        try:
            result = await sim.run()
            check(result, sim, sim.coordinator.store)
        finally:
            await sim.close()

    asyncio.run(main())


def _check_ledger(job: Any, sim: Simulation, store: Any, result: Any) -> dict[str, list[Any]]:
    """ε per client = the accountant's from the stored events; returns the entries per agent."""
    delta = job.privacy.delta
    entries = {}
    for agent in sim.agents:
        rows = store.ledger_entries(agent_id=agent.agent_id, job_id=sim.job_id)
        entries[agent.agent_id] = rows
        if not rows:
            continue
        curves = [rdp_curve(event_from_json(e.event)) for e in rows]
        for row, curve in zip(rows, curves, strict=True):
            np.testing.assert_allclose(np.asarray(row.curve), curve, rtol=1e-12)
        recomputed, _ = epsilon_from_rdp(np.sum(curves, axis=0), delta=delta)
        budget = store.client_budget(agent.agent_id, delta=delta)
        # the client's figure composes its events (tight where each has a path): never above RDP
        assert budget.rdp_epsilon == pytest.approx(recomputed, rel=1e-9)
        assert budget.epsilon <= recomputed * (1 + 1e-9)
        # the simulation reports the job's own figure: the smaller of its RDP and tight bounds
        spent = budget.by_job[sim.job_id]
        assert result.epsilon[agent.agent_id] == spent.epsilon <= recomputed * (1 + 1e-9)
        if job.privacy.target_epsilon is not None:
            assert spent.epsilon <= job.privacy.target_epsilon * (1 + 1e-6)
            if spent.method == "rdp":
                assert recomputed <= job.privacy.target_epsilon * (1 + 1e-6)
        # the agent recorded every round it took part in, before sending its input
        took_part = [
            r
            for r in store.list_rounds(sim.job_id)
            if agent.agent_id in r.survivors.get("masked_input", ())
        ]
        assert len(agent.ledger.entries(job_id=sim.job_id)) == len(took_part)
    assert store.verify_ledger().ok
    return entries


@pytest.mark.parametrize("algorithm", sorted(FLOORS))
def test_example_job_over_grpc(algorithm: str, tmp_path: Path) -> None:
    job = load_job(EXAMPLES / f"{algorithm}.yaml")
    assert job.algorithm == algorithm

    def check(result: Any, sim: Simulation, store: Any) -> None:
        assert result.status == "completed", result.error
        assert result.rounds_completed == job.rounds
        accuracy = result.metrics.get("accuracy", result.accuracy)
        assert accuracy is not None
        assert accuracy >= FLOORS[algorithm], result.metrics
        entries = _check_ledger(job, sim, store, result)
        unit = job.privacy.unit
        for rows in entries.values():
            assert all(e.unit.value == unit for e in rows)
            assert all(not e.approximate and e.secure_aggregation for e in rows)
        events = [event_from_json(e.event) for e in next(iter(entries.values()))]
        if algorithm == "dp-fedsgd":  # S compositions of the Poisson-subsampled Skellam step
            assert len(events) == job.rounds
            # provable accounting of S > 1: masked, but no other agent's noise is credited
            assert all(e.honest_fraction == 1.0 for rows in entries.values() for e in rows)
            for event in events:
                assert isinstance(event, SelfComposedEvent)
                assert event.count == job.params.local_steps
                assert isinstance(event.event, PoissonSampledEvent)
                assert event.event.sampling_rate == job.params.batch_sampling_rate
                assert isinstance(event.event.event, SkellamEvent)
        elif algorithm == "dp-helmet":  # one round, K class releases
            (event,) = events
            assert isinstance(event, SelfComposedEvent)
            assert event.count == 10
            simple = result.metrics["simple_bound_epsilon"]
            assert simple > max(result.epsilon.values())  # RDP beats the paper's simple bound
        elif algorithm == "private-knn-fl":  # exactly the answered queries
            assert sum(e.count for e in events) == job.params.queries
            assert result.metrics["pseudo_label_accuracy"] >= FLOORS[algorithm]
        else:  # dp-fed-ls: every member pays every round
            assert len(events) == job.rounds

    _simulate(job, f"sqlite:///{tmp_path / 'coordinator.db'}", tmp_path, check)


def test_fed_ls_fixed_size_sampling_over_grpc(coordinator_db: str, tmp_path: Path) -> None:
    """Fixed-size sampling: exactly m agents per round, every member charged the replace-one
    sampled-without-replacement event, the ledger's ε recomputed from it."""
    base = job_to_dict(load_job(EXAMPLES / "dp-fed-ls.yaml"))
    doc = {
        **base,
        "rounds": 2,
        "params": {**base["params"], "client_sampling": "uniform", "sampling_rate": 0.6},
    }
    job = parse_job(doc)

    def check(result: Any, sim: Simulation, store: Any) -> None:
        assert result.status == "completed", result.error
        for rnd in store.list_rounds(sim.job_id):
            assert len(rnd.invited) == 6
        entries = _check_ledger(job, sim, store, result)
        for rows in entries.values():
            assert len(rows) == 2
            for row in rows:
                event = event_from_json(row.event)
                assert isinstance(event, SampledWithoutReplacementEvent)
                assert (event.population, event.sample_size) == (AGENTS, 6)
                assert isinstance(event.event, SkellamEvent)

    _simulate(job, coordinator_db, tmp_path, check)


def test_agent_level_skellam_votes_report_the_jobs_pld_figure(tmp_path: Path) -> None:
    """One-hot votes at agent level are calibrated on their one-coordinate PLD: the job's
    figure (what the simulation reports) meets the target, while the RDP total that budgets use
    is larger, never smaller."""
    document = job_to_dict(load_job(EXAMPLES / "demo-pate-fl.yaml"))
    document["privacy"] = {**document["privacy"], "unit": "agent", "target_epsilon": 4.0}
    document["rounds"] = 2
    document["params"] = {**document["params"], "queries": 60, "teacher_epochs": 5}
    job = parse_job(document)

    def check(result: Any, sim: Simulation, store: Any) -> None:
        assert result.status == "completed", result.error
        charged = 0
        for agent in sim.agents:
            budget = store.client_budget(agent.agent_id, delta=job.privacy.delta)
            spent = budget.by_job.get(sim.job_id)
            if spent is None:
                assert result.epsilon[agent.agent_id] == 0.0
                continue
            charged += 1
            assert spent.method == "pld"
            assert result.epsilon[agent.agent_id] == spent.epsilon
            assert 3.9 < spent.epsilon <= 4.0 * (1 + 1e-6)
            assert spent.rdp_epsilon is not None
            # one job of one event: the client's total is the job's tight figure; RDP is looser
            assert budget.epsilon == pytest.approx(spent.epsilon)
            assert budget.rdp_epsilon == pytest.approx(spent.rdp_epsilon)
            assert budget.rdp_epsilon > 4.0
            # the agent recorded the task's unit: its own figure is the same tight one
            assert agent.ledger.epsilon(delta=job.privacy.delta) == pytest.approx(
                budget.epsilon, rel=1e-9
            )
        assert charged >= AGENTS // 2
        _check_ledger(job, sim, store, result)

    _simulate(job, f"sqlite:///{tmp_path / 'coordinator.db'}", tmp_path, check)
