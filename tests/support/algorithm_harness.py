"""Test-only: run an algorithm's whole job in one process, the way the shells will run it.

plan → initial state → per round: select → the coordinator's release policy
(``dpfl.learning.algorithms.release``: skip, the noise alone for an empty sample, or a sum, plain
for one agent) → round task → secure-aggregation parameters → encoding
→ per agent (JSON round trips of params, events and encoding as on the wire): agent_check,
agent_charge into the agent's own ledger, agent_contribution (by default agent_compute, then
the REAL encoding with real per-agent integer noise from a CSPRNG) → the sum
(``dpfl.secagg.simulate``, the real state machines, or a plain modular sum when the job disables
secure aggregation) with the coordinator's ledger committed before unmasking → decode →
finish_round. ε per client is computed with ``dpfl.accounting``.

No transport, no SQL: the coordinator's ledger is a dict of :class:`ClientCharge` lists.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    RoundTask,
    get_algorithm,
)
from dpfl.learning.algorithms.federation import simulated_federation
from dpfl.learning.algorithms.release import (
    Release,
    release_for,
    restore_dropped_noise,
    secure_sum,
)
from dpfl.learning.jobs import JobSpec, job_to_dict, parse_job
from dpfl.secagg import (
    EncodingConfig,
    RoundParameters,
    SeededRandomSource,
    ThreatModel,
    decode,
    encode,
    simulate,
)
from dpfl.secagg.messages import Stage
from dpfl.secagg.randomness import RandomSource
from dpfl.secagg.server_states import ServerReadyToUnmask

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
    rng = SeededRandomSource(seed)
    coordinator_data, agents = federation_for(job, num_agents)
    population = tuple(agents)
    plan = alg.plan(job, population=num_agents, data=coordinator_data)
    plan = alg.parse_plan(_wire(plan.to_json()))
    _wire(job_to_dict(job))
    state = alg.initial_state(job, plan, coordinator_data)
    result = HarnessResult(job=job, plan=plan, state=state, rounds=[], population=population)
    for round_number in range(1, job.rounds + 1):
        invited = tuple(alg.select(job, plan, round_number=round_number, population=population))
        release = release_for(alg, job, plan, invited=len(invited))
        if release is Release.SKIP:  # the coordinator's policy: nothing released or charged
            result.rounds.append(RoundRecord(round_number, invited, (), {}, None, skipped=True))
            continue
        task = alg.round_task(job, plan, result.state, round_number=round_number)
        if release is Release.NOISE_ALONE:
            if _noise_alone(result, alg, coordinator_data, task, round_number, rng):
                break
            continue
        secure = secure_sum(job, summands=len(invited))
        params: RoundParameters | None = None
        min_survivors = 1  # the plain transport: a lone agent of the sample, or a plain job
        if secure:
            probe = RoundParameters.choose(
                num_clients=len(invited),
                vector_length=task.vector_length,
                ring_bits=64,
                corrupt_fraction=job.secagg.corrupt_fraction,
                dropout_fraction=job.secagg.dropout_fraction,
                model=ThreatModel.SEMI_HONEST,
            )
            min_survivors = probe.min_survivors
        encoding = alg.encoding(
            job, plan, task, participants=len(invited), min_survivors=min_survivors
        )
        if secure:
            params = RoundParameters(
                num_clients=len(invited),
                degree=probe.degree,
                threshold=probe.threshold,
                ring_bits=encoding.ring_bits,
                vector_length=task.vector_length,
                min_survivors=min_survivors,
                encoding=encoding,
            )
        claimed_json = [
            event_to_json(e)
            for e in alg.invitation_events(
                job, plan, round_number=round_number, population=population
            )
        ]
        wire_params = alg.parse_task(_wire(task.params.to_json()))
        wire_encoding = EncodingConfig.from_json(encoding.to_json())
        vectors = []
        for agent_id in invited:
            claimed = [event_from_json(e) for e in _wire(claimed_json)]
            alg.agent_check(
                wire_params,
                claimed,
                wire_encoding,
                num_clients=len(invited),
                min_survivors=min_survivors,
                honest_fraction=wire_params.honest_fraction,
            )
            # the agent records its own charge before it sends its masked input
            result.agent_ledgers.setdefault(agent_id, []).extend(
                alg.agent_charge(wire_params, claimed)
            )
            stream = rng.child(f"agent/{agent_id}").stream(f"encode/{round_number}")
            contribution = alg.agent_contribution(
                wire_params,
                agents[agent_id],
                model=result.state.model if task.model_version is not None else None,
                public_x=coordinator_data.public_for_agents() if task.needs_public_data else None,
                device=device,
                encoding=wire_encoding,
                stream=stream,
            )
            assert contribution.dtype == np.uint64
            assert contribution.shape == (task.vector_length,)
            vectors.append(contribution)

        def commit(
            summed: Collection[int],
            round_number: int = round_number,
            invited: tuple[str, ...] = invited,
        ) -> None:
            participants = [invited[i] for i in sorted(summed)]
            charges = alg.charges(
                job,
                plan,
                round_number=round_number,
                population=population,
                participants=participants,
            )
            for client, charge in charges.items():
                result.ledger.setdefault(client, []).append(charge)

        drops = (dropouts or {}).get(round_number, {})
        if params is not None:
            holder: dict[str, frozenset[int]] = {}

            def before_unmask(ready: ServerReadyToUnmask, holder: Any = holder) -> None:
                holder["a3"] = ready.a3
                commit(ready.a3)

            outcome = simulate(
                vectors,
                params=params,
                dropouts=drops,
                rng=rng.child(f"secagg/{round_number}"),
                job_id=job.name,
                round=round_number,
                before_unmask=before_unmask,
            )
            total, summed = outcome.aggregate, holder["a3"]
            total = restore_dropped_noise(
                total,
                encoding,
                accepted=len(invited),
                summed=len(summed),
                stream=rng.child(f"dropped-noise/{round_number}").stream("noise"),
            )
        else:
            gone = set().union(*drops.values()) if drops else set()
            summed = frozenset(i for i in range(len(invited)) if i not in gone)
            commit(summed)
            total = np.zeros(task.vector_length, dtype=np.uint64)
            for i in summed:
                total = total + vectors[i]  # uint64 wraps mod 2^64
            if encoding.ring_bits < 64:
                total &= np.uint64((1 << encoding.ring_bits) - 1)
        aggregate = decode(total, config=encoding)
        round_outcome = alg.finish_round(
            job,
            plan,
            result.state,
            coordinator_data,
            round_number=round_number,
            aggregate=aggregate,
            survivors=len(summed),
        )
        result.state = round_outcome.state
        # states are JSON, blobs aside (docs/algorithms.md#invariants-of-every-algorithm)
        _wire(dict(result.state.details))
        result.rounds.append(
            RoundRecord(
                round_number,
                invited,
                tuple(invited[i] for i in sorted(summed)),
                dict(round_outcome.metrics),
                encoding,
            )
        )
        if round_outcome.done:
            break
    return result


def _noise_alone(
    result: HarnessResult,
    alg: Algorithm,
    data: CoordinatorData,
    task: RoundTask,
    round_number: int,
    rng: RandomSource,
) -> bool:
    """An empty sample released as the coordinator releases it: the population charged, then
    the noise alone (:meth:`Algorithm.noise_alone_encoding`) decoded and finished with; whether
    the job is done."""
    job, plan = result.job, result.plan
    charges = alg.charges(
        job, plan, round_number=round_number, population=result.population, participants=[]
    )
    for client, charge in charges.items():
        result.ledger.setdefault(client, []).append(charge)
    encoding = alg.noise_alone_encoding(job, plan, task)
    total = encode(
        np.zeros(task.vector_length),
        config=encoding,
        stream=rng.stream(f"noise-alone/{round_number}"),
    )
    outcome = alg.finish_round(
        job,
        plan,
        result.state,
        data,
        round_number=round_number,
        aggregate=decode(total, config=encoding),
        survivors=0,
    )
    result.state = outcome.state
    result.rounds.append(RoundRecord(round_number, (), (), dict(outcome.metrics), encoding))
    return outcome.done


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
