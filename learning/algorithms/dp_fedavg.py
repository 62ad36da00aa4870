"""DP-FedAvg: client-level DP with Poisson client sampling, clipped model deltas and distributed
integer noise summed by secure aggregation.

Agents send ``clip_S(θ_i − θ)`` with their noise share; the coordinator divides the sum by the
EXPECTED participant count q·n (so one agent moves the update by at most S/m) and charges every
population member ``PoissonSampledEvent(q, SkellamEvent(μ, Δ₁, Δ₂, d))`` per round, since
sampling amplifies only at population level. Math, charge, the no-secure-aggregation case and the
task parameters: docs/algorithms.md#dp-fedavg.
The task is :class:`DpFedAvgTask`, the plan :class:`DpFedAvgPlan`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import Field, JsonValue, model_validator
from typing_extensions import TypeVar

from dpfl.accounting import (
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
)
from dpfl.learning.algorithms.base import (
    AgentData,
    AlgorithmError,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundOutcome,
    RoundTask,
)
from dpfl.learning.algorithms.model_update import (
    ModelUpdateAgent,
    ModelUpdateAlgorithm,
    ModelUpdateCoordinator,
    ModelUpdatePlan,
    ModelUpdateTask,
    initial_model_state,
    load_model,
    optimizer_round,
)
from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.parts.adaptation import DomainAdaptation
from dpfl.learning.algorithms.parts.adaptive_clip import (
    CLIP_KEY,
    AdaptiveClipping,
    AdaptiveClippingPlan,
    AdaptiveClippingTask,
    agent_vector,
    count_weight,
    encoding_clip,
    next_clip,
    read_sum,
)
from dpfl.learning.algorithms.parts.extractors import FeatureParams
from dpfl.learning.algorithms.parts.frozen_features import (
    FeaturePlanFields,
    FeatureTaskFields,
    agent_inputs,
    front_for,
    model_input_shape,
)
from dpfl.learning.algorithms.parts.server_optimizers import (
    AdaptiveServer,
    MomentumServer,
    ServerOptimizer,
    SgdServer,
)
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, ModelUpdateJob
from dpfl.mechanisms.encoding import EncodingConfig

__all__ = [
    "ALGORITHM",
    "DpFedAvg",
    "DpFedAvgJob",
    "DpFedAvgParams",
    "DpFedAvgPlan",
    "DpFedAvgTask",
    "FedAvgAgent",
    "FedAvgCoordinator",
    "FedAvgFamily",
    "mechanism_event",
    "noise_total",
]

_SOURCE = "the encoding's (clip and scale)"
DEFAULT_LOCAL_STEPS = 5
DEFAULT_SERVER_MOMENTUM = 0.8


class DpFedAvgParams(FeatureParams):
    """DP-FedAvg: plain local SGD, update clipped to ``clip`` per agent.

    ``features`` (default ``identity``) puts a frozen map φ in front of the model, which is then
    sized for φ's output: a learned map is fitted on the public pool and shipped with the model
    (:mod:`~dpfl.learning.algorithms.parts.frozen_features`).

    Local work is ``local_steps`` steps or ``local_epochs`` passes (give one); round r trains at
    ``learning_rate · learning_rate_decay^(r−1)``. The server step is ``server_optimizer``, or,
    when it is not given, FedAvgM from the older ``server_learning_rate`` and
    ``server_momentum`` (momentum 0: plain FedAvg). ``adaptive_clipping`` learns the clip as a
    quantile of the update norms, ``clip`` being the first round's
    (:mod:`~dpfl.learning.algorithms.parts.adaptive_clip`).
    """

    clip: float = Field(default=1.0, gt=0)
    sampling_rate: float = Field(default=1.0, gt=0, le=1)
    local_steps: int | None = Field(
        default=None, ge=1, description=f"null: {DEFAULT_LOCAL_STEPS}, unless local_epochs is given"
    )
    local_epochs: int | None = Field(
        default=None, ge=1, description="null: the round runs local_steps steps"
    )
    learning_rate: float = Field(default=0.1, gt=0)
    learning_rate_decay: float = Field(default=1.0, gt=0, le=1)
    batch_size: int = Field(default=32, ge=1)
    server_optimizer: ServerOptimizer | None = Field(
        default=None, description="null: FedAvgM from server_learning_rate and server_momentum"
    )
    server_learning_rate: float | None = Field(
        default=None, gt=0, description="null: 1.0 (read only without server_optimizer)"
    )
    server_momentum: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description=f"null: {DEFAULT_SERVER_MOMENTUM} (read only without server_optimizer)",
    )
    # DP-FedAvg+DA: local steps on the DANN loss against the public images the agents may read
    # (docs/algorithms.md#teachers-adapted-to-the-public-domain)
    local_domain_adaptation: DomainAdaptation = DomainAdaptation()
    adaptive_clipping: AdaptiveClipping | None = Field(
        default=None, description="null: off, every round clips at clip"
    )

    @model_validator(mode="after")
    def _one_way_each(self) -> Self:
        """Refuse two answers to one question (the older fields beside their replacement).

        Unset fields stay None, so ``job_to_dict`` round-trips."""
        if self.local_epochs is not None and self.local_steps is not None:
            raise ValueError("give local_steps or local_epochs, not both")
        legacy = [
            name
            for name in ("server_learning_rate", "server_momentum")
            if getattr(self, name) is not None
        ]
        if self.server_optimizer is not None and legacy:
            raise ValueError(
                f"give server_optimizer or {' and '.join(legacy)}, not both "
                "(server_optimizer: {kind: momentum, learning_rate, momentum} replaces them)"
            )
        return self

    def local_work(self) -> tuple[int | None, int | None]:
        """``(steps, epochs)``, one of them None; 5 steps when neither is given."""
        if self.local_epochs is not None:
            return None, self.local_epochs
        return (DEFAULT_LOCAL_STEPS if self.local_steps is None else self.local_steps), None

    def optimizer(self) -> SgdServer | MomentumServer | AdaptiveServer:
        """The server optimizer; without one, FedAvgM from the older fields (rate 1, and
        momentum 0.8: it averages the noise of successive rounds and lifted DP-FedAvg on digits,
        100 agents, q = 0.3, 10 rounds, ε = 4, from ~0.67 to ~0.70 mean accuracy)."""
        if self.server_optimizer is not None:
            return self.server_optimizer
        return MomentumServer(
            kind="momentum",
            learning_rate=1.0 if self.server_learning_rate is None else self.server_learning_rate,
            momentum=DEFAULT_SERVER_MOMENTUM
            if self.server_momentum is None
            else self.server_momentum,
        )

    def round_learning_rate(self, round_number: int) -> float:
        """The local learning rate of round ``round_number`` (1, 2, ...)."""
        return self.learning_rate * self.learning_rate_decay ** (round_number - 1)


class FedAvgJobBase(ModelUpdateJob):
    """The jobs of the DP-FedAvg family (DP-FedAvg, DP-Fed-LS)."""

    params: DpFedAvgParams = DpFedAvgParams()
    UNITS = ("agent",)
    # logistic regression on the Gabor map, learning rate 1, two local epochs: the best plain
    # recipe across MNIST, Fashion-MNIST and USPS on their validation splits
    # (docs/utility.md#defaults-that-work)
    IMAGE_RECIPE = MappingProxyType(
        {
            "model": "logreg",
            "params": {"features": "gabor", "learning_rate": 1.0, "local_epochs": 2},
        }
    )

    @model_validator(mode="after")
    def _adaptation_needs(self) -> Self:
        """DANN local steps need public images the agents read, hidden layers, and the raw
        records (not a feature map's output)."""
        if self.params.local_domain_adaptation.method == "none":
            return self
        where = "params.local_domain_adaptation"
        if not self.data.has_public_pool:
            raise ValueError(f"{where}: dann needs a public pool the agents read (data.public)")
        if self.model == "logreg":
            raise ValueError(f"{where}: dann needs hidden layers to align (mlp or cnn)")
        if self.params.features != "identity":
            raise ValueError(f"{where}: dann adapts the model itself; leave params.features out")
        return self


class DpFedAvgJob(FedAvgJobBase):
    algorithm: Literal["dp-fedavg"]


class FedAvgPlanBase(ModelUpdatePlan, FeaturePlanFields):
    """m = ``expected_participants`` divides the summed update; ``sampling_rate`` q. With
    ``adaptive_clipping`` the vector has one coordinate more than the model (the count)."""

    model: str
    sampling_rate: float = Field(gt=0, le=1)
    expected_participants: float = Field(gt=0)
    adaptive_clipping: AdaptiveClippingPlan | None = None

    @property
    def model_dimension(self) -> int:
        """The model's parameter count (the vector's length without the count)."""
        return self.dimension - (0 if self.adaptive_clipping is None else 1)

    def round_event(self, population: int) -> DpEvent:
        """One round's event: the release of the noisy sum, wrapped in Poisson client sampling
        under secure aggregation (add/remove one agent). ``population``: the size of the
        population the round's participants were drawn from (only fixed-size sampling, DP-Fed-LS,
        depends on it)."""
        del population
        inner = mechanism_event(
            noise=self.noise,
            total=self.noise_total,
            l1=self.l1_sensitivity,
            l2=self.l2_sensitivity,
            dimension=self.dimension,
        )
        if self.secure_aggregation and self.sampling_rate < 1.0:
            return PoissonSampledEvent(self.sampling_rate, inner)
        return inner


class DpFedAvgPlan(FedAvgPlanBase):
    """DP-FedAvg's plan."""


class FedAvgTaskBase(ModelUpdateTask, FeatureTaskFields):
    """What an agent of the DP-FedAvg family trains and how its claim is checked;
    ``learning_rate`` is the round's (decay applied), the local work ``local_steps`` steps or
    ``local_epochs`` passes (exactly one)."""

    model: str = Field(min_length=1)
    clip: float = Field(gt=0)
    local_steps: int | None = Field(default=None, ge=1)
    local_epochs: int | None = Field(default=None, ge=1)
    learning_rate: float = Field(gt=0)
    batch_size: int = Field(ge=1)
    train_seed: int = Field(ge=0)
    sampling_rate: float = Field(gt=0, le=1)
    population: int = Field(ge=1)
    expected_participants: float = Field(gt=0)
    domain_adaptation: DomainAdaptation = DomainAdaptation()
    adaptive_clipping: AdaptiveClippingTask | None = None

    @model_validator(mode="after")
    def _one_kind_of_local_work(self) -> Self:
        """Exactly one of ``local_steps`` and ``local_epochs``: the agent must know what to run."""
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError("the task must give exactly one of local_steps and local_epochs")
        return self

    @model_validator(mode="after")
    def _count_fits(self) -> Self:
        """With adaptive clipping, the agent's vector must fit the encoding's clip."""
        adaptive = self.adaptive_clipping
        if adaptive is not None and not adaptive.fits(self.clip):
            raise ValueError(
                f"adaptive_clipping: a vector of update scale {adaptive.update_clip:g} and count "
                f"weight {adaptive.count_weight:g} has norm "
                f"{encoding_clip(adaptive.update_clip, adaptive.count_weight):g}, above the "
                f"clip {self.clip:g}"
            )
        return self

    @property
    def model_dimension(self) -> int:
        """The model's parameter count (the vector's length without the count)."""
        return self.dimension - (0 if self.adaptive_clipping is None else 1)

    def claimed_release(self, event: DpEvent) -> tuple[DpEvent, float]:
        """The claimed release inside its client-sampling wrapper, checked against this task,
        and the factor its sensitivities carry over the encoding's rounded bounds (1:
        add/remove).

        Raises:
            AlgorithmError: a wrapper the task does not sample with.
        """
        sampled = self.secure_aggregation and self.sampling_rate < 1.0
        if isinstance(event, PoissonSampledEvent):
            if not sampled or event.sampling_rate != self.sampling_rate:
                raise AlgorithmError(
                    f"the event claims client sampling at rate {event.sampling_rate:g}; "
                    f"the task samples at {self.sampling_rate:g} "
                    f"{'with' if self.secure_aggregation else 'without'} secure aggregation"
                )
            return event.event, 1.0
        if sampled:
            raise AlgorithmError("the task samples clients but the event does not say so")
        return event, 1.0


class DpFedAvgTask(FedAvgTaskBase):
    """DP-FedAvg's task."""

    algorithm: Literal["dp-fedavg"]


def mechanism_event(
    *, noise: str, total: float, l1: float, l2: float, dimension: int
) -> SkellamEvent | GaussianEvent:
    """One release of the noisy sum, in scaled integer units (no sampling)."""
    if noise == "skellam":
        return SkellamEvent(mu=total, l1_sensitivity=l1, l2_sensitivity=l2, dimension=dimension)
    return GaussianEvent(sigma=total, sensitivity=l2)


def noise_total(noise: str, z: float, l2: float) -> float:
    """μ with √(2μ) = z·Δ₂ (Skellam), or σ = z·Δ₂ (discrete Gaussian)."""
    return (z * l2) ** 2 / 2.0 if noise == "skellam" else z * l2


def _sensitivities(clip: float, scale_bits: int, dimension: int) -> tuple[float, float]:
    config = EncodingConfig(clip=clip, scale_bits=scale_bits, ring_bits=64)
    return config.rounded_l1_bound(dimension), config.rounded_l2_bound(dimension)


FS = TypeVar("FS", bound=FedAvgJobBase, default=FedAvgJobBase)
FP = TypeVar("FP", bound=FedAvgPlanBase, default=FedAvgPlanBase)
FT = TypeVar("FT", bound=FedAvgTaskBase, default=FedAvgTaskBase)


class FedAvgCoordinator(ModelUpdateCoordinator[FS, FP, FT]):
    """The coordinator side of the DP-FedAvg family."""

    unit = "agent"

    def initial_state(self, data: CoordinatorData) -> CoordinatorState:
        front = front_for(self.details.features, data)
        return initial_model_state(
            self.spec,
            data,
            algorithm=self.name,
            dimension=self.details.model_dimension,
            front=front,
        )

    def round_task(self, state: CoordinatorState, *, round_number: int) -> RoundTask:
        """The base task, with the round's clip under adaptive clipping; with DANN local steps,
        agents download the public images first."""
        task = super().round_task(state, round_number=round_number)
        adaptive = self.details.adaptive_clipping
        if adaptive is not None:
            round_clip = _round_clip(adaptive, state)
            params = self.algorithm.task_type.model_validate(
                {
                    **task.params.model_dump(),
                    "adaptive_clipping": {
                        "round_clip": round_clip,
                        "update_clip": adaptive.update_clip,
                        "count_weight": adaptive.count_weight,
                    },
                }
            )
            task = replace(task, params=params)
        if self.spec.params.local_domain_adaptation.method == "none":
            return task
        return replace(task, needs_public_data=True)

    def _sampling_rate(self) -> float:
        return self.spec.params.sampling_rate

    def _clip(self) -> float:
        """The encoding's clip: the job's, or the norm bound of the vector with its count."""
        adaptive = self.details.adaptive_clipping
        return self.spec.params.clip if adaptive is None else adaptive.clip

    def _task(self, common: ModelUpdateTask) -> FT:
        spec, p, d = self.spec, self.spec.params, self.details
        family = FedAvgTaskBase(
            **common.model_dump(),
            model=spec.model,
            features=d.features,
            domain_adaptation=p.local_domain_adaptation,
            clip=self._clip(),
            local_steps=p.local_work()[0],
            local_epochs=p.local_work()[1],
            learning_rate=p.round_learning_rate(common.round),
            batch_size=p.batch_size,
            train_seed=(spec.seed * 1_000_003 + common.round) % 2**31,
            sampling_rate=p.sampling_rate,
            population=self.plan.population,
            expected_participants=d.expected_participants,
        )
        return self._variant_task(family)

    def round_event(self, *, population: int | None = None) -> DpEvent:
        """The event one committed round charges (see the module docstring).

        ``population``: the size of the population the round's participants were drawn from
        (default: the plan's); only fixed-size sampling (DP-Fed-LS) depends on it.
        """
        return self.details.round_event(self.plan.population if population is None else population)

    @property
    def releases_every_sample(self) -> bool:
        """Under secure aggregation the whole population is charged the client-sampled event,
        which bounds the release of ``M(S)`` for every sample S, so every sample is released
        (docs/accounting.md, "Client sampling: every sample is released")."""
        return self.details.secure_aggregation

    def noise_alone_encoding(self, task: RoundTask) -> EncodingConfig:
        """One agent's encoding of a one-agent round: its noise, ``total/(t·(1−δ))``
        (:func:`~dpfl.learning.algorithms.parts.common.per_agent_noise` with N = m_s = 1), is the
        law of the N shares' sum in every round without dropouts, whatever N is."""
        if not self.releases_every_sample:
            raise AlgorithmError(
                f"{self.name} without secure aggregation never releases noise alone"
            )
        return self.encoding(task, participants=1, min_survivors=1)

    def _population_wide(self) -> bool:
        """Under secure aggregation every client of the population (and any participant outside
        it: never under-count); without it the participants only."""
        return self.details.secure_aggregation

    # -- hooks of variants (DP-Fed-LS: smoothing) ----------------------------------------------

    def _variant_task(self, family: FedAvgTaskBase) -> FT:
        """The variant's task: the family's fields plus its own (DP-FedAvg: none)."""
        return self.algorithm.task_type(**family.model_dump())

    def _post_process(self, net: Any, update: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Post-processing of the averaged noisy update before the model step (identity)."""
        del net
        return update

    def finish_round(
        self,
        state: CoordinatorState,
        data: CoordinatorData,
        *,
        round_number: int,
        aggregate: npt.NDArray[np.float64],
        survivors: int,
    ) -> RoundOutcome:
        spec, d = self.spec, self.details
        total = common.checked_aggregate(aggregate, length=d.dimension, survivors=max(survivors, 1))
        adaptive = d.adaptive_clipping
        if adaptive is not None:
            round_clip = _round_clip(adaptive, state)
            total, count = read_sum(
                total,
                adaptive,
                round_clip=round_clip,
                expected_participants=d.expected_participants,
            )
        net = load_model(spec, state, data)
        update = self._post_process(net, total / d.expected_participants)
        outcome = optimizer_round(
            spec,
            state,
            data,
            update=update,
            optimizer=spec.params.optimizer(),
            algorithm=self.name,
            round_number=round_number,
            survivors=survivors,
        )
        if adaptive is None:
            return outcome
        following = next_clip(
            round_clip, count, expected_participants=d.expected_participants, plan=adaptive
        )
        return replace(
            outcome,
            state=replace(outcome.state, details={**outcome.state.details, CLIP_KEY: following}),
            metrics={
                **outcome.metrics,
                "clip": round_clip,
                "clipped_fraction": 1.0 - count / d.expected_participants,
            },
        )


class FedAvgAgent(ModelUpdateAgent[FT]):
    """The agent side of the DP-FedAvg family."""

    def check(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> float:
        """Refuse unless the events describe exactly this encoding and its noise suffices.

        Checks: the encoding's clip and scale are the task's; one event of the shape this
        configuration charges (client sampling only under secure aggregation, at the task's
        rate); its sensitivities are the encoding's rounded bounds for d coordinates; the
        per-agent noise of the encoding, summed over ``t·min_survivors`` honest agents (alone
        without secure aggregation), reaches the event's noise; the ring holds the sum of
        ``num_clients`` vectors.
        """
        t = self.task
        counts = common.Counts(
            num_clients=num_clients, min_survivors=min_survivors, honest_fraction=honest_fraction
        )
        event = self._claimed(events, encoding, counts, clip=t.clip)
        inner, factor = t.claimed_release(event)
        total = common.claimed_total(
            inner,
            noise=t.noise,
            l1=factor * encoding.rounded_l1_bound(t.dimension),
            l2=factor * encoding.rounded_l2_bound(t.dimension),
            dimension=t.dimension,
            source=_SOURCE,
        )
        return common.check_encoding(encoding, t, total=total, **counts)

    def compute(
        self,
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> npt.NDArray[np.float64]:
        t = self.task
        if model is None:
            raise AlgorithmError(f"{self.name} needs the global model")
        from dpfl.learning.params import model_from_bytes
        from dpfl.learning.training import local_update

        x, shape, model = agent_inputs(t, data, model)
        net = common.build_model(t.model, shape, data.num_classes, seed=0)
        adaptation, train = t.domain_adaptation, partial(local_update)
        if adaptation.method != "none":
            if public_x is None:
                raise AlgorithmError(
                    "the task adapts to the public domain (dann) but no public images came"
                )
            from dpfl.learning.domain_adaptation import dann_local_update

            train = partial(
                dann_local_update,
                target_x=np.asarray(public_x),
                weight=adaptation.weight,
                hidden=adaptation.hidden,
            )
        try:
            model_from_bytes(model, model=net)
            update = train(
                net,
                x,
                data.y,
                steps=t.local_steps,
                epochs=t.local_epochs,
                batch_size=t.batch_size,
                learning_rate=t.learning_rate,
                seed=t.train_seed,
                device=device,
            )
        except LearningError as exc:
            raise AlgorithmError(f"local training failed: {exc}") from exc
        delta = update.delta.astype(np.float64)
        if delta.shape != (t.model_dimension,):
            raise AlgorithmError(
                f"the model has {delta.size} parameters, the task {t.model_dimension}"
            )
        if t.adaptive_clipping is not None:
            return agent_vector(delta, t.adaptive_clipping)
        norm = float(np.linalg.norm(delta))
        return delta * (t.clip / norm) if norm > t.clip else delta

    def charge(self, events: Sequence[DpEvent]) -> tuple[DpEvent, ...]:
        """The claimed events without client-sampling amplification.

        Amplification by sampling (``PoissonSampledEvent(q, M)``) is a guarantee over the
        coordinator's random choice of participants, and it only holds against observers who do
        not know that choice. The agent cannot verify that the coordinator sampled at rate q (or
        at all), and the coordinator itself knows the sample. So the agent records ``M``, the
        mechanism's cost GIVEN that it took part: for every fixed sequence of samples (drawn
        independently of the data) the rounds it sat out do not depend on its data (cost 0, and
        it records nothing as it is not invited) and each round it joined is exactly ``M`` on
        its data — a valid bound whatever the coordinator did. It is conservative: the
        subsampled bound never exceeds the inner one (Zhu & Wang 2019, Thm. 6, min with ε(α)),
        so each recorded round costs at least its amplified share. Sampling the agent performs
        itself on its own records (DP-FedSGD) is verifiable and stays amplified there.
        """
        return tuple(common.strip_client_sampling(e) for e in events)


def _round_clip(adaptive: AdaptiveClippingPlan, state: CoordinatorState) -> float:
    """C_t: the clip the last round's count chose (C₀ before the first round).

    Raises:
        AlgorithmError: a stored clip that is not a positive finite number.
    """
    stored = state.details.get(CLIP_KEY, adaptive.update_clip)
    if isinstance(stored, bool) or not isinstance(stored, int | float):
        raise AlgorithmError(f"the coordinator state's {CLIP_KEY} is not a number: {stored!r}")
    if not (math.isfinite(stored) and stored > 0):
        raise AlgorithmError(f"the coordinator state's {CLIP_KEY} must be > 0, got {stored!r}")
    return float(stored)


#: The public-kmeans map of the MNIST non-IID recipe (docs/features.md#measurements).
_KMEANS: dict[str, JsonValue] = {
    "features": "public-kmeans",
    "public_kmeans": {"centroids": 128, "dim": 64, "norm": 3.0},
}


class FedAvgFamily(ModelUpdateAlgorithm[FS, FP, FT]):
    """DP-FedAvg and its variants; see the module docstring."""

    model_direction = 1.0  # the mean update is added
    # a linear model on a map fitted on the public pool where there is one (the measured
    # non-IID recipe and its neighbours), on pixels, on the fixed Gabor map (the image
    # default, and gentler local steps for splits of few classes), and on the Gabor map
    # whitened on the pool at the default's scale (docs/features.md#public-gabor)
    recipe_candidates = MappingProxyType(
        {
            "kmeans-logreg": {
                "model": "logreg",
                "params": {**_KMEANS, "local_epochs": 1, "batch_size": 32, "learning_rate": 1.0},
            },
            "kmeans-logreg-rate-0.3": {
                "model": "logreg",
                "params": {**_KMEANS, "local_epochs": 1, "batch_size": 32, "learning_rate": 0.3},
            },
            "kmeans-logreg-clip-0.5": {
                "model": "logreg",
                "params": {
                    **_KMEANS,
                    "local_epochs": 1,
                    "batch_size": 32,
                    "learning_rate": 1.0,
                    "clip": 0.5,
                },
            },
            "pixels-logreg": {
                "model": "logreg",
                "params": {"features": "identity", "local_epochs": 1, "learning_rate": 1.0},
            },
            "gabor-logreg": {
                "model": "logreg",
                "params": {"features": "gabor", "local_epochs": 2, "learning_rate": 1.0},
            },
            "gabor-logreg-gentle": {
                "model": "logreg",
                "params": {"features": "gabor", "local_epochs": 1, "learning_rate": 0.3},
            },
            "whitened-gabor-logreg": {
                "model": "logreg",
                "params": {
                    "features": "public-gabor",
                    "public_gabor": {"norm": 8.0},
                    "local_epochs": 2,
                    "learning_rate": 1.0,
                },
            },
            "whitened-gabor-logreg-32": {
                "model": "logreg",
                "params": {
                    "features": "public-gabor",
                    "public_gabor": {"dim": 32, "norm": 8.0},
                    "local_epochs": 2,
                    "learning_rate": 1.0,
                },
            },
        }
    )
    coordinator_type = FedAvgCoordinator
    agent_type = FedAvgAgent

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self.narrow_for_plan(job, population)
        p, privacy = spec.params, spec.privacy
        expected = self._expected_participants(spec, population)
        if expected < 1.0:
            raise AlgorithmError(
                f"sampling_rate {p.sampling_rate:g} x population {population} expects "
                f"{expected:.3g} participants per round; at least 1 is needed"
            )
        shape, classes = common.data_shape(spec, data)
        features = p.feature_spec()
        shape, width = model_input_shape(features, shape, spec.model)
        dimension = common.model_dimension(spec.model, shape, classes)
        adaptive = p.adaptive_clipping
        vector = dimension + (0 if adaptive is None else 1)

        def make(clip: float, weight: float | None, bits: int) -> JobPlan:
            l1, l2 = _sensitivities(clip, bits, vector)

            def details(z: float, adaptive_plan: AdaptiveClippingPlan | None = None) -> FP:
                family = FedAvgPlanBase(
                    model=spec.model,
                    features=features,
                    feature_dim=width,
                    dimension=vector,
                    scale_bits=bits,
                    l1_sensitivity=l1,
                    l2_sensitivity=l2,
                    noise=privacy.noise,
                    noise_total=noise_total(privacy.noise, z, l2),
                    sampling_rate=p.sampling_rate,
                    expected_participants=expected,
                    secure_aggregation=spec.secagg.enabled,
                    honest_fraction=privacy.honest_fraction,
                    corrupt_fraction=spec.secagg.corrupt_fraction,
                    adaptive_clipping=adaptive_plan,
                )
                return self._variant_plan(spec, population, family)

            def job_event(z: float) -> DpEvent:
                event = details(z).round_event(population)
                return event if spec.rounds == 1 else SelfComposedEvent(event, spec.rounds)

            z, record = common.calibrate(job_event, privacy)
            if adaptive is None or weight is None:
                return JobPlan(z, record, population, details(z))
            adaptive_plan = AdaptiveClippingPlan(
                update_clip=p.clip,
                count_weight=weight,
                count_noise=z * l2 / math.ldexp(weight, bits),
                target_quantile=adaptive.target_quantile,
                clip_learning_rate=adaptive.clip_learning_rate,
            )
            return JobPlan(z, record, population, details(z, adaptive_plan))

        def fitted(clip: float, weight: float | None) -> JobPlan:
            bits = spec.secagg.scale_bits
            if bits is None:
                bits = common.choose_scale_bits(
                    clip=clip, dimension=vector, inflation=self.scale_inflation
                )
            return self._fit_scale(spec, population, bits, lambda b: make(clip, weight, b))

        plan = fitted(p.clip, None)
        if adaptive is None:
            return plan
        # w comes from z, and z (calibrated on the vector's sensitivity) hardly depends on w: the
        # scale search keeps the rounding within 0.1 %, so the count's std lands within that of
        # what the job asked (docs/algorithms.md#adaptive-clipping)
        weight = count_weight(
            p.clip, noise_multiplier=plan.noise_multiplier, count_noise=adaptive.count_std(expected)
        )
        return fitted(encoding_clip(p.clip, weight), weight)

    def _expected_participants(self, job: FS, population: int) -> float:
        """m, the divisor of the summed update: q·n under Poisson sampling."""
        return job.params.sampling_rate * population

    def _variant_plan(self, job: FS, population: int, family: FedAvgPlanBase) -> FP:
        """The variant's plan: the family's fields plus its own (DP-FedAvg: none)."""
        del job, population
        return self.plan_type(**family.model_dump())


class DpFedAvg(FedAvgFamily[DpFedAvgJob, DpFedAvgPlan, DpFedAvgTask]):
    """DP-FedAvg; see the module docstring."""

    name: ClassVar[str] = "dp-fedavg"
    spec_type = DpFedAvgJob
    plan_type = DpFedAvgPlan
    task_type = DpFedAvgTask


ALGORITHM = DpFedAvg()
