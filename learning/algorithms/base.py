"""The contract between an algorithm and the two shells that run it (coordinator and agent).

An algorithm module subclasses :class:`Algorithm` and keeps its three sides together: the
coordinator side (plan, select, round task, encoding, and the next state from the decoded SUM),
the agent side (the vector it contributes, and the check that the setup delivers the claimed
privacy) and the privacy side (the charges a committed round makes, the events an invitation
announces, and what the agent records itself). The shells own transport, secure aggregation, the
ledger and the model store. The contract and its invariants:
docs/algorithms.md#the-contract-in-one-paragraph; adding one:
docs/adding-an-algorithm.md.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Generic, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from typing_extensions import TypeVar

from dpfl.accounting import DpEvent
from dpfl.learning.errors import AlgorithmError
from dpfl.learning.jobs import JobSpec, describe_error
from dpfl.mechanisms.encoding import EncodingConfig, encode
from dpfl.secagg.randomness import RandomSource, RandomStream, SystemRandomSource

__all__ = [
    "AgentData",
    "AgentSide",
    "Algorithm",
    "AlgorithmError",
    "AnyAgent",
    "AnyAlgorithm",
    "AnyCoordinator",
    "ClientCharge",
    "Contract",
    "CoordinatorData",
    "CoordinatorSide",
    "CoordinatorState",
    "JobPlan",
    "PlanDetails",
    "RoundCharge",
    "RoundOutcome",
    "RoundTask",
    "TaskParams",
]


class Contract(BaseModel):
    """A typed message between the coordinator and its agents, or kept in a round record:
    frozen, strict (no coercion of a string or a boolean into a number), finite numbers only,
    unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


ContractT = TypeVar("ContractT", bound=Contract)

_PATHED = re.compile(r"^[a-z_]+(\.[a-z_]+)*: ")
#: Why an agent refuses a task field it does not know: ignoring it could change what the
#: claimed privacy means (docs/agent.md, "Tasks with fields the agent does not know").
_UNKNOWN_TASK_FIELD = (
    "(this agent does not know it and refuses the task rather than ignore it: the agent may be "
    "older than the coordinator)"
)


def parse_contract(
    kind: type[ContractT], data: object, *, where: str, unknown: str = ""
) -> ContractT:
    """``data`` (a JSON object, its text, or a contract re-validated) as ``kind``, validated once,
    at the boundary.

    Raises:
        AlgorithmError: one ``where.field: problem`` entry per mistake; an unknown field's entry
            ends with ``unknown`` (why the reader refuses what it does not understand).
    """
    try:
        if isinstance(data, BaseModel):
            text: str | bytes = data.model_dump_json()
        elif isinstance(data, str | bytes):
            text = data
        else:
            text = json.dumps(data, allow_nan=False)
        return kind.model_validate_json(text)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            path = ".".join((where, *(str(p) for p in error["loc"])))
            message = describe_error(error)
            if not error["loc"] and _PATHED.match(message):  # a cross-field check names its field
                path, message = f"{where}.{message}".split(": ", 1)
            extra = f" {unknown}" if error["type"] == "extra_forbidden" and unknown else ""
            problems.append(f"{path}: {message}{extra}")
        raise AlgorithmError("; ".join(problems)) from None
    except (TypeError, ValueError) as exc:
        raise AlgorithmError(f"{where}: not a JSON object ({exc})") from None


class PlanDetails(Contract):
    """What every plan fixes for all its rounds (an algorithm's plan adds its own fields).

    Attributes:
        noise: the integer noise in the ring.
        noise_total: μ_total (Skellam) or σ_total (discrete Gaussian) of the summed noise.
        scale_bits: b, the encoding's scale 2^b.
        secure_aggregation: the vectors are masked.
        honest_fraction: t the noise split assumes.
        corrupt_fraction: the secure aggregation's, for the record.
    """

    noise: Literal["skellam", "gaussian"]
    noise_total: float = Field(gt=0)
    scale_bits: int = Field(ge=0)
    secure_aggregation: bool
    honest_fraction: float = Field(gt=0, le=1)
    corrupt_fraction: float = Field(ge=0, lt=1)

    def shown_claim(self) -> tuple[float, str] | None:
        """A labelled figure that is NOT a bound, shown beside the guaranteed ε (never charged),
        or None."""
        return None


class TaskParams(Contract):
    """What every task carries (``Invitation.params_json``); the agent's gate and policy read
    these fields, an algorithm's task adds its own.

    ``job_id`` is the store's stable id, added by the coordinator's shell.
    """

    algorithm: str
    job: str
    round: int = Field(ge=1)
    job_id: str | None = None
    noise: Literal["skellam", "gaussian"]
    noise_total: float = Field(gt=0)
    noise_multiplier: float = Field(gt=0)
    scale_bits: int = Field(ge=0)
    secure_aggregation: bool
    honest_fraction: float = Field(gt=0, le=1)
    unit: Literal["record", "agent"]
    delta: float = Field(gt=0, lt=1)

    @property
    def approximate(self) -> bool:
        """The events are approximate: Gaussian noise rounded by each agent."""
        return self.noise == "gaussian"

    def to_json(self) -> dict[str, JsonValue]:
        """The wire form (``Invitation.params_json``), without unset optional fields."""
        data: dict[str, JsonValue] = self.model_dump(mode="json", exclude_none=True)
        return data


@dataclass(frozen=True, slots=True)
class JobPlan:
    """What the coordinator fixes once, at job start, and stores with the job.

    Attributes:
        noise_multiplier: z (the summed noise std over the L2 sensitivity), or the voting σ.
        calibration: how z was chosen, for the record: target ε and δ, the ε reached, the
            accountant's method, and closed-form alternatives where the papers give them.
        population: the number of clients the plan was calibrated for.
        details: the algorithm's typed plan (its ``plan_type``).
    """

    noise_multiplier: float
    calibration: Mapping[str, Any]
    population: int
    details: PlanDetails

    def to_json(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "calibration": dict(self.calibration),
            "population": self.population,
            "details": self.details.model_dump(mode="json"),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], details: type[PlanDetails]) -> JobPlan:
        """A stored plan, its details validated as ``details``.

        Raises:
            AlgorithmError: a malformed plan, naming the field.
        """
        try:
            return cls(
                noise_multiplier=float(data["noise_multiplier"]),
                calibration=dict(data["calibration"]),
                population=int(data["population"]),
                details=parse_contract(details, data.get("details", {}), where="plan.details"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, AlgorithmError):
                raise
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
        agent_readable: how many of ``public_x``'s records, the first ones, agents may read (the
            public blob holds exactly those); None: all (``data.public.agent_readable``).
    """

    input_shape: tuple[int, ...]
    num_classes: int
    test_x: npt.NDArray[np.float32] | None = None
    test_y: npt.NDArray[np.int64] | None = None
    public_x: npt.NDArray[np.float32] | None = None
    public_y: npt.NDArray[np.int64] | None = None
    agent_readable: int | None = None

    def public_for_agents(self) -> npt.NDArray[np.float32] | None:
        """The public records agents may read: the first ``agent_readable`` of ``public_x``."""
        if self.public_x is None or self.agent_readable is None:
            return self.public_x
        return self.public_x[: self.agent_readable]


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
        params: the typed task, sent as ``Invitation.params_json`` (``params.to_json()``).
        vector_length: m, the length of every agent's vector (and of the sum).
        model_version: the model version agents download first, or None.
        needs_public_data: agents must download the public data blob first.
    """

    params: TaskParams
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


@dataclass(frozen=True, slots=True)
class RoundCharge:
    """What a committed round charges: one charge, paid by every participant, and by every
    member of ``population`` when the charge credits amplification by client sampling (a
    population-level guarantee). Computed once per round; the invitation announces its event,
    the ledger commits :meth:`charges`.

    Attributes:
        charge: what each charged client pays.
        population: the clients of the job still within budget.
        population_wide: every member of ``population`` pays, not only the participants.
    """

    charge: ClientCharge
    population: tuple[str, ...] = ()
    population_wide: bool = False

    @property
    def events(self) -> tuple[DpEvent, ...]:
        """What an invitation announces (``Invitation.privacy_events_json``)."""
        return (self.charge.event,)

    def charges(self, participants: Sequence[str]) -> dict[str, ClientCharge]:
        """Who pays if the round commits with ``participants`` (never under-count: a participant
        outside the population pays too)."""
        payers = [*self.population, *participants] if self.population_wide else participants
        return dict.fromkeys(payers, self.charge)


SpecT = TypeVar("SpecT", bound=JobSpec, covariant=True, default=JobSpec)
PlanT = TypeVar("PlanT", bound=PlanDetails, covariant=True, default=PlanDetails)
TaskT = TypeVar("TaskT", bound=TaskParams, covariant=True, default=TaskParams)


class CoordinatorSide(abc.ABC, Generic[SpecT, PlanT, TaskT]):
    """An algorithm bound to one job and its plan (:meth:`Algorithm.bind`): what the
    coordinator asks of it during the job's rounds, with the job and plan already narrowed to
    the algorithm's own types (``spec``, ``details``).
    """

    def __init__(
        self, algorithm: Algorithm[SpecT, PlanT, TaskT], spec: SpecT, plan: JobPlan, details: PlanT
    ) -> None:
        self.algorithm, self.name = algorithm, algorithm.name
        self.spec, self.plan, self.details = spec, plan, details

    def task_params(self, round_number: int) -> TaskParams:
        """The fields every task of this job carries in round ``round_number``, from the job
        and the plan (an algorithm's task extends them)."""
        d, privacy = self.details, self.spec.privacy
        return TaskParams(
            algorithm=self.name,
            job=self.spec.name,
            round=round_number,
            noise=d.noise,
            noise_total=d.noise_total,
            noise_multiplier=self.plan.noise_multiplier,
            scale_bits=d.scale_bits,
            secure_aggregation=d.secure_aggregation,
            honest_fraction=d.honest_fraction,
            unit=privacy.unit,
            delta=privacy.delta,
        )

    @abc.abstractmethod
    def initial_state(self, data: CoordinatorData) -> CoordinatorState:
        """The state before round 1 (an initialised model from the job's seed, say)."""

    @abc.abstractmethod
    def select(self, *, round_number: int, population: Sequence[str]) -> list[str]:
        """The clients invited to this round (Poisson sampling, all, a fixed-size sample...).

        Must draw from a CSPRNG (amplification by sampling rests on the secrecy of the sample).
        """

    @property
    def releases_every_sample(self) -> bool:
        """Whether every sample :meth:`select` draws must be released, even one of 0 or 1
        clients (docs/accounting.md, "Client sampling: every sample is released").

        True when the round's charge credits amplification by client sampling: the charged
        ``PoissonSampledEvent``/``SampledWithoutReplacementEvent`` bounds the release of
        ``M(S)`` for EVERY sample S, so a round skipped on a small sample would be another
        mechanism. Then the shells run a one-client sample in the plain transport (the agent's
        own noise carries the whole sum's) and an empty one as :meth:`noise_alone_encoding`'s
        noise alone. False (the default): a sample too small for secure aggregation is skipped,
        which is sound when the charge does not rest on the secrecy of the sample.
        """
        return False

    def noise_alone_encoding(self, task: RoundTask) -> EncodingConfig:
        """The encoding whose noise is the whole noise of the released sum of a round without
        dropouts: what the coordinator adds alone to release an empty sample as ``M(∅)``.

        Raises:
            AlgorithmError: the algorithm never releases an empty sample.
        """
        del task
        raise AlgorithmError(f"{self.name} never releases an empty sample")

    @abc.abstractmethod
    def round_task(self, state: CoordinatorState, *, round_number: int) -> RoundTask:
        """What this round's invitees compute."""

    @abc.abstractmethod
    def encoding(self, task: RoundTask, *, participants: int, min_survivors: int) -> EncodingConfig:
        """The ring encoding, with each agent's share of the noise, for ``participants`` agents
        of which at least ``min_survivors`` will be summed.

        docs/algorithms.md#invariants-of-every-algorithm, 1.
        """

    @abc.abstractmethod
    def round_charge(self, *, round_number: int, population: Sequence[str]) -> RoundCharge:
        """What a committed round charges, ``population`` being all clients of the job still
        within budget (DP-FedAvg charges all of them: amplification by sampling is a
        population-level guarantee)."""

    def invitation_events(
        self, *, round_number: int, population: Sequence[str]
    ) -> tuple[DpEvent, ...]:
        """The events an invitation announces: what a participant pays if the round commits."""
        return self.round_charge(round_number=round_number, population=population).events

    @abc.abstractmethod
    def finish_round(
        self,
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


class AgentSide(abc.ABC, Generic[TaskT]):
    """An algorithm bound to one task an agent received (:meth:`Algorithm.agent`): its checks of
    the claim, what it records, and what it contributes."""

    def __init__(self, algorithm: Algorithm[JobSpec, PlanDetails, TaskT], task: TaskT) -> None:
        self.algorithm, self.name, self.task = algorithm, algorithm.name, task

    @abc.abstractmethod
    def check(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> float:
        """Refuse a task whose noise would not deliver the privacy ``events`` claim.

        The agent does not trust the coordinator's arithmetic: the per-agent noise of
        ``encoding``, summed over the ``honest_fraction`` of ``min_survivors`` agents, must carry
        at least the noise the events were computed with.

        Returns:
            The fraction of the noise variance of the events :meth:`charge` returns that this
            agent's own share carries (1 when it carries them alone): the agent's ledger scales
            its charge by it when it cannot verify the other shares
            (docs/accounting.md#what-the-agent-can-verify).

        Raises:
            AlgorithmError: naming the mismatch.
        """

    def charge(self, events: Sequence[DpEvent]) -> tuple[DpEvent, ...]:
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
        return tuple(events)

    def compute(
        self,
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> npt.NDArray[np.float64]:
        """The real vector this agent contributes, L2-clipped to the task's bound.

        Every algorithm overrides this or :meth:`contribution` (the default of which encodes
        what this returns); the base version refuses.

        Raises:
            AlgorithmError: malformed params, or a model/public blob that does not fit.
        """
        del data, model, public_x, device
        raise AlgorithmError(
            f"{self.name} computes its contribution in contribution (with the round's "
            "encoding), not as a real vector"
        )

    def contribution(
        self,
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
        encoding: EncodingConfig,
        stream: RandomStream,
    ) -> npt.NDArray[np.uint64]:
        """What this agent puts into the secure sum: its vector in Z_{2^r}, noise included.

        Called once the round's setup is known (after :meth:`check` accepted ``encoding``), on
        the agent's ``device``, with the downloaded ``model`` and ``public_x`` (or None). The
        default encodes :meth:`compute`'s real vector with ``encoding`` (clip, scale,
        conditional stochastic rounding, the agent's share of the integer noise, mod 2^r)
        drawing from the CSPRNG ``stream``. An algorithm that adds its noise inside the
        computation overrides this, and then owns the whole guarantee: the returned vector must
        carry at least the noise its events claim, and the sum of ``num_clients`` such vectors
        must not wrap the ring.

        Returns:
            A uint64 vector of the round's vector length, every value below 2^r.

        Raises:
            AlgorithmError: malformed params, data or blobs.
        """
        vector = self.compute(data, model=model, public_x=public_x, device=device)
        return encode(vector, config=encoding, stream=stream)


class Algorithm(abc.ABC, Generic[SpecT, PlanT, TaskT]):
    """One algorithm: its types, its plan, and its two sides; see the module docstring.

    ``spec_type``, ``plan_type`` and ``task_type`` are its job variant, plan details and task.
    :meth:`bind` narrows a job and its plan once and hands out the ``coordinator_type`` side;
    :meth:`agent` narrows a task once and hands out the ``agent_type`` side.
    :meth:`parse_task` and :meth:`parse_plan` validate JSON once, at the boundary.

    Args:
        random_source: the CSPRNG of the coordinator side's choices (client sampling; default:
            the system CSPRNG): a simulation passes a seeded source so that one seed replays
            the whole run.
    """

    #: The job's ``algorithm`` tag, e.g. "dp-fedavg".
    name: ClassVar[str]
    #: The sign with which the released model moves along each decoded sum (black-box audits
    #: score canaries by it); None when the model is not a running sum of the aggregates.
    model_direction: ClassVar[float | None] = None
    #: The recipes a search tries (docs/utility.md#recipes): name → the job fields each sets
    #: (``model``, ``rounds``, ``params``); a search keeps only the fields a job leaves unset.
    recipe_candidates: ClassVar[Mapping[str, Mapping[str, JsonValue]]] = MappingProxyType({})
    spec_type: type[SpecT]
    plan_type: type[PlanT]
    task_type: type[TaskT]
    coordinator_type: ClassVar[type[CoordinatorSide[Any, Any, Any]]]
    agent_type: ClassVar[type[AgentSide[Any]]]

    def __init__(self, *, random_source: RandomSource | None = None) -> None:
        self.random = random_source if random_source is not None else SystemRandomSource()

    def with_random_source(self, source: RandomSource) -> Self:
        """This algorithm drawing its coordinator-side randomness from ``source``."""
        return type(self)(random_source=source)

    def narrow(self, job: JobSpec) -> SpecT:
        """``job`` as this algorithm's variant.

        Raises:
            AlgorithmError: another algorithm's job.
        """
        if not isinstance(job, self.spec_type):
            raise AlgorithmError(f"{self.name} cannot run a {type(job).__name__}")
        return job

    def narrow_for_plan(self, job: JobSpec, population: int) -> SpecT:
        """``job`` as this algorithm's variant, to be planned for ``population`` clients.

        Raises:
            AlgorithmError: another algorithm's job, or a population not an integer >= 1.
        """
        spec = self.narrow(job)
        if isinstance(population, bool) or not isinstance(population, int) or population < 1:
            raise AlgorithmError(f"population must be an integer >= 1, got {population!r}")
        return spec

    def bind(self, job: JobSpec, plan: JobPlan) -> CoordinatorSide[SpecT, PlanT, TaskT]:
        """The coordinator side of ``job`` under ``plan``.

        Raises:
            AlgorithmError: another algorithm's job or plan.
        """
        spec, details = self.narrow(job), plan.details
        if not isinstance(details, self.plan_type):
            raise AlgorithmError(f"{self.name} cannot use a {type(details).__name__}")
        side: CoordinatorSide[SpecT, PlanT, TaskT] = self.coordinator_type(
            self, spec, plan, details
        )
        return side

    def agent(self, task: TaskParams) -> AgentSide[TaskT]:
        """The agent side of ``task`` (parsed by :meth:`parse_task`).

        Raises:
            AlgorithmError: another algorithm's task.
        """
        if not isinstance(task, self.task_type):
            raise AlgorithmError(f"{self.name} cannot compute a {type(task).__name__}")
        side: AgentSide[TaskT] = self.agent_type(self, task)
        return side

    def parse_task(self, data: object) -> TaskT:
        """The task of an invitation (``params_json``, text or parsed), validated once.

        Raises:
            AlgorithmError: naming ``params.<field>`` and the problem.
        """
        return parse_contract(self.task_type, data, where="params", unknown=_UNKNOWN_TASK_FIELD)

    def parse_plan(self, data: Mapping[str, Any]) -> JobPlan:
        """A plan stored in a round record (:meth:`JobPlan.to_json`), validated once.

        Raises:
            AlgorithmError: naming ``plan.details.<field>`` and the problem.
        """
        return JobPlan.from_json(data, self.plan_type)

    @abc.abstractmethod
    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        """Calibrate the noise for the whole job (all rounds) and this population size.

        ``data`` (optional): the coordinator's data, whose input shape and number of classes
        fix the vector length that the integer (Skellam) sensitivities depend on. When None, an
        algorithm that needs them loads the job's data set spec (``job.data.dataset``) to learn
        them, which works for the built-in sets and for simulations; a coordinator that does
        not hold the data passes them here.

        Raises:
            AlgorithmError: the target cannot be met (e.g. a population too small).
        """


#: What the shells hold: any algorithm, seen through the erased types.
AnyAlgorithm = Algorithm[JobSpec, PlanDetails, TaskParams]
#: Any algorithm's coordinator side, seen through the erased types.
AnyCoordinator = CoordinatorSide[JobSpec, PlanDetails, TaskParams]
#: Any algorithm's agent side, seen through the erased task type.
AnyAgent = AgentSide[TaskParams]
