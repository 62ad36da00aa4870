"""Run a job in simulation with canaries and audit it (``dpfl audit``).

The job runs through the algorithm's own coordinator and agent functions, the code paths a
deployment runs for everything the privacy rests on; secure aggregation is replaced by the modular
sum it reveals, and each sample is released, skipped or replaced by the noise alone by the
coordinator's own policy (:func:`dpfl.learning.algorithms.release.release_for`). ε_upper is the
ledger's ε for a canary's unit, ε_lower comes from
:func:`dpfl.accounting.audit.epsilon_lower_from_scores`
(docs/audit.md#which-code-path-is-audited-learningauditrunpy).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from dpfl.accounting import ComposedEvent, DpEvent, NoPrivacyEvent, compute_epsilon
from dpfl.accounting.audit import epsilon_lower_from_scores, planned_guess_count
from dpfl.accounting.audit_fdp import gdp_lower_from_scores, gdp_mu_lower_bound
from dpfl.learning.algorithms.base import (
    AgentData,
    AlgorithmError,
    AnyAlgorithm,
    ClientCharge,
    CoordinatorData,
    JobPlan,
    RoundTask,
    get_algorithm,
)
from dpfl.learning.algorithms.dp_fedavg import FedAvgFamily
from dpfl.learning.algorithms.dp_fedsgd import DpFedSgd
from dpfl.learning.algorithms.dp_helmet import DpHelmet
from dpfl.learning.algorithms.federation import simulated_federation
from dpfl.learning.algorithms.release import Release, release_for, secure_sum
from dpfl.learning.algorithms.voting import VotingAlgorithm
from dpfl.learning.audit import fedavg, fedsgd, helmet, voting
from dpfl.learning.audit.canaries import ADD_REMOVE, CanaryDesign, CanarySet
from dpfl.learning.jobs import JobSpec
from dpfl.secagg import (
    EncodingConfig,
    RoundParameters,
    SeededRandomSource,
    ThreatModel,
    decode,
    encode,
)
from dpfl.secagg.encoding import to_ring

__all__ = [
    "DEFAULT_CANARIES",
    "MODES",
    "AuditReport",
    "AuditRound",
    "AuditTrace",
    "canary_capacity",
    "canary_design",
    "run_audit",
]

WHITE_BOX = "white-box"
BLACK_BOX = "black-box"
MODES = (WHITE_BOX, BLACK_BOX)

Design = Callable[[AnyAlgorithm, JobSpec, JobPlan], CanaryDesign]
#: The design of each audited family, found along the algorithm's class hierarchy (so a new
#: member of a family is audited as the family is).
_DESIGNS: tuple[tuple[type[AnyAlgorithm], Design], ...] = (
    (FedAvgFamily, fedavg.design),
    (DpFedSgd, fedsgd.design),
    (DpHelmet, helmet.design),
    (VotingAlgorithm, voting.design),
)


@dataclass(frozen=True)
class AuditRound:
    """One round of the audited run as the ledger sees it: who was invited, whose input
    entered the sum, and what each affected client is charged."""

    number: int
    invited: tuple[str, ...]
    participants: tuple[str, ...]
    charges: Mapping[str, ClientCharge]


@dataclass(frozen=True)
class AuditTrace:
    """The audited run's rounds and the ids whose ledger ε is ε_upper (the canaries' units:
    canary agents, or the real agents that hold canary records)."""

    rounds: tuple[AuditRound, ...] = ()
    units: tuple[str, ...] = ()


@dataclass(frozen=True)
class AuditReport:
    """What ``dpfl audit`` prints and the coordinator stores with the job.

    ``epsilon_lower`` is the (ε, δ) lower bound (Steinke–Nasr–Jagielski); ``mu_lower`` the
    μ-GDP lower bound (the f-DP one-run bound) and ``epsilon_lower_gdp`` its ε at δ, a bound
    within the Gaussian family only (docs/audit.md). ``trace`` is not part of the JSON.
    """

    job: str
    algorithm: str
    mode: str
    unit: str
    relation: str
    canaries: int
    included: int
    guesses: int
    correct: int
    confidence: float
    delta: float
    epsilon_lower: float
    epsilon_upper: float
    rounds: int
    design: str
    seconds: float
    mu_lower: float = 0.0
    epsilon_lower_gdp: float = 0.0
    gdp_guesses: int = 0
    gdp_correct: int = 0
    trace: AuditTrace = field(default_factory=AuditTrace, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trace"}


@runtime_checkable
class DesignsCanaries(Protocol):
    """An algorithm that states its own canary design (a plugin outside the audited families)."""

    def canary_design(self, job: JobSpec, plan: JobPlan) -> CanaryDesign: ...


def canary_design(algorithm: AnyAlgorithm, job: JobSpec, plan: JobPlan) -> CanaryDesign:
    """The algorithm's own canary design, else its family's.

    Raises:
        AlgorithmError: an algorithm without a design, or a job the design cannot audit.
    """
    if isinstance(algorithm, DesignsCanaries):
        return algorithm.canary_design(job, plan)
    for family, make in _DESIGNS:
        if isinstance(algorithm, family):
            return make(algorithm, job, plan)
    raise AlgorithmError(
        f"no canary design for algorithm {algorithm.name!r}: it belongs to no audited family "
        "and defines no canary_design(job, plan)"
    )


def _model_vector(job: JobSpec, state: Any, data: CoordinatorData) -> npt.NDArray[np.float64]:
    from dpfl.learning.algorithms.model_update import load_model
    from dpfl.learning.params import flatten_parameters

    return np.asarray(
        flatten_parameters(load_model(job, state, data), dtype=np.float64), dtype=np.float64
    )


def _round_encoding(
    alg: AnyAlgorithm, job: JobSpec, plan: JobPlan, task: RoundTask, carriers: int
) -> tuple[EncodingConfig, int]:
    """The encoding of a round whose noise ``carriers`` real agents share, and the
    ``min_survivors`` they check it with, chosen as the coordinator's round engine chooses them:
    secure aggregation from two agents, the plain transport (``min_survivors = 1``) for one; with
    none, the noise one agent would carry alone (:meth:`Algorithm.noise_alone_encoding` where
    every sample is released)."""
    if carriers == 0:
        if alg.releases_every_sample(job, plan):
            return alg.noise_alone_encoding(job, plan, task), 1
        return alg.encoding(job, plan, task, participants=1, min_survivors=1), 1
    if not secure_sum(job, summands=carriers):
        return alg.encoding(job, plan, task, participants=carriers, min_survivors=1), 1
    probe = RoundParameters.choose(
        num_clients=carriers,
        vector_length=task.vector_length,
        ring_bits=64,
        corrupt_fraction=job.secagg.corrupt_fraction,
        dropout_fraction=job.secagg.dropout_fraction,
        model=ThreatModel.SEMI_HONEST,
    )
    encoding = alg.encoding(
        job, plan, task, participants=carriers, min_survivors=probe.min_survivors
    )
    return encoding, probe.min_survivors


def _epsilon(events: Sequence[DpEvent], delta: float) -> float:
    event = ComposedEvent(tuple(events)) if events else NoPrivacyEvent()
    return float(compute_epsilon(event, delta=delta).epsilon)


#: The canaries of an audit unless told otherwise (fewer when the released vector is shorter).
DEFAULT_CANARIES = 1000


def canary_capacity(dimension: int, coordinates: npt.NDArray[np.int64] | None = None) -> int:
    """How many canaries fit: one per distinct coordinate of the ``dimension``-long released
    vector (of ``coordinates`` when they are given)."""
    if coordinates is None:
        return int(dimension)
    return int(np.unique(np.asarray(coordinates, dtype=np.int64)).size)


def run_audit(
    job: JobSpec,
    *,
    agents: int,
    canaries: int | None = None,
    mode: str = WHITE_BOX,
    confidence: float = 0.95,
    seed: bytes = b"dpfl-audit-default-seed",
    guesses: int | None = None,
    coordinates: npt.NDArray[np.int64] | None = None,
    data: tuple[CoordinatorData, Mapping[str, AgentData]] | None = None,
    algorithm: AnyAlgorithm | None = None,
    device: str = "cpu",
    catch_all: bool = True,
) -> AuditReport:
    """Run ``job`` with ``agents`` simulated agents and ``canaries`` canaries; audit it.

    Args:
        job: the validated job.
        agents: the number of real (simulated) agents.
        canaries: m; None: :data:`DEFAULT_CANARIES`, or as many as the released vector has
            coordinates (those of ``coordinates``) when that is fewer (:func:`canary_capacity`).
        mode: ``white-box`` (every round's aggregate) or ``black-box`` (the final model).
        confidence: of the lower bound.
        seed: seed of every CSPRNG stream (canaries, noise, rounding, sampling).
        guesses: the number of guesses; default: the number chosen from the plan before the
            run (:func:`dpfl.accounting.audit.planned_guess_count`, per bound) and, with
            ``catch_all``, also m, each then tested at half the level.
        coordinates: the coordinates canaries may use (default: all of the released vector).
        data: the coordinator's data and the agents' (default: the job's data spec).
        algorithm: the algorithm instance (default: the job's, its client sampling drawn from
            ``seed``).
        device: where agents compute.
        catch_all: add r = m to the planned count (a union bound over the two), which catches
            a mechanism far leakier than planned at the price of half the level.

    Raises:
        TooManyCanariesError: more canaries than coordinates (its ``available`` says how many
            fit).
        AlgorithmError: a bad mode, too few agents, or a job the canary design cannot audit.
    """
    started = time.perf_counter()
    if mode not in MODES:
        raise AlgorithmError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if agents < 2:
        raise AlgorithmError(f"an audit needs at least 2 agents, got {agents}")
    rng = SeededRandomSource(seed)
    alg = (
        algorithm
        if algorithm is not None
        else get_algorithm(job.algorithm).with_random_source(rng.child("audit/select"))
    )
    coordinator_data, agent_data = data if data is not None else simulated_federation(job, agents)
    real = tuple(agent_data)[:agents]
    if len(real) < agents:
        raise AlgorithmError(f"the data holds {len(real)} agents, {agents} were asked for")
    # A plan of the population with every possible canary agent: independent of the bits.
    probe_plan = alg.plan(job, population=agents, data=coordinator_data)
    design = canary_design(alg, job, probe_plan)
    if canaries is None:
        capacity = canary_capacity(
            alg.round_task(
                job,
                probe_plan,
                alg.initial_state(job, probe_plan, coordinator_data),
                round_number=1,
            ).vector_length,
            coordinates,
        )
        canaries = min(DEFAULT_CANARIES, capacity)
    agent_canaries = design.unit == "agent"
    plan = (
        alg.plan(job, population=agents + canaries, data=coordinator_data)
        if agent_canaries
        else probe_plan
    )
    direction = alg.model_direction
    if mode == BLACK_BOX and direction is None:
        raise AlgorithmError(
            f"black-box audits need a model that moves along the aggregates; {job.algorithm} "
            "releases votes or a one-round model: use the white-box mode"
        )
    state = alg.initial_state(job, plan, coordinator_data)
    first_task = alg.round_task(job, plan, state, round_number=1)
    cset = CanarySet.draw(
        count=canaries,
        dimension=first_task.vector_length,
        agents=agents,
        stream=rng.stream("audit/canaries"),
        allowed=coordinates,
    )
    replace_one = design.relation != ADD_REMOVE
    half = design.amplitude // 2
    if (design.amplitude if not replace_one else half) < 1:
        raise AlgorithmError(f"the charged sensitivity {design.amplitude} leaves no canary")
    canary_ids = [f"canary-{j:05d}" for j in range(canaries)]
    exists = np.ones(canaries, dtype=bool) if replace_one else cset.included
    population = list(real)
    if agent_canaries:
        population += [canary_ids[j] for j in range(canaries) if exists[j]]
    real_set = set(real)
    canary_index = {cid: j for j, cid in enumerate(canary_ids)}
    initial = _model_vector(job, state, coordinator_data) if mode == BLACK_BOX else np.zeros(0)
    scores = np.zeros(canaries, dtype=np.float64)
    ledger: dict[str, list[DpEvent]] = {}
    trace: list[AuditRound] = []
    expected_signal = 0.0
    noise_variance = 0.0
    completed = 0
    for round_number in range(1, job.rounds + 1):
        invited = list(alg.select(job, plan, round_number=round_number, population=population))
        if release_for(alg, job, plan, invited=len(invited)) is Release.SKIP:
            continue  # as the coordinator's round engine: nothing sent, nothing charged
        real_invited = [a for a in invited if a in real_set]
        task = alg.round_task(job, plan, state, round_number=round_number)
        encoding, min_survivors = _round_encoding(alg, job, plan, task, len(real_invited))
        claimed = alg.invitation_events(job, plan, round_number=round_number, population=population)
        mask = np.uint64((1 << encoding.ring_bits) - 1) if encoding.ring_bits < 64 else None
        total = np.zeros(task.vector_length, dtype=np.uint64)
        if not real_invited:
            # an empty sample, or canaries alone (they add no noise): the noise alone stands
            # for the sum's, drawn as the coordinator draws it for an empty sample
            total = encode(
                np.zeros(task.vector_length),
                config=encoding,
                stream=rng.stream(f"audit/noise-alone/{round_number}"),
            )
        for agent_id in real_invited:
            alg.agent_check(
                task.params,
                claimed,
                encoding,
                num_clients=len(real_invited),
                min_survivors=min_survivors,
                honest_fraction=task.params.honest_fraction,
            )
            contribution = alg.agent_contribution(
                task.params,
                agent_data[agent_id],
                model=state.model if task.model_version is not None else None,
                public_x=coordinator_data.public_for_agents() if task.needs_public_data else None,
                device=device,
                encoding=encoding,
                stream=rng.child(f"agent/{agent_id}").stream(f"round/{round_number}"),
            )
            total = total + contribution  # uint64 wraps mod 2^64
        # the canaries present in this round
        if agent_canaries:
            present = np.zeros(canaries, dtype=bool)
            for cid in invited:
                if cid in canary_index:
                    present[canary_index[cid]] = True
            participants_in = sum(1 for a in invited if a in canary_index)
        else:
            hosted = np.isin(cset.hosts, [real.index(a) for a in real_invited])
            if design.presence_rate < 1.0:
                draws = rng.stream(f"audit/presence/{round_number}").uint64(canaries)
                sampled = draws < np.uint64(min(2**64 - 1, int(design.presence_rate * 2.0**64)))
            else:
                sampled = np.ones(canaries, dtype=bool)
            present = hosted & sampled & exists
            participants_in = 0
        values = np.where(
            cset.included,
            cset.signs * (half if replace_one else design.amplitude),
            -cset.signs * half,
        )
        canary_vector = np.zeros(task.vector_length, dtype=np.int64)
        np.add.at(canary_vector, cset.coordinates[present], values[present])
        total = total + to_ring(canary_vector, encoding.ring_bits)
        if mask is not None:
            total &= mask
        participants = real_invited + [a for a in invited if a in canary_index]
        charges = alg.charges(
            job, plan, round_number=round_number, population=population, participants=participants
        )
        for client, charge in charges.items():
            ledger.setdefault(client, []).append(charge.event)
        trace.append(AuditRound(round_number, tuple(invited), tuple(participants), charges))
        aggregate = decode(total, config=encoding)
        if mode == WHITE_BOX:
            scores += cset.signs * aggregate[cset.coordinates]
        scale = math.ldexp(1.0, encoding.scale_bits)
        share = len(real_invited) / agents
        difference = 2 * half if replace_one else design.amplitude
        expected_signal += difference * design.presence_rate * share / scale
        noise_variance += max(1, len(real_invited)) * encoding.noise.variance / scale**2
        outcome = alg.finish_round(
            job,
            plan,
            state,
            coordinator_data,
            round_number=round_number,
            aggregate=aggregate,
            survivors=len(real_invited) + participants_in,
        )
        state = outcome.state
        completed += 1
        if outcome.done:
            break
    if completed == 0:
        raise AlgorithmError("no round ran: every sample was too small for secure aggregation")
    if mode == BLACK_BOX and direction is not None:
        moved = _model_vector(job, state, coordinator_data) - initial
        scores = direction * cset.signs * moved[cset.coordinates]
    if agent_canaries:
        unit_ids = [canary_ids[j] for j in range(canaries) if exists[j]]
    else:
        unit_ids = [real[h] for h in sorted(set(cset.hosts.tolist()))]
    units = [ledger.get(u, []) for u in unit_ids]
    delta = job.privacy.delta
    epsilon_upper = max((_epsilon(events, delta) for events in units), default=0.0)
    if guesses is None:
        ratio = expected_signal / math.sqrt(noise_variance) if noise_variance > 0 else 10.0
        planned = planned_guess_count(
            m=canaries, shift_over_std=max(ratio, 1e-6), delta=delta, confidence=confidence
        )
        # the plan's choice, and every canary (which catches a mechanism far leakier than
        # planned), under a union bound
        counts = sorted({planned, canaries}) if catch_all else [planned]
        planned_gdp = planned_guess_count(
            m=canaries,
            shift_over_std=max(ratio, 1e-6),
            delta=delta,
            confidence=confidence,
            lower_bound=lambda m, r, v: gdp_mu_lower_bound(m=m, r=r, v=v, confidence=confidence),
        )
        gdp_counts = sorted({planned_gdp, canaries}) if catch_all else [planned_gdp]
    else:
        counts = gdp_counts = [guesses]
    bound = epsilon_lower_from_scores(
        scores, cset.included, delta=delta, confidence=confidence, guess_counts=counts
    )
    gdp = gdp_lower_from_scores(
        scores, cset.included, delta=delta, confidence=confidence, guess_counts=gdp_counts
    )
    return AuditReport(
        job=job.name,
        algorithm=job.algorithm,
        mode=mode,
        unit=design.unit,
        relation=design.relation,
        canaries=canaries,
        included=int(cset.included.sum()),
        guesses=bound.best.guesses,
        correct=bound.best.correct,
        confidence=confidence,
        delta=delta,
        epsilon_lower=bound.epsilon_lower,
        epsilon_upper=epsilon_upper,
        rounds=completed,
        design=design.description,
        seconds=time.perf_counter() - started,
        mu_lower=gdp.mu_lower,
        epsilon_lower_gdp=gdp.epsilon_lower,
        gdp_guesses=gdp.best.guesses,
        gdp_correct=gdp.best.correct,
        trace=AuditTrace(rounds=tuple(trace), units=tuple(unit_ids)),
    )
