"""Test-only: run an algorithm's whole job in one process, the way the shells will run it.

plan → initial state → per round: select → the round driver (``dpfl.learning.rounds``, the
coordinator's own steps: release policy, round task, secure-aggregation parameters, encoding,
the ledger committed before unmasking, dropped noise restored) with a
:class:`support.local_cohort.LocalCohort`. Per agent (JSON round trips of params, events
and encoding as on the wire): the agent side's check, its charge into the agent's own ledger,
contribution (by default compute, then the REAL encoding with real per-agent integer
noise from a CSPRNG). The sum runs ``dpfl.secagg.simulate`` (the real state machines) or a plain
modular sum when the job disables secure aggregation; then decode → finish_round. ε per client
is computed with ``dpfl.accounting``.

No transport, no SQL: the coordinator's ledger is a dict of :class:`ClientCharge` lists.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfl.accounting import (
    ComposedEvent,
    DpEvent,
    NoPrivacyEvent,
    compute_epsilon,
    event_from_json,
    event_to_json,
)
from dpfl.learning.algorithms.base import (
    AgentData,
    Algorithm,
    ClientCharge,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
)
from dpfl.learning.algorithms.parts.data_sizes import simulated_federation
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.jobs import JobSpec, job_to_dict, parse_job
from dpfl.learning.rounds import Invitation, RoundJob, SumSetup, run_round
from dpfl.learning.rounds.driver import NoiseStreams
from dpfl.learning.rounds.state import Commitment
from dpfl.mechanisms import EncodingConfig
from dpfl.secagg import SeededRandomSource
from dpfl.secagg.messages import Stage
from dpfl.secagg.randomness import RandomSource, RandomStream
from support.local_cohort import LocalCohort

__all__ = [
    "HarnessResult",
    "RoundRecord",
    "federation_for",
    "make_job",
    "make_pate_job",
    "run_job",
]


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one round."""

    round: int
    invited: tuple[str, ...]
    participants: tuple[str, ...]  # whose masked input was summed
    metrics: Mapping[str, float]
    encoding: EncodingConfig | None
    skipped: bool = False


@dataclass
class HarnessResult:
    """The job's end state, both ledgers and the per-round records."""

    job: JobSpec
    plan: JobPlan
    state: CoordinatorState
    rounds: list[RoundRecord]
    population: tuple[str, ...]
    ledger: dict[str, list[ClientCharge]] = field(default_factory=dict)
    agent_ledgers: dict[str, list[DpEvent]] = field(default_factory=dict)
    _cache: dict[tuple[DpEvent, ...], float] = field(default_factory=dict, repr=False)

    @property
    def final_metrics(self) -> Mapping[str, float]:
        done = [r for r in self.rounds if not r.skipped]
        return done[-1].metrics if done else {}

    def _epsilon(self, events: Sequence[DpEvent], delta: float | None) -> float:
        key = tuple(events)
        if key not in self._cache:
            event = ComposedEvent(key) if key else NoPrivacyEvent()
            d = self.job.privacy.delta if delta is None else delta
            self._cache[key] = compute_epsilon(event, delta=d).epsilon
        return self._cache[key]

    def epsilon(self, client: str, *, delta: float | None = None) -> float:
        """ε of ``client`` in the coordinator's ledger (all its committed charges composed)."""
        return self._epsilon([c.event for c in self.ledger.get(client, [])], delta)

    def agent_epsilon(self, client: str, *, delta: float | None = None) -> float:
        """ε of ``client`` in its own local ledger (what ``agent_charge`` returned)."""
        return self._epsilon(self.agent_ledgers.get(client, []), delta)


def federation_for(job: JobSpec, num_agents: int) -> tuple[CoordinatorData, dict[str, AgentData]]:
    """The coordinator's data (test split, public split with evaluation labels) and each
    simulated agent's private part, from the job's data spec."""
    return simulated_federation(job, num_agents)


def _wire(value: Any) -> Any:
    return json.loads(json.dumps(value))


def run_job(
    job: JobSpec,
    *,
    num_agents: int,
    algorithm: Algorithm | None = None,
    seed: bytes = b"dpfl-algorithm-harness-seed",
    dropouts: Mapping[int, Mapping[Stage, Collection[int]]] | None = None,
    device: str = "cpu",
) -> HarnessResult:
    """Run ``job`` with ``num_agents`` simulated agents; see the module docstring.

    Args:
        job: the validated job.
        num_agents: the population (agent ids ``agent-0000``...).
        algorithm: the algorithm instance (default: ``get_algorithm(job.algorithm)``).
        seed: seed of every CSPRNG stream of the run (noise, rounding, secure aggregation).
        dropouts: per round, ``dpfl.secagg.simulate``'s dropouts (indices into the round's
            invitees).
        device: where agents train.
    """
    alg = algorithm if algorithm is not None else get_algorithm(job.algorithm)
    coordinator_data, agents = federation_for(job, num_agents)
    plan = alg.plan(job, population=num_agents, data=coordinator_data)
    plan = alg.parse_plan(_wire(plan.to_json()))
    _wire(job_to_dict(job))
    side = alg.bind(job, plan)
    state = side.initial_state(coordinator_data)
    result = HarnessResult(job=job, plan=plan, state=state, rounds=[], population=tuple(agents))
    run = _Run(result, RoundJob(job.name, side, coordinator_data), agents, device)
    asyncio.run(run.rounds(SeededRandomSource(seed), dropouts or {}))
    return result


@dataclass
class _Run:
    """The harness's side of the round driver: the agents' checks, charges and contributions,
    and the coordinator's ledger as a dict."""

    result: HarnessResult
    job: RoundJob
    agents: Mapping[str, AgentData]
    device: str

    async def rounds(
        self, rng: RandomSource, dropouts: Mapping[int, Mapping[Stage, Collection[int]]]
    ) -> None:
        side, spec, result = self.job.coordinator, self.job.spec, self.result
        for number in range(1, spec.rounds + 1):
            invited = tuple(side.select(round_number=number, population=result.population))
            cohort = LocalCohort(
                lambda a, inv, setup, n=number: self.contribute(a, inv, setup, rng, n),
                rng=rng.child(f"secagg/{number}"),
                dropouts=dropouts.get(number, {}),
                job_id=spec.name,
                number=number,
            )
            end = await run_round(
                self.job,
                number=number,
                state=result.state,
                population=result.population,
                invited=invited,
                cohort=cohort,
                ledger=self,
                noise=_streams(rng, number),
            )
            if end.outcome is None:  # the coordinator's policy: nothing released or charged
                result.rounds.append(RoundRecord(number, invited, (), {}, None, skipped=True))
                continue
            result.state = end.outcome.state
            # states are JSON, blobs aside (docs/algorithms.md#invariants-of-every-algorithm)
            _wire(dict(result.state.details))
            metrics = dict(end.outcome.metrics)
            result.rounds.append(RoundRecord(number, invited, end.summed, metrics, end.encoding))
            if end.outcome.done:
                break

    async def commit(self, commitment: Commitment) -> None:
        for client, charge in commitment.charges.items():
            self.result.ledger.setdefault(client, []).append(charge)

    def contribute(
        self, agent_id: str, invitation: Invitation, setup: SumSetup, rng: RandomSource, n: int
    ) -> npt.NDArray[np.uint64]:
        """One agent's side, its inputs round-tripped through JSON as on the wire: the check of
        the claimed privacy, its own charge (recorded before it sends), its vector."""
        alg, task, result = self.job.coordinator.algorithm, invitation.task, self.result
        params = alg.parse_task(_wire(task.params.to_json()))
        side = alg.agent(params)
        encoding = EncodingConfig.from_json(setup.encoding.to_json())
        claimed = [event_from_json(e) for e in _wire([event_to_json(e) for e in invitation.events])]
        side.check(
            claimed,
            encoding,
            num_clients=len(setup.accepted),
            min_survivors=setup.min_survivors,
            honest_fraction=params.honest_fraction,
        )
        result.agent_ledgers.setdefault(agent_id, []).extend(side.charge(claimed))
        data = self.job.data
        contribution = side.contribution(
            self.agents[agent_id],
            model=result.state.model if task.model_version is not None else None,
            public_x=data.public_for_agents() if task.needs_public_data else None,
            device=self.device,
            encoding=encoding,
            stream=rng.child(f"agent/{agent_id}").stream(f"encode/{n}"),
        )
        assert contribution.dtype == np.uint64
        assert contribution.shape == (task.vector_length,)
        return contribution


def _streams(rng: RandomSource, number: int) -> NoiseStreams:
    """The round's coordinator streams, by purpose."""

    def stream(purpose: str) -> RandomStream:
        if purpose == "noise-alone":
            return rng.stream(f"noise-alone/{number}")
        return rng.child(f"{purpose}/{number}").stream("noise")

    return stream


def make_job(**overrides: Any) -> JobSpec:
    """The demo DP-FedAvg job (sampling rate 0.3), with top-level sections overridden."""
    doc: dict[str, Any] = {
        "name": "demo-dpfedavg",
        "algorithm": "dp-fedavg",
        "data": {
            "dataset": "digits",
            "partition": {"scheme": "shards", "classes_per_agent": 3},
            "public_fraction": 0.0,
        },
        "model": "logreg",
        "rounds": 10,
        "privacy": {
            "unit": "agent",
            "delta": 1e-5,
            "target_epsilon": 4.0,
            "honest_fraction": 1.0,
            "noise": "skellam",
        },
        "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.05},
        "params": {"clip": 1.0, "sampling_rate": 0.3, "local_steps": 5, "learning_rate": 0.5},
    }
    return parse_job(_merge(doc, overrides))


def make_pate_job(**overrides: Any) -> JobSpec:
    """PATE-FL on digits with a public split (agent level, σ = 3, 200 queries in 2 rounds)."""
    doc: dict[str, Any] = {
        "name": "pate",
        "algorithm": "pate-fl",
        "data": {"dataset": "digits", "partition": {"scheme": "iid"}, "public_fraction": 0.3},
        "model": "logreg",
        "rounds": 2,
        "privacy": {"unit": "agent", "delta": 1e-5, "noise": "skellam"},
        "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.05},
        "params": {"queries": 200, "sigma": 3.0},
    }
    return parse_job(_merge(doc, overrides))


def _merge(doc: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Top-level override: a mapping merges into a mapping section, None removes the key."""
    out = dict(doc)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out
