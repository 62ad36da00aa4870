"""DP-Helmet: one-shot secure averaging of locally trained private linear models.

One round: each agent trains K linear models on fixed public features, one-vs-rest or one
softmax block (:mod:`~dpfl.learning.algorithms.parts.helmet_training`), and sends the K×(p+1) block
with its noise share; the coordinator's average of the sum is the model. One-vs-rest, every
participant is charged K class releases of sensitivity ``2c/(MΛ)`` (one record;
docs/accounting.md#dp-helmet-record-level-sensitivity) or ``2R`` (an agent's data set); softmax,
one release of the block, ``2√2·c/(MΛ)`` or ``2R√K``. An agent with
fewer than ``min_local_size`` records refuses, a function of its size alone. Math, encoding and
charge: docs/algorithms.md#dp-helmet.
The task is :class:`DpHelmetTask`, the plan :class:`DpHelmetPlan`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, JsonValue, field_validator, model_validator

from dpfl.accounting import (
    DpEvent,
    GaussianEvent,
    SelfComposedEvent,
    SkellamEvent,
    simple_gaussian_epsilon,
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
)
from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.parts.data_sizes import smallest_local_size
from dpfl.learning.algorithms.parts.extractors import (
    SHA256_PATTERN,
    FeatureParams,
    LearnedFeature,
    build_extractor,
    feature_dim,
    fit_artifact,
    is_learned,
)
from dpfl.learning.algorithms.parts.helmet_training import (
    Loss,
    augment_and_clip,
    model_bytes,
    predict,
    release_sensitivities,
    releases,
    ring_scale_bits,
    sensitivity,
    train,
)
from dpfl.learning.jobs import JobSpec, ModelUpdateJob
from dpfl.mechanisms.encoding import EncodingConfig

__all__ = ["ALGORITHM", "DpHelmet", "DpHelmetJob", "DpHelmetParams", "DpHelmetPlan", "DpHelmetTask"]


class DpHelmetParams(FeatureParams):
    """DP-Helmet: projected SGD on one-vs-rest linear models or one softmax model."""

    # chosen on a validation split of digits (50 agents, record level, ε = 4;
    # benchmarks/helmet_defaults.py): 0.76 there, against 0.19 for the former (0.01, 5)
    regularization: float = Field(default=0.7, gt=0)
    radius: float = Field(default=1.0, gt=0)
    huber_h: float = Field(default=0.1, gt=0)
    input_clip: float = Field(default=1.0, gt=0)
    epochs: int = Field(default=10, ge=1)
    loss: Loss = "huber"
    # record level: the sensitivity 2c/(MΛ) is computed for this M; agents with fewer
    # records refuse
    min_local_size: int | None = Field(
        default=None,
        ge=1,
        description="null: the smallest share of the job's data set among its agents",
    )


class DpHelmetJob(ModelUpdateJob):
    algorithm: Literal["dp-helmet"]
    rounds: int = 1
    params: DpHelmetParams = DpHelmetParams()

    @field_validator("rounds")
    @classmethod
    def _one_shot(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"dp-helmet is one-shot: must be 1 (got {value})")
        return value


class DpHelmetPlan(ModelUpdatePlan):
    """K classes, the extractor φ and its width p, the loss, the sensitivity s per release
    (real units; a class one-vs-rest, the block for softmax)."""

    num_classes: int = Field(ge=2)
    features: str
    feature_dim: int = Field(ge=1)
    loss: Loss = "huber"
    unit: Literal["record", "agent"]
    min_local_size: int | None = Field(default=None, ge=1)
    sensitivity: float = Field(gt=0)


class DpHelmetTask(ModelUpdateTask):
    """What a DP-Helmet agent trains; ``min_local_size`` at record level only."""

    algorithm: Literal["dp-helmet"]
    num_classes: int = Field(ge=2)
    features: str = Field(min_length=1)
    feature_dim: int = Field(ge=1)
    input_clip: float = Field(gt=0)
    regularization: float = Field(gt=0)
    radius: float = Field(gt=0)
    huber_h: float = Field(gt=0)
    loss: Loss
    epochs: int = Field(ge=1)
    train_seed: int = Field(ge=0)
    min_local_size: int | None = Field(default=None, ge=1)
    # the SHA-256 of the learned feature map shipped as the model (None for fixed maps)
    features_sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)

    @model_validator(mode="after")
    def _consistent(self) -> DpHelmetTask:
        if self.dimension != self.num_classes * (self.feature_dim + 1):
            raise ValueError("dimension: must be num_classes × (feature_dim + 1)")
        # a learned map's SHA-256 is added once the state holds it (round_task); an agent
        # refuses a learned map without one when it builds the extractor
        if self.features_sha256 is not None and not is_learned(self.features):
            raise ValueError("features_sha256: only a learned feature map is named by a hash")
        if self.unit == "record" and self.min_local_size is None:
            raise ValueError("min_local_size: a record-level task states it")
        return self


_CLIP_SLACK = 1.0 + 1e-9  # the block's norm R·√K must never trigger the encoding's clip
_SOURCE = "the task (unit, c, R, Λ, M and scale)"


def _block_clip(radius: float, classes: int) -> float:
    return radius * math.sqrt(classes) * _CLIP_SLACK


def _release_event(noise: str, sigma: float, s: float, bits: int, width: int) -> DpEvent:
    l1, l2 = release_sensitivities(s=s, scale_bits=bits, width=width)
    std = sigma * math.ldexp(s, bits)
    if noise == "skellam":
        return SkellamEvent(
            mu=std * std / 2.0, l1_sensitivity=l1, l2_sensitivity=l2, dimension=width
        )
    return GaussianEvent(sigma=std, sensitivity=l2)


def _simple_bound(sigma: float, count: int, delta: float) -> dict[str, float | str]:
    """The paper's classical bound over the job's ``count`` releases, for comparison only."""
    return {
        "epsilon": simple_gaussian_epsilon(noise_multiplier=sigma, compositions=count, delta=delta),
        "note": "DP-Helmet's classical bound sqrt(2 ln(1.25 K/delta)) K/sigma over the "
        "job's releases, reported only; the ledger charges their RDP composition",
    }


class DpHelmetCoordinator(ModelUpdateCoordinator[DpHelmetJob, DpHelmetPlan, DpHelmetTask]):
    """DP-Helmet's coordinator side: one round, the averaged models."""

    def initial_state(self, data: CoordinatorData) -> CoordinatorState:
        d = self.details
        if data.num_classes != d.num_classes:
            raise AlgorithmError(
                f"the data has {data.num_classes} classes, the plan {d.num_classes}"
            )
        if not is_learned(d.features):
            return CoordinatorState(model=None, model_version=0, details={"round": 0})
        # fitted on the public pool only and shipped as model version 0 (docs/features.md)
        artifact, learned = fit_artifact(d.features, data)
        return CoordinatorState(
            model=artifact,
            model_version=0,
            details={"round": 0, "features": learned.model_dump()},
        )

    def round_task(self, state: CoordinatorState, *, round_number: int) -> RoundTask:
        """The base task, naming the learned map's SHA-256 when there is one."""
        task = super().round_task(state, round_number=round_number)
        learned = _learned(state)
        if learned is None:
            return task
        params = self.algorithm.task_type.model_validate(
            {**task.params.model_dump(), "features_sha256": learned.sha256}
        )
        return replace(task, params=params)

    def _clip(self) -> float:
        return _block_clip(self.spec.params.radius, self.details.num_classes)

    def _task(self, common: ModelUpdateTask) -> DpHelmetTask:
        if common.round != 1:
            raise AlgorithmError(f"{self.name} has one round, not round {common.round}")
        spec, d = self.spec, self.details
        p = spec.params
        return DpHelmetTask(
            **common.model_dump(),
            num_classes=d.num_classes,
            features=d.features,
            feature_dim=d.feature_dim,
            input_clip=p.input_clip,
            regularization=p.regularization,
            radius=p.radius,
            huber_h=p.huber_h,
            loss=p.loss,
            epochs=p.epochs,
            train_seed=spec.seed % 2**31,
            min_local_size=d.min_local_size,
        )

    def round_event(self, *, population: int = 0) -> DpEvent:
        """The event of the (only) round: the job's releases (K classes, or one block) composed."""
        d, plan = self.details, self.plan
        count, width = releases(d.loss, d.num_classes, d.feature_dim + 1)
        release = _release_event(d.noise, plan.noise_multiplier, d.sensitivity, d.scale_bits, width)
        return SelfComposedEvent(release, count)

    def finish_round(
        self,
        state: CoordinatorState,
        data: CoordinatorData,
        *,
        round_number: int,
        aggregate: npt.NDArray[np.float64],
        survivors: int,
    ) -> RoundOutcome:
        spec, d, plan = self.spec, self.details, self.plan
        total = common.checked_aggregate(aggregate, length=d.dimension, survivors=survivors)
        models = total.reshape(d.num_classes, d.feature_dim + 1) / survivors  # post-processing
        metrics: dict[str, float] = {
            "survivors": float(survivors),
            "simple_bound_epsilon": float(plan.calibration["simple_bound"]["epsilon"]),
        }
        learned = _learned(state)
        if data.test_x is not None and data.test_y is not None and len(data.test_y):
            extractor = build_extractor(
                d.features,
                data.input_shape,
                artifact=state.model,
                sha256=learned.sha256 if learned else None,
            )
            inputs = augment_and_clip(extractor(data.test_x), spec.params.input_clip)
            metrics["accuracy"] = float(np.mean(predict(models, inputs) == data.test_y))
        return RoundOutcome(
            state=CoordinatorState(
                model=model_bytes(
                    models,
                    features=d.features,
                    input_clip=spec.params.input_clip,
                    features_sha256=learned.sha256 if learned else None,
                    softmax=d.loss == "softmax",
                ),
                model_version=state.model_version + 1,
                details={"round": round_number},
            ),
            metrics=metrics,
            done=True,
        )

    # -- agent side --------------------------------------------------------------------------


class DpHelmetAgent(ModelUpdateAgent[DpHelmetTask]):
    """DP-Helmet's agent side: K trained models, and the checks of their claim."""

    def check(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> float:
        """Refuse unless the one claimed event is the task's releases (K classes, or the softmax
        block) with the sensitivity the agent recomputes itself from the task's loss, c, R, Λ and
        M (or the radius), at the encoding's scale,
        and the per-agent noise (over ``t·min_survivors`` honest agents, alone without secure
        aggregation) carries it."""
        t = self.task
        classes = t.num_classes
        count, width = releases(t.loss, classes, t.feature_dim + 1)
        counts = common.Counts(
            num_clients=num_clients, min_survivors=min_survivors, honest_fraction=honest_fraction
        )
        event = self._claimed(
            events,
            encoding,
            counts,
            clip=_block_clip(t.radius, classes),
            clip_from=f" of {classes} models of radius {t.radius:g}",
        )
        if not isinstance(event, SelfComposedEvent) or event.count != count:
            raise AlgorithmError(f"expected {count} {t.loss} releases, got {event!r}")
        s = sensitivity(
            unit=t.unit,
            clip=t.input_clip,
            radius=t.radius,
            regularization=t.regularization,
            local_size=t.min_local_size,
            loss=t.loss,
            classes=classes,
        )
        l1, l2 = release_sensitivities(s=s, scale_bits=t.scale_bits, width=width)
        total = common.claimed_total(
            event.event, noise=t.noise, l1=l1, l2=l2, dimension=width, source=_SOURCE
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
        """The K trained models, flattened (norm ≤ R·√K)."""
        t = self.task
        if data.num_classes != t.num_classes:
            raise AlgorithmError(
                f"the agent's data has {data.num_classes} classes, the task {t.num_classes}"
            )
        size = len(data.y)
        if t.min_local_size is not None and t.unit == "record" and size < t.min_local_size:
            raise AlgorithmError(
                f"this agent holds {size} records, fewer than the job's min_local_size "
                f"{t.min_local_size} its record-level sensitivity assumes"
            )
        extractor = build_extractor(
            t.features, tuple(data.input_shape), artifact=model, sha256=t.features_sha256
        )
        if extractor.dim != t.feature_dim:
            raise AlgorithmError(
                f"features {t.features!r} give {extractor.dim} values, the task {t.feature_dim}"
            )
        if size == 0:  # agent level: an empty data set is one of the data sets protected
            return np.zeros(t.dimension, dtype=np.float64)
        inputs = augment_and_clip(extractor(data.x), t.input_clip)
        models = train(
            inputs,
            np.asarray(data.y, dtype=np.int64),
            num_classes=t.num_classes,
            loss=t.loss,
            regularization=t.regularization,
            radius=t.radius,
            huber_h=t.huber_h,
            clip=t.input_clip,
            epochs=t.epochs,
            seed=t.train_seed,
        )
        flat: npt.NDArray[np.float64] = models.reshape(-1)
        return flat


#: The public-kmeans map of the MNIST recipe (benchmarks/utility/mnist-dp-helmet.yaml).
_KMEANS: dict[str, JsonValue] = {"centroids": 256, "patch": 5, "stride": 2, "dim": 128, "norm": 3.0}


def _helmet(
    kmeans: dict[str, JsonValue] | None, *, regularization: float, features: str = "identity"
) -> dict[str, JsonValue]:
    """A DP-Helmet recipe: one softmax model (radius 10, inputs clipped to 1, 10 epochs) on the
    given public-kmeans map, else on the map ``features`` (its options at their defaults)."""
    params: dict[str, JsonValue] = {
        "loss": "softmax",
        "regularization": regularization,
        "radius": 10.0,
        "input_clip": 1.0,
        "epochs": 10,
        "features": features if kmeans is None else "public-kmeans",
    }
    if kmeans is not None:
        params["public_kmeans"] = kmeans
    return {"params": params}


class DpHelmet(ModelUpdateAlgorithm[DpHelmetJob, DpHelmetPlan, DpHelmetTask]):
    """DP-Helmet; see the module docstring."""

    name: ClassVar[str] = "dp-helmet"
    # the MNIST recipe (one softmax model on a public-kmeans map of the pool) and its
    # neighbours in regularization and width; the softmax model on pixels, on the Gabor map, and
    # on the Gabor map whitened on the pool (docs/features.md#public-gabor)
    recipe_candidates = MappingProxyType(
        {
            "kmeans-softmax": _helmet(_KMEANS, regularization=0.0007),
            "kmeans-softmax-reg-0.0002": _helmet(_KMEANS, regularization=0.0002),
            "kmeans-softmax-reg-0.002": _helmet(_KMEANS, regularization=0.002),
            "kmeans-softmax-wide": _helmet({**_KMEANS, "dim": 256}, regularization=0.0007),
            "pixels-softmax": _helmet(None, regularization=0.0007),
            "gabor-softmax": _helmet(None, regularization=0.0007, features="gabor"),
            "whitened-gabor-softmax": _helmet(None, regularization=0.001, features="public-gabor"),
            "whitened-gabor-softmax-reg-0.002": _helmet(
                None, regularization=0.002, features="public-gabor"
            ),
        }
    )
    spec_type = DpHelmetJob
    plan_type = DpHelmetPlan
    task_type = DpHelmetTask
    coordinator_type = DpHelmetCoordinator
    agent_type = DpHelmetAgent

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self.narrow_for_plan(job, population)
        p, privacy = spec.params, spec.privacy
        shape, classes = common.data_shape(spec, data)
        features = p.feature_spec()
        width = feature_dim(features, shape) + 1
        count, release_width = releases(p.loss, classes, width)
        local_size = None
        if privacy.unit == "record":
            local_size = p.min_local_size or smallest_local_size(spec, population)
        s = sensitivity(
            unit=privacy.unit,
            clip=p.input_clip,
            radius=p.radius,
            regularization=p.regularization,
            local_size=local_size,
            loss=p.loss,
            classes=classes,
        )

        def make(bits: int) -> JobPlan:
            def job_event(sigma: float) -> DpEvent:
                return SelfComposedEvent(
                    _release_event(privacy.noise, sigma, s, bits, release_width), count
                )

            sigma, record = common.calibrate(job_event, privacy)
            std = sigma * math.ldexp(s, bits)
            l1, l2 = release_sensitivities(s=s, scale_bits=bits, width=release_width)
            record["simple_bound"] = _simple_bound(sigma, count, privacy.delta)
            details = DpHelmetPlan(
                num_classes=classes,
                features=features,
                feature_dim=width - 1,
                loss=p.loss,
                dimension=classes * width,
                unit=privacy.unit,
                min_local_size=local_size,
                sensitivity=s,
                l1_sensitivity=l1,
                l2_sensitivity=l2,
                scale_bits=bits,
                noise=privacy.noise,
                noise_total=std * std / 2.0 if privacy.noise == "skellam" else std,
                secure_aggregation=spec.secagg.enabled,
                honest_fraction=privacy.honest_fraction,
                corrupt_fraction=spec.secagg.corrupt_fraction,
            )
            return JobPlan(sigma, record, population, details)

        bits = spec.secagg.scale_bits
        return self._fit_scale(
            spec, population, ring_scale_bits(s, release_width) if bits is None else bits, make
        )


def _learned(state: CoordinatorState) -> LearnedFeature | None:
    """The learned map the state ships as its model, or None (a fixed map)."""
    entry = state.details.get("features")
    return None if entry is None else LearnedFeature.model_validate(entry)


ALGORITHM = DpHelmet()
