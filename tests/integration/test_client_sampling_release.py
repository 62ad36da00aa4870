"""DP-FedAvg with Poisson client sampling end to end: every sampled round is released and charged.

The population-level charge ``PoissonSampledEvent(q, M)`` bounds the release of ``M(S)`` for every
Poisson sample S (docs/accounting.md, "Client sampling: every sample is released"), so rounds
whose sample has 0 or 1 clients must run like the others: the empty sample releases the
coordinator's noise alone, one client is summed in the plain transport with the whole noise.
Four real agents over the in-process transport, a seeded sampling CSPRNG whose six draws contain
both sizes, SQLite ledger.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.coordination import deadlines, small_job
from support.stored_rounds import secagg_of

from dpfl.accounting import PoissonSampledEvent, event_from_json
from dpfl.learning.algorithms.base import Algorithm
from dpfl.learning.algorithms.dp_fedavg import DpFedAvg
from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.secagg.randomness import SeededRandomSource
from dpfl.simulation import Simulation

SEED = bytes([3]) * 16
AGENTS = 4
ROUNDS = 6
RATE = 0.3


def _sizes(name: str) -> list[int]:
    """The sample sizes the seeded draw gives (Poisson sampling reads one word per member)."""
    source = SeededRandomSource(SEED)
    members = [str(i) for i in range(AGENTS)]
    return [
        len(common.poisson_sample(members, RATE, source.stream(f"dp-fedavg/select/{name}/{r}")))
        for r in range(1, ROUNDS + 1)
    ]


def test_rounds_sampling_zero_or_one_client_complete_and_are_charged(tmp_path: Path) -> None:
    job = small_job(rounds=ROUNDS, params={"sampling_rate": RATE})
    sizes = _sizes(job.name)
    assert 0 in sizes  # the draw exercises every path
    assert 1 in sizes
    assert max(sizes) >= 2

    def algorithms(name: str) -> Algorithm:
        if name == "dp-fedavg":
            return DpFedAvg(random_source=SeededRandomSource(SEED))
        return get_algorithm(name)

    async def main() -> None:
        sim = Simulation(
            job,
            agents=AGENTS,
            transport="inproc",
            workdir=tmp_path,
            deadlines=deadlines(),
            coordinator_options={"algorithms": algorithms},
        )
        try:
            result = await sim.run()
            store = sim.coordinator.store
            rounds = store.list_rounds(sim.job_id)
            assert result.status == "completed", result.error
            assert [(r.number, r.status.value) for r in rounds] == [
                (n, "completed") for n in range(1, ROUNDS + 1)
            ]
            assert [len(r.invited) for r in rounds] == sizes
            assert [r.model_version for r in rounds] == list(range(1, ROUNDS + 1))
            ids = {a.agent_id for a in sim.agents}
            for rnd, size in zip(rounds, sizes, strict=True):
                assert rnd.committed_at is not None
                assert rnd.setup.sample == list(rnd.invited) or size == 0
                entries = store.ledger_entries(round_id=rnd.id)
                # the whole population pays the amplified event, sampled or not
                assert {e.agent_id for e in entries} == ids
                for e in entries:
                    event = event_from_json(e.event)
                    assert isinstance(event, PoissonSampledEvent)
                    assert event.sampling_rate == RATE
                if size == 0:
                    assert rnd.setup.noise_alone is True
                    assert rnd.invited == ()
                elif size == 1:
                    assert secagg_of(rnd).enabled is False
                    assert secagg_of(rnd).num_clients == 1
                    # the lone agent's own noise is the sum's: total/(t(1−δ)) ≥ μ
                    assert rnd.setup.plan is not None
                    assert rnd.setup.encoding is not None
                    plan_total = rnd.setup.plan.details["noise_total"]
                    share = rnd.setup.encoding.noise.parameter
                    assert share >= plan_total
                    assert list(rnd.survivors["masked_input"]) == list(rnd.invited)
                else:
                    assert secagg_of(rnd).num_clients == size
            # every agent recorded, in its own ledger, exactly the rounds it took part in
            for agent in sim.agents:
                joined = [r.number for r in rounds if agent.agent_id in r.invited]
                local = agent.ledger.entries(job_id=sim.job_id)
                assert sorted(e.round for e in local) == joined
            assert store.verify_ledger().ok
        finally:
            await sim.close()

    asyncio.run(main())
