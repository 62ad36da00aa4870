"""The contract between an algorithm and the two shells that run it (coordinator and agent).

An algorithm module subclasses :class:`Algorithm` and keeps its three sides together: the
coordinator side (plan, select, round task, encoding, and the next state from the decoded SUM),
the agent side (the vector it contributes, and the check that the setup delivers the claimed
privacy) and the privacy side (the charges a committed round makes, the events an invitation
announces, and what the agent records itself). The shells own transport, secure aggregation, the
ledger and the model store. The contract and its invariants:
docs/algorithms.md#the-contract-in-one-paragraph.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from dpfl.accounting import DpEvent
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec
from dpfl.secagg.encoding import EncodingConfig, encode
from dpfl.secagg.randomness import RandomSource, RandomStream

__all__ = [
    "AgentData",
    "Algorithm",
    "AlgorithmError",
    "ClientCharge",
    "CoordinatorData",
    "CoordinatorState",
    "JobPlan",
    "RoundOutcome",
    "RoundTask",
]


class AlgorithmError(LearningError, ValueError):
    """An algorithm refused its input: an inconsistent task, a wrong vector length, a plan that
    cannot meet its privacy target. The message names the problem."""


@dataclass(frozen=True, slots=True)
class JobPlan:
    """What the coordinator fixes once, at job start, and stores with the job.

    Attributes:
        noise_multiplier: z (the summed noise std over the L2 sensitivity), or the voting σ.
        calibration: how z was chosen, for the record: target ε and δ, the ε reached, the
            accountant's method, and closed-form alternatives where the papers give them.
        population: the number of clients the plan was calibrated for.
        details: anything else the algorithm needs in every round (JSON values only).
    """

    noise_multiplier: float
    calibration: Mapping[str, Any]
    population: int
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "calibration": dict(self.calibration),
            "population": self.population,
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobPlan:
        try:
            return cls(
                noise_multiplier=float(data["noise_multiplier"]),
                calibration=dict(data["calibration"]),
                population=int(data["population"]),
                details=dict(data.get("details", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AlgorithmError(f"malformed job plan: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class CoordinatorData:
    """The data the coordinator itself may hold: never any agent's private records.

    Attributes:
        input_shape: the shape of one example (sizes the model).
        num_classes: C.
        test_x, test_y: a held-out test split for evaluation, or None when the coordinator has
            none (then accuracy is not reported).
        public_x: the public unlabeled examples of voting algorithms (queries and student
            training), or None.
        public_y: the true labels of ``public_x``, for EVALUATION ONLY (simulations know them):
            voting algorithms report the accuracy of their pseudo-labels with them and never
            train on them. None in a deployment.
    """

    input_shape: tuple[int, ...]
    num_classes: int
    test_x: npt.NDArray[np.float32] | None = None
    test_y: npt.NDArray[np.int64] | None = None
    public_x: npt.NDArray[np.float32] | None = None
    public_y: npt.NDArray[np.int64] | None = None


@dataclass(frozen=True, slots=True)
class AgentData:
    """One silo's private data as its agent sees it."""

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    input_shape: tuple[int, ...]
    num_classes: int


@dataclass(frozen=True, slots=True)
class CoordinatorState:
    """The algorithm's state between rounds.

    Attributes:
        model: the current global model as bytes (``learning.params.model_to_bytes``), or None
            before a voting job has trained its student.
        model_version: the version number the shells store ``model`` under (0 = initial).
        details: JSON values (e.g. server momentum buffer reference, answered query indices,
            pseudo-labels so far).
        blobs: named binary attachments kept with the state (e.g. a momentum vector), stored by
            the shell next to the model version.
    """

    model: bytes | None
    model_version: int
    details: Mapping[str, Any] = field(default_factory=dict)
    blobs: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RoundTask:
    """What the invitees of one round are asked to compute.

    Attributes:
        params: JSON object sent as ``Invitation.params_json``; the agent side parses it.
        vector_length: m, the length of every agent's vector (and of the sum).
        model_version: the model version agents download first, or None.
        needs_public_data: agents must download the public data blob first.
    """

    params: Mapping[str, Any]
    vector_length: int
    model_version: int | None = None
    needs_public_data: bool = False


@dataclass(frozen=True, slots=True)
class ClientCharge:
    """What one client pays if the round commits (a row of the ledger).

    Attributes:
        event: the guaranteed privacy event.
        unit: "record" or "agent".
        approximate: the event is not a proven upper bound for the noise used: Gaussian
            noise rounded by each agent (a sum of discrete Gaussians is only close to one). A
            figure that is not a bound for the analysis is never a charge (DP-FedSGD's
            sum-dominating claim lives in the plan, ``details["claimed_epsilon"]``).
        secure_aggregation: False when vectors were summed without masking, so the event is the
            local-DP charge of one agent's own noise.
        honest_fraction: t the event assumes.
        data_dependent_event: an optional tighter, data-dependent figure (PATE/kNN); never used
            for budgets unless the operator opts in.
    """

    event: DpEvent
    unit: str
    approximate: bool = False
    secure_aggregation: bool = True
    honest_fraction: float = 1.0
    data_dependent_event: DpEvent | None = None


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """The result of a completed round, as the shells record it."""

    state: CoordinatorState
    metrics: Mapping[str, float] = field(default_factory=dict)  # e.g. {"accuracy": 0.81}
    done: bool = False  # the job has nothing left to do (e.g. all queries answered)


class Algorithm(abc.ABC):
    """One of the six algorithms; see the module docstring for the contract."""

    #: The job's ``algorithm`` tag, e.g. "dp-fedavg".
    name: ClassVar[str]

    # -- coordinator side --------------------------------------------------------------------

    @abc.abstractmethod
    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        """Calibrate the noise for the whole job (all rounds) and this population size.

        ``data`` (added, optional): the coordinator's data, whose input shape and number of
        classes fix the vector length that the integer (Skellam) sensitivities depend on. When
        None, an algorithm that needs them loads the job's data set spec
        (``job.data.dataset``) to learn them, which works for the built-in sets and for
        simulations; a coordinator that does not hold the data passes them here.

        Raises:
            AlgorithmError: the target cannot be met (e.g. a population too small).
        """

    @abc.abstractmethod
    def initial_state(self, job: JobSpec, plan: JobPlan, data: CoordinatorData) -> CoordinatorState:
        """The state before round 1 (an initialised model from the job's seed, say)."""

    @abc.abstractmethod
    def select(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> list[str]:
        """The clients invited to this round (Poisson sampling, all, a fixed-size sample...).

        Must draw from a CSPRNG (amplification by sampling rests on the secrecy of the sample).
        """

    def with_random_source(self, source: RandomSource) -> Algorithm:
        """This algorithm drawing its coordinator-side randomness (the client sample of
        :meth:`select`) from ``source``: a simulation passes a seeded source so that one seed
        replays the whole run. The default, for algorithms that draw nothing: ``self``."""
        del source
        return self

    def releases_every_sample(self, job: JobSpec, plan: JobPlan) -> bool:
        """Whether every sample :meth:`select` draws must be released, even one of 0 or 1
        clients (docs/accounting.md, "Client sampling: every sample is released").

        True when :meth:`charges` credits amplification by client sampling: the charged
        ``PoissonSampledEvent``/``SampledWithoutReplacementEvent`` bounds the release of
        ``M(S)`` for EVERY sample S, so a round skipped on a small sample would be another
        mechanism. Then the shells run a one-client sample in the plain transport (the agent's
        own noise carries the whole sum's) and an empty one as :meth:`noise_alone_encoding`'s
        noise alone. False (the default): a sample too small for secure aggregation is skipped,
        which is sound when the charge does not rest on the secrecy of the sample.
        """
        del job, plan
        return False

    def noise_alone_encoding(self, job: JobSpec, plan: JobPlan, task: RoundTask) -> EncodingConfig:
        """The encoding whose noise is the whole noise of the released sum of a round without
        dropouts: what the coordinator adds alone to release an empty sample as ``M(∅)``.

        Only algorithms whose :meth:`releases_every_sample` is True implement it.

        Raises:
            AlgorithmError: the algorithm never releases an empty sample.
        """
        del job, plan, task
        raise AlgorithmError(f"{self.name} never releases an empty sample")

    @abc.abstractmethod
    def round_task(
        self, job: JobSpec, plan: JobPlan, state: CoordinatorState, *, round_number: int
    ) -> RoundTask:
        """What this round's invitees compute."""

    @abc.abstractmethod
    def encoding(
        self,
        job: JobSpec,
        plan: JobPlan,
        task: RoundTask,
        *,
        participants: int,
        min_survivors: int,
    ) -> EncodingConfig:
        """The ring encoding, with each agent's share of the noise, for ``participants`` agents
        of which at least ``min_survivors`` will be summed.

        docs/algorithms.md#invariants-of-every-algorithm, 1.
        """

    @abc.abstractmethod
    def charges(
        self,
        job: JobSpec,
        plan: JobPlan,
        *,
        round_number: int,
        population: Sequence[str],
        participants: Sequence[str],
    ) -> dict[str, ClientCharge]:
        """What each affected client pays if the round commits.

        ``participants`` are the clients whose masked inputs were received (without secure
        aggregation: those about to be asked for their vector, charged first); ``population`` all
        clients of the job still within budget (DP-FedAvg charges all of them: amplification by
        sampling is a population-level guarantee).
        """

    @abc.abstractmethod
    def finish_round(
        self,
        job: JobSpec,
        plan: JobPlan,
        state: CoordinatorState,
        data: CoordinatorData,
        *,
        round_number: int,
        aggregate: npt.NDArray[np.float64],
        survivors: int,
    ) -> RoundOutcome:
        """Turn the decoded sum of ``survivors`` agents' vectors into the next state.

        Raises:
            AlgorithmError: the aggregate has the wrong length.
        """

    def invitation_events(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> tuple[DpEvent, ...]:
        """The events an invitation announces (``Invitation.privacy_events_json``).

        What :meth:`charges` will charge a participant of this round if it commits, known before
        the participants are: the default asks :meth:`charges` with every member of
        ``population`` taking part and returns the charge of the first one. Algorithms whose
        participants pay different events override it.

        Raises:
            AlgorithmError: an empty population.
        """
        members = list(population)
        if not members:
            raise AlgorithmError("an invitation needs a non-empty population")
        charges = self.charges(
            job, plan, round_number=round_number, population=members, participants=members
        )
        return (charges[members[0]].event,)

    # -- agent side --------------------------------------------------------------------------

    def agent_charge(
        self, params: Mapping[str, Any], events: Sequence[DpEvent]
    ) -> tuple[DpEvent, ...]:
        """What the AGENT records in its own local ledger for ``events`` (default: them as is).

        The agent does not trust the coordinator
        (docs/architecture.md#rule-3-budgets-are-enforced-on-both-sides): an algorithm whose
        claimed events rest on something only the coordinator does (e.g. amplification by client
        sampling, which the agent cannot verify and which does not hold against the coordinator
        that knows the sample) returns here the conservative event the agent can stand behind.
        Amplification that the agent performs itself (Poisson sampling of its own records)
        stays. The result must be an upper bound on the agent's true cost given that it took part.

        Raises:
            AlgorithmError: events of a shape this algorithm never charges.
        """
        del params
        return tuple(events)

    @abc.abstractmethod
    def agent_check(
        self,
        params: Mapping[str, Any],
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> None:
        """Refuse a task whose noise would not deliver the privacy ``events`` claim.

        The agent does not trust the coordinator's arithmetic: the per-agent noise of
        ``encoding``, summed over the ``honest_fraction`` of ``min_survivors`` agents, must carry
        at least the noise the events were computed with.

        Raises:
            AlgorithmError: naming the mismatch.
        """

    def agent_compute(
        self,
        params: Mapping[str, Any],
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> npt.NDArray[np.float64]:
        """The real vector this agent contributes, L2-clipped to the task's bound.

        Every algorithm overrides this or :meth:`agent_contribution` (the default of which
        encodes what this returns); the base version refuses.

        Raises:
            AlgorithmError: malformed params, or a model/public blob that does not fit.
        """
        del params, data, model, public_x, device
        raise AlgorithmError(
            f"{self.name} computes its contribution in agent_contribution (with the round's "
            "encoding), not as a real vector"
        )

    def agent_contribution(
        self,
        params: Mapping[str, Any],
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
        encoding: EncodingConfig,
        stream: RandomStream,
    ) -> npt.NDArray[np.uint64]:
        """What this agent puts into the secure sum: its vector in Z_{2^r}, noise included.

        Called by the shells once the round's setup is known (after :meth:`agent_check`
        accepted ``encoding``), on the agent's device. The default encodes
        :meth:`agent_compute`'s real vector with ``encoding`` (clip, scale, conditional
        stochastic rounding, the agent's share of the integer noise, mod 2^r) drawing from
        ``stream``. An algorithm that adds its noise inside the computation overrides this, and
        then owns the whole guarantee: the returned vector must carry at least the noise its
        events claim, and the sum of ``num_clients`` such vectors must not wrap the ring.

        Args:
            params: the task (``Invitation.params_json``).
            data: the agent's private data.
            model: the downloaded model, or None.
            public_x: the job's public data, or None.
            device: where to compute.
            encoding: the round's encoding (``SecAggSetup.encoding_json``): scale, ring and
                this agent's share of the noise.
            stream: a CSPRNG stream private to this agent and round (rounding and noise).

        Returns:
            A uint64 vector of the round's vector length, every value below 2^r.

        Raises:
            AlgorithmError: malformed params, data or blobs.
        """
        vector = self.agent_compute(params, data, model=model, public_x=public_x, device=device)
        return encode(vector, config=encoding, stream=stream)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm whose job tag is ``name`` (module ``learning/algorithms/<name>.py`` with
    dashes as underscores, exposing ``ALGORITHM``, an :class:`Algorithm` instance).

    Raises:
        AlgorithmError: no such algorithm is implemented.
    """
    import importlib

    module_name = name.replace("-", "_")
    if not module_name.replace("_", "").isalnum():
        raise AlgorithmError(f"unknown algorithm {name!r}")
    try:
        module = importlib.import_module(f"dpfl.learning.algorithms.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"dpfl.learning.algorithms.{module_name}":
            raise
        raise AlgorithmError(f"unknown algorithm {name!r}") from None
    algorithm = getattr(module, "ALGORITHM", None)
    if not isinstance(algorithm, Algorithm) or algorithm.name != name:
        raise AlgorithmError(f"module {module.__name__} does not define ALGORITHM for {name!r}")
    return algorithm
