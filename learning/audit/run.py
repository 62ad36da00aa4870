"""Run a job in simulation with canaries and audit it (``dpfl audit``).

The job's rounds run on the coordinator's own round driver (:mod:`dpfl.learning.rounds`: release
policy, setup, commit, restoration, decode, ``finish_round``) with the algorithm's agent
functions, the code paths a deployment runs for everything the privacy rests on; secure
aggregation is replaced by the modular sum it reveals, and canaries are added to that sum (canary
agents add no noise). ε_upper is the
ledger's ε for a canary's unit, ε_lower comes from
:func:`dpfl.accounting.audit.epsilon_lower_from_scores`
(docs/audit.md#which-code-path-is-audited-learningauditrunpy).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from pydantic import JsonValue

from dpfl.accounting import ComposedEvent, DpEvent, NoPrivacyEvent, compute_epsilon
from dpfl.accounting.audit import epsilon_lower_from_scores, planned_guess_count
from dpfl.accounting.audit_fdp import gdp_lower_from_scores, gdp_mu_lower_bound
from dpfl.learning.algorithms.base import (
    AgentData,
    AlgorithmError,
    AnyAlgorithm,
    ClientCharge,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
)
from dpfl.learning.algorithms.dp_fedavg import FedAvgFamily
from dpfl.learning.algorithms.dp_fedsgd import DpFedSgd
from dpfl.learning.algorithms.dp_helmet import DpHelmet
from dpfl.learning.algorithms.parts.data_sizes import simulated_federation
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.algorithms.voting import VotingAlgorithm
from dpfl.learning.audit import fedavg, fedsgd, helmet, voting
from dpfl.learning.audit.canaries import ADD_REMOVE, CanaryDesign, CanarySet
from dpfl.learning.jobs import JobSpec
from dpfl.learning.rounds import (
    Acceptance,
    Commit,
    Invitation,
    RoundJob,
    Summed,
    SumSetup,
    run_round,
)
from dpfl.learning.rounds.driver import NoiseStreams
from dpfl.learning.rounds.state import Commitment
from dpfl.mechanisms.encoding import to_ring
from dpfl.secagg import SeededRandomSource

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
    entered the sum, what each affected client is charged, and the round's f₁ (the fraction of
    the charged noise one agent's share carries)."""

    number: int
    invited: tuple[str, ...]
    participants: tuple[str, ...]
    charges: Mapping[str, ClientCharge]
    own_noise_fraction: float | None = None


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

    def to_json(self) -> dict[str, JsonValue]:
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
        algorithm: the algorithm instance (default: the job's, its sampling drawn from seed).
        device: where agents compute.
        catch_all: add r = m to the planned count (a union bound over the two), which catches
            a mechanism far leakier than planned at the price of half the level.

    Raises:
        TooManyCanariesError: more canaries than coordinates (``available`` fit).
        AlgorithmError: a bad mode, too few agents, or a job the canary design cannot audit.
    """
    started, rng = time.perf_counter(), SeededRandomSource(seed)
    alg = algorithm or get_algorithm(job.algorithm).with_random_source(rng.child("audit/select"))
    _check_request(job, alg, mode, agents)
    coordinator_data, agent_data = data if data is not None else simulated_federation(job, agents)
    real = tuple(agent_data)[:agents]
    if len(real) < agents:
        raise AlgorithmError(f"the data holds {len(real)} agents, {agents} were asked for")
    audited = _prepare(job, alg, (coordinator_data, agent_data), real, rng, canaries, coordinates)
    audited.device = device
    initial = _model_vector(job, audited.state, coordinator_data) if mode == BLACK_BOX else None
    asyncio.run(audited.rounds(white_box=mode == WHITE_BOX))
    scores, cset = audited.scores, audited.cset
    if initial is not None and alg.model_direction is not None:
        moved = _model_vector(job, audited.state, coordinator_data) - initial
        scores = alg.model_direction * cset.signs * moved[cset.coordinates]
    counts = _guess_counts(audited, job.privacy.delta, confidence, guesses, catch_all)
    return _report(audited, scores, mode, confidence, counts, time.perf_counter() - started)


def _check_request(job: JobSpec, alg: AnyAlgorithm, mode: str, agents: int) -> None:
    if mode not in MODES:
        raise AlgorithmError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if agents < 2:
        raise AlgorithmError(f"an audit needs at least 2 agents, got {agents}")
    if mode == BLACK_BOX and alg.model_direction is None:
        raise AlgorithmError(
            f"black-box audits need a model that moves along the aggregates; {job.algorithm} "
            "releases votes or a one-round model: use the white-box mode"
        )


def _prepare(
    job: JobSpec,
    alg: AnyAlgorithm,
    data: tuple[CoordinatorData, Mapping[str, AgentData]],
    real: tuple[str, ...],
    rng: SeededRandomSource,
    canaries: int | None,
    coordinates: npt.NDArray[np.int64] | None,
) -> _Audited:
    """The audited run before its first round: plan, canary design, canaries, population."""
    agents, (coordinator_data, agent_data) = len(real), data
    # A plan of the population with every possible canary agent: independent of the bits.
    probe_plan = alg.plan(job, population=agents, data=coordinator_data)
    design = canary_design(alg, job, probe_plan)
    if canaries is None:
        probe = alg.bind(job, probe_plan)
        probe_task = probe.round_task(probe.initial_state(coordinator_data), round_number=1)
        canaries = min(DEFAULT_CANARIES, canary_capacity(probe_task.vector_length, coordinates))
    agent_canaries = design.unit == "agent"
    plan = (
        alg.plan(job, population=agents + canaries, data=coordinator_data)
        if agent_canaries
        else probe_plan
    )
    side = alg.bind(job, plan)
    state = side.initial_state(coordinator_data)
    cset = CanarySet.draw(
        count=canaries,
        dimension=side.round_task(state, round_number=1).vector_length,
        agents=agents,
        stream=rng.stream("audit/canaries"),
        allowed=coordinates,
    )
    replace_one = design.relation != ADD_REMOVE
    if (design.amplitude if not replace_one else design.amplitude // 2) < 1:
        raise AlgorithmError(f"the charged sensitivity {design.amplitude} leaves no canary")
    canary_ids = [f"canary-{j:05d}" for j in range(canaries)]
    exists = np.ones(canaries, dtype=bool) if replace_one else cset.included
    present = [canary_ids[j] for j in range(canaries) if exists[j]]
    hosts = [real[h] for h in sorted(set(cset.hosts.tolist()))]
    return _Audited(
        RoundJob(job.name, side, coordinator_data),
        agent_data,
        real,
        [*real, *present] if agent_canaries else list(real),
        tuple(present if agent_canaries else hosts),
        cset,
        design,
        {cid: j for j, cid in enumerate(canary_ids)} if agent_canaries else {},
        exists,
        rng,
        state,
    )


def _report(
    audited: _Audited,
    scores: npt.NDArray[np.float64],
    mode: str,
    confidence: float,
    counts: tuple[list[int], list[int]],
    seconds: float,
) -> AuditReport:
    """The two lower bounds on the run's scores, ε_upper from its ledger: the report."""
    job, design, cset = audited.job.spec, audited.design, audited.cset
    delta = job.privacy.delta
    units = [audited.ledger.get(u, []) for u in audited.units]
    bound = epsilon_lower_from_scores(
        scores, cset.included, delta=delta, confidence=confidence, guess_counts=counts[0]
    )
    gdp = gdp_lower_from_scores(
        scores, cset.included, delta=delta, confidence=confidence, guess_counts=counts[1]
    )
    return AuditReport(
        job=job.name,
        algorithm=job.algorithm,
        mode=mode,
        unit=design.unit,
        relation=design.relation,
        canaries=int(cset.signs.size),
        included=int(cset.included.sum()),
        guesses=bound.best.guesses,
        correct=bound.best.correct,
        confidence=confidence,
        delta=delta,
        epsilon_lower=bound.epsilon_lower,
        epsilon_upper=max((_epsilon(events, delta) for events in units), default=0.0),
        rounds=audited.completed,
        design=design.description,
        seconds=seconds,
        mu_lower=gdp.mu_lower,
        epsilon_lower_gdp=gdp.epsilon_lower,
        gdp_guesses=gdp.best.guesses,
        gdp_correct=gdp.best.correct,
        trace=AuditTrace(rounds=tuple(audited.trace), units=audited.units),
    )


def _guess_counts(
    audited: _Audited, delta: float, confidence: float, guesses: int | None, catch_all: bool
) -> tuple[list[int], list[int]]:
    """The guess counts of the (ε, δ) and the GDP bound: ``guesses`` when given, else the plan's
    choice for the expected signal-to-noise ``ratio`` and, with ``catch_all``, every canary
    (which catches a mechanism far leakier than planned), under a union bound."""
    if guesses is not None:
        return [guesses], [guesses]
    canaries, variance = audited.cset.signs.size, audited.noise_variance
    ratio = audited.expected_signal / math.sqrt(variance) if variance > 0 else 10.0
    shift = max(ratio, 1e-6)
    planned = planned_guess_count(
        m=canaries, shift_over_std=shift, delta=delta, confidence=confidence
    )
    planned_gdp = planned_guess_count(
        m=canaries,
        shift_over_std=shift,
        delta=delta,
        confidence=confidence,
        lower_bound=lambda m, r, v: gdp_mu_lower_bound(m=m, r=r, v=v, confidence=confidence),
    )
    if not catch_all:
        return [planned], [planned_gdp]
    return sorted({planned, canaries}), sorted({planned_gdp, canaries})


@dataclass
class _Audited:
    """The audited run on the round driver: its cohort (the real agents' own contributions, the
    canaries added to the sum; canary agents add no noise) and its ledger, and what the audit
    reads of each released round."""

    job: RoundJob
    agent_data: Mapping[str, AgentData]
    real: tuple[str, ...]
    population: list[str]
    units: tuple[str, ...]  # whose ledger ε is ε_upper: the canaries' units
    cset: CanarySet
    design: CanaryDesign
    canary_index: Mapping[str, int]  # canary agents (agent-level canaries only)
    exists: npt.NDArray[np.bool_]
    rng: SeededRandomSource
    state: CoordinatorState
    device: str = "cpu"
    invitation: Invitation | None = None
    ledger: dict[str, list[DpEvent]] = field(default_factory=dict)
    trace: list[AuditRound] = field(default_factory=list)
    scores: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    expected_signal: float = 0.0
    noise_variance: float = 0.0
    completed: int = 0

    async def rounds(self, *, white_box: bool) -> None:
        population = self.population
        side, spec, design = self.job.coordinator, self.job.spec, self.design
        self.scores = np.zeros(self.cset.signs.size, dtype=np.float64)
        for number in range(1, spec.rounds + 1):
            invited = side.select(round_number=number, population=population)
            self.invitation = None
            end = await run_round(
                self.job,
                number=number,
                state=self.state,
                population=population,
                invited=invited,
                cohort=self,
                ledger=self,
                noise=self._streams(number),
            )
            if end.outcome is None or end.encoding is None or end.aggregate is None:
                continue  # skipped, as by the coordinator: nothing sent, nothing charged
            if white_box:
                self.scores += self.cset.signs * end.aggregate[self.cset.coordinates]
            scale = math.ldexp(1.0, end.encoding.scale_bits)
            carriers = sum(1 for a in end.accepted if a not in self.canary_index)
            half = design.amplitude // 2
            difference = design.amplitude if design.relation == ADD_REMOVE else 2 * half
            share = carriers / len(self.real)
            self.expected_signal += difference * design.presence_rate * share / scale
            self.noise_variance += max(1, carriers) * end.encoding.noise.variance / scale**2
            self.state = end.outcome.state
            self.completed += 1
            if end.outcome.done:
                break
        if self.completed == 0:
            raise AlgorithmError("no round ran: every sample was too small for secure aggregation")

    def _streams(self, number: int) -> NoiseStreams:
        return lambda purpose: self.rng.stream(f"audit/{purpose}/{number}")

    async def invite(self, invitation: Invitation) -> Acceptance:
        self.invitation = invitation
        canaries = frozenset(a for a in invitation.invited if a in self.canary_index)
        return Acceptance(invitation.invited, noiseless=canaries)

    async def set_up(self, setup: SumSetup) -> None:
        del setup

    async def sum(self, setup: SumSetup, commit: Commit) -> Summed:
        invitation = self.invitation
        assert invitation is not None
        task, number = invitation.task, invitation.number
        agent = self.job.coordinator.algorithm.agent(task.params)
        total = np.zeros(setup.vector_length, dtype=np.uint64)
        public = self.job.data.public_for_agents() if task.needs_public_data else None
        for agent_id in setup.accepted:
            agent.check(
                invitation.events,
                setup.encoding,
                num_clients=len(setup.accepted),
                min_survivors=setup.min_survivors,
                honest_fraction=task.params.honest_fraction,
            )
            total = total + agent.contribution(  # uint64 wraps mod 2^64
                self.agent_data[agent_id],
                model=self.state.model if task.model_version is not None else None,
                public_x=public,
                device=self.device,
                encoding=setup.encoding,
                stream=self.rng.child(f"agent/{agent_id}").stream(f"round/{number}"),
            )
        canary_agents = tuple(a for a in invitation.invited if a in self.canary_index)
        participants = (*setup.accepted, *canary_agents)
        await commit(participants)
        canary_vector = self._canaries(invitation, setup, canary_agents)
        return Summed(total + to_ring(canary_vector, setup.encoding.ring_bits), participants)

    def _canaries(
        self, invitation: Invitation, setup: SumSetup, canary_agents: Sequence[str]
    ) -> npt.NDArray[np.int64]:
        """The canaries present in the round, as the vector they add to the sum."""
        cset, design = self.cset, self.design
        if self.canary_index:
            present = np.zeros(cset.signs.size, dtype=bool)
            present[[self.canary_index[a] for a in canary_agents]] = True
        else:
            hosted = np.isin(cset.hosts, [self.real.index(a) for a in setup.accepted])
            sampled = np.ones(cset.signs.size, dtype=bool)
            if design.presence_rate < 1.0:
                stream = self.rng.stream(f"audit/presence/{invitation.number}")
                threshold = np.uint64(min(2**64 - 1, int(design.presence_rate * 2.0**64)))
                sampled = stream.uint64(cset.signs.size) < threshold
            present = hosted & sampled & self.exists
        replace_one, half = design.relation != ADD_REMOVE, design.amplitude // 2
        values = np.where(
            cset.included,
            cset.signs * (half if replace_one else design.amplitude),
            -cset.signs * half,
        )
        vector = np.zeros(setup.vector_length, dtype=np.int64)
        np.add.at(vector, cset.coordinates[present], values[present])
        return vector

    async def commit(self, commitment: Commitment) -> None:
        for client, charge in commitment.charges.items():
            self.ledger.setdefault(client, []).append(charge.event)
        invited = self.invitation.invited if self.invitation is not None else ()
        self.trace.append(
            AuditRound(
                commitment.number,
                invited,
                commitment.participants,
                commitment.charges,
                commitment.own_noise_fraction,
            )
        )
