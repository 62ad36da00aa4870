"""What DP-FedAvg, DP-Fed-LS, DP-FedSGD and DP-Helmet share: one vector of ``dimension`` real
coordinates per agent, clipped, scaled by 2^b, summed with distributed integer noise.

:class:`ModelUpdateAlgorithm` is their skeleton: the scale search at plan time (the smallest
scale whose rounding inflates the sensitivity by ≤ 0.1 %, lowered while the whole population's
sum would not fit the ring), client sampling, the task's common fields, the encoding (the
agent's share of the noise: ``common.per_agent_noise``), the charges and the agent's first
checks. A subclass supplies its calibration, its task fields, its round event, its clip and
its model step. The global model lives in :class:`CoordinatorState` as bytes
(``learning.params`` format); every round rebuilds the architecture from the job's seed.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field
from typing_extensions import TypeVar

from dpfl.accounting import DpEvent
from dpfl.learning.algorithms.base import (
    AgentSide,
    Algorithm,
    AlgorithmError,
    ClientCharge,
    CoordinatorData,
    CoordinatorSide,
    CoordinatorState,
    JobPlan,
    PlanDetails,
    RoundCharge,
    RoundOutcome,
    RoundTask,
    TaskParams,
)
from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.parts.frozen_features import FeatureFront, unpack
from dpfl.learning.algorithms.parts.server_optimizers import (
    AdaptiveServer,
    MomentumServer,
    SgdServer,
    server_step,
)
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, ModelUpdateJob
from dpfl.mechanisms.encoding import EncodingConfig

__all__ = [
    "ModelUpdateAgent",
    "ModelUpdateAlgorithm",
    "ModelUpdateCoordinator",
    "ModelUpdatePlan",
    "ModelUpdateTask",
    "initial_model_state",
    "load_front",
    "load_model",
    "optimizer_round",
    "stepped_model",
]


class ModelUpdatePlan(PlanDetails):
    """The plan of a model-update job: the vector's length d and its rounded sensitivities
    (ring units)."""

    dimension: int = Field(ge=1)
    l1_sensitivity: float = Field(gt=0)
    l2_sensitivity: float = Field(gt=0)


class ModelUpdateTask(TaskParams):
    """The task of a model-update round: what every such agent is told."""

    dimension: int = Field(ge=1)


SpecT = TypeVar("SpecT", bound=ModelUpdateJob, default=ModelUpdateJob)
PlanT = TypeVar("PlanT", bound=ModelUpdatePlan, default=ModelUpdatePlan)
TaskT = TypeVar("TaskT", bound=ModelUpdateTask, default=ModelUpdateTask)


class ModelUpdateAlgorithm(Algorithm[SpecT, PlanT, TaskT]):
    """The plan-time skeleton of the model-update algorithms: the scale search."""

    coordinator_type: ClassVar[type[ModelUpdateCoordinator[Any, Any, Any]]]
    #: How far rounding may inflate the L2 sensitivity when b is chosen automatically.
    scale_inflation: ClassVar[float] = common.SCALE_INFLATION

    def _fit_scale(
        self, spec: SpecT, population: int, bits: int, make: Callable[[int], JobPlan]
    ) -> JobPlan:
        """``make(b)`` for the largest ``b ≤ bits`` whose sum of the whole population (each
        agent with its noise share) fits the ring; ``bits`` itself when the job gives it. The
        calibration record says which rule chose b."""
        given = spec.secagg.scale_bits is not None
        while True:
            plan = make(bits)
            survivors = max(1, math.ceil(population * (1.0 - spec.secagg.dropout_fraction)))
            try:
                side = self.coordinator_type(self, spec, plan, plan.details)
                side.ring(participants=population, min_survivors=survivors)
                auto = f"inflation<={self.scale_inflation:.1%}"
                rule = {"scale_bits_rule": "given" if given else auto}
                return replace(plan, calibration={**plan.calibration, **rule})
            except AlgorithmError:
                if given or bits == 0:
                    raise
                bits -= 1


class ModelUpdateCoordinator(CoordinatorSide[SpecT, PlanT, TaskT]):
    """The shared coordinator side of the model-update algorithms: client sampling, the task's
    common fields, the encoding and the charge."""

    #: The protected unit every charge names ("agent" or "record"; None: the job's).
    unit: ClassVar[Literal["agent", "record"] | None] = None

    # -- what a subclass defines -------------------------------------------------------------

    @abc.abstractmethod
    def round_event(self, *, population: int) -> DpEvent:
        """The event one committed round charges each charged client."""

    @abc.abstractmethod
    def _clip(self) -> float:
        """The encoding's clip (real units)."""

    @abc.abstractmethod
    def _task(self, common: ModelUpdateTask) -> TaskT:
        """The round's task: ``common`` (the fields every model-update task carries) plus the
        algorithm's own."""

    def _sampling_rate(self) -> float:
        """The Poisson rate of :meth:`select` (1: every client of the population)."""
        return 1.0

    def _credits_others(self) -> bool:
        """Whether the charged event rests on the other agents' noise (then ``t`` is recorded)."""
        return self.details.secure_aggregation

    def _population_wide(self) -> bool:
        """Whether the whole population pays a committed round (default: its participants)."""
        return False

    # -- the contract ------------------------------------------------------------------------

    def select(self, *, round_number: int, population: Sequence[str]) -> list[str]:
        stream = self.algorithm.random.stream(f"{self.name}/select/{self.spec.name}/{round_number}")
        return common.poisson_sample(population, self._sampling_rate(), stream)

    def round_task(self, state: CoordinatorState, *, round_number: int) -> RoundTask:
        d = self.details
        common = self.task_params(round_number).model_dump(exclude_none=True)
        params = self._task(ModelUpdateTask(**common, dimension=d.dimension))
        front = None if state.model is None else unpack(state.model)[0]
        if front is not None and front.sha256 is not None:
            # the learned map the model bundle carries (docs/features.md#behind-a-trained-model)
            params = self.algorithm.task_type.model_validate(
                {**params.model_dump(), "features_sha256": front.sha256}
            )
        return RoundTask(
            params=params,
            vector_length=d.dimension,
            model_version=state.model_version if state.model is not None else None,
        )

    def ring(self, *, participants: int, min_survivors: int) -> EncodingConfig:
        """The encoding of ``participants`` agents, ``min_survivors`` of them summed."""
        noise = common.split_noise(
            self.details,
            dropout_fraction=self.spec.secagg.dropout_fraction,
            participants=participants,
            min_survivors=min_survivors,
        )
        return common.ring_encoding(
            clip=self._clip(),
            scale_bits=self.details.scale_bits,
            participants=participants,
            noise=noise,
        )

    def encoding(self, task: RoundTask, *, participants: int, min_survivors: int) -> EncodingConfig:
        if task.vector_length != self.details.dimension:
            raise AlgorithmError("the task's vector length differs from the plan's dimension")
        if not 1 <= min_survivors <= participants:
            raise AlgorithmError(
                f"min_survivors {min_survivors} must lie in [1, participants={participants}]"
            )
        return self.ring(participants=participants, min_survivors=min_survivors)

    def round_charge(self, *, round_number: int, population: Sequence[str]) -> RoundCharge:
        spec, d = self.spec, self.details
        charge = ClientCharge(
            event=self.round_event(population=len(population)),
            unit=self.unit or spec.privacy.unit,
            approximate=d.noise == "gaussian",
            secure_aggregation=d.secure_aggregation,
            honest_fraction=spec.privacy.honest_fraction if self._credits_others() else 1.0,
        )
        return RoundCharge(charge, tuple(population), self._population_wide())


class ModelUpdateAgent(AgentSide[TaskT]):
    """The first checks every model-update agent makes."""

    def _claimed(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        counts: common.Counts,
        *,
        clip: float,
        clip_from: str = "",
    ) -> DpEvent:
        """The checks every model-update agent makes first (honest fraction, survivors, one
        event, the encoding's clip and scale are the task's: ``clip``, derived as
        ``clip_from`` says); returns the claimed event."""
        task = self.task
        event = common.one_claimed_event(
            events, algorithm=self.name, task_honest_fraction=task.honest_fraction, **counts
        )
        if encoding.clip != clip or encoding.scale_bits != task.scale_bits:
            raise AlgorithmError(
                f"the encoding (clip {encoding.clip:g}, scale 2^{encoding.scale_bits}) differs "
                f"from the task (clip {clip:g}{clip_from}, scale 2^{task.scale_bits})"
            )
        return event


# -- the global model ---------------------------------------------------------------------------


def initial_model_state(
    spec: JobSpec,
    data: CoordinatorData,
    *,
    algorithm: str,
    dimension: int,
    front: FeatureFront | None = None,
) -> CoordinatorState:
    """Version 0: the job's model initialised from its seed (behind ``front``, φ, when the job
    has features: the model is sized for φ's output and the version holds the bundle).

    Raises:
        AlgorithmError: the data gives a model of another size than the plan's.
    """
    from dpfl.learning.params import model_signature, model_to_bytes

    view = data if front is None else front.coordinator_view(data)
    net = common.build_model(spec.model, view.input_shape, view.num_classes, seed=spec.seed)
    size = model_signature(net).num_parameters
    if size != dimension:
        raise AlgorithmError(
            f"the data gives a model of {size} parameters, the plan was calibrated for {dimension}"
        )
    model = model_to_bytes(net, metadata={"model": spec.model, "algorithm": algorithm})
    return CoordinatorState(
        model=model if front is None else front.pack(model),
        model_version=0,
        details={"round": 0},
    )


def load_front(state: CoordinatorState) -> FeatureFront | None:
    """The feature map the state's model bundle carries, or None (plain model bytes).

    Raises:
        AlgorithmError: no model in the state, or a malformed bundle.
    """
    if state.model is None:
        raise AlgorithmError("the coordinator state holds no model")
    return unpack(state.model)[0]


def load_model(spec: JobSpec, state: CoordinatorState, data: CoordinatorData) -> Any:
    """The state's model as a module of the job's architecture (on φ's output when the state
    holds a bundle).

    Raises:
        AlgorithmError: no model in the state, or bytes that do not load into it.
    """
    from dpfl.learning.params import model_from_bytes

    if state.model is None:
        raise AlgorithmError("the coordinator state holds no model")
    front, model = unpack(state.model)
    view = data if front is None else front.coordinator_view(data)
    net = common.build_model(spec.model, view.input_shape, view.num_classes, seed=spec.seed)
    try:
        model_from_bytes(model, model=net)
    except LearningError as exc:
        raise AlgorithmError(f"the stored model does not load: {exc}") from exc
    return net


def stepped_model(
    spec: JobSpec,
    net: Any,
    step: npt.NDArray[np.float64],
    data: CoordinatorData,
    *,
    algorithm: str,
    front: FeatureFront | None = None,
) -> tuple[bytes, dict[str, float]]:
    """``θ + step`` as bytes (bundled behind ``front`` when given), and its test metrics (``{}``
    without a test split)."""
    from dpfl.learning.params import assign_parameters, flatten_parameters, model_to_bytes

    assign_parameters(net, flatten_parameters(net, dtype=np.float64) + step)
    view = data if front is None else front.coordinator_view(data)
    metrics = common.evaluate_on_test(net, view)
    model = model_to_bytes(net, metadata={"model": spec.model, "algorithm": algorithm})
    return (model if front is None else front.pack(model)), metrics


def optimizer_round(
    spec: JobSpec,
    state: CoordinatorState,
    data: CoordinatorData,
    *,
    update: npt.NDArray[np.float64],
    optimizer: SgdServer | MomentumServer | AdaptiveServer,
    algorithm: str,
    round_number: int,
    survivors: int,
) -> RoundOutcome:
    """A round's end for the algorithms whose coordinator steps the global model by a server
    optimizer (docs/algorithms.md#server-optimizers): ``θ ← θ + step(update)``, the optimizer's
    state kept in the blobs, the model stepped behind the same feature map, and the metrics
    (survivors, the update's norm, test accuracy and loss)."""
    net, front = load_model(spec, state, data), load_front(state)
    blobs = dict(state.blobs)
    step = server_step(optimizer, update, blobs, step_number=state.model_version + 1)
    model, evaluation = stepped_model(spec, net, step, data, algorithm=algorithm, front=front)
    return RoundOutcome(
        state=CoordinatorState(
            model=model,
            model_version=state.model_version + 1,
            details={"round": round_number},
            blobs=blobs,
        ),
        metrics={
            "survivors": float(survivors),
            "update_norm": float(np.linalg.norm(update)),
            **evaluation,
        },
        done=round_number >= spec.rounds,
    )
