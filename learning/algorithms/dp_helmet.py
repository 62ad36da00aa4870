"""DP-Helmet: one-shot secure averaging of locally trained private linear models.

One round: each agent trains K one-vs-rest linear models on fixed public features
(:mod:`~dpfl.learning.algorithms.helmet_training`) and sends the K×(p+1) block with its noise
share; the coordinator's average of the sum is the model. Per class the sensitivity is
``2c/(MΛ)`` (one record; docs/accounting.md#dp-helmet-record-level-sensitivity) or ``2R`` (an
agent's data set), and every participant is charged the K class releases composed. An agent with
fewer than ``min_local_size`` records refuses, a function of its size alone. Math, encoding and
charge: docs/algorithms.md#dp-helmet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from dpfl.accounting import (
    DpEvent,
    GaussianEvent,
    SelfComposedEvent,
    SkellamEvent,
    simple_gaussian_epsilon,
)
from dpfl.learning.algorithms import common
from dpfl.learning.algorithms.base import (
    AgentData,
    Algorithm,
    AlgorithmError,
    ClientCharge,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundOutcome,
    RoundTask,
)
from dpfl.learning.algorithms.extractors import build_extractor, feature_spec
from dpfl.learning.algorithms.federation import smallest_local_size
from dpfl.learning.algorithms.helmet_training import (
    augment_and_clip,
    class_sensitivities,
    model_bytes,
    predict,
    ring_scale_bits,
    sensitivity,
    train_one_vs_rest,
)
from dpfl.learning.jobs import DpHelmetJob, JobSpec
from dpfl.secagg.encoding import EncodingConfig
from dpfl.secagg.errors import ParameterError

__all__ = ["ALGORITHM", "DpHelmet"]

_CLIP_SLACK = 1.0 + 1e-9  # the block's norm R·√K must never trigger the encoding's clip
_SOURCE = "the task (unit, c, R, Λ, M and scale)"


def _block_clip(radius: float, classes: int) -> float:
    return radius * math.sqrt(classes) * _CLIP_SLACK


def _class_event(noise: str, sigma: float, s: float, bits: int, width: int) -> DpEvent:
    l1, l2 = class_sensitivities(s=s, scale_bits=bits, width=width)
    std = sigma * math.ldexp(s, bits)
    if noise == "skellam":
        return SkellamEvent(
            mu=std * std / 2.0, l1_sensitivity=l1, l2_sensitivity=l2, dimension=width
        )
    return GaussianEvent(sigma=std, sensitivity=l2)


class DpHelmet(Algorithm):
    """DP-Helmet; see the module docstring."""

    name: ClassVar[str] = "dp-helmet"

    def _job(self, job: JobSpec) -> DpHelmetJob:
        if not isinstance(job, DpHelmetJob):
            raise AlgorithmError(f"{self.name} cannot run a {type(job).__name__}")
        return job

    # -- coordinator side --------------------------------------------------------------------

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self._job(job)
        if isinstance(population, bool) or not isinstance(population, int) or population < 1:
            raise AlgorithmError(f"population must be an integer >= 1, got {population!r}")
        p, privacy = spec.params, spec.privacy
        shape, classes = common.data_shape(spec, data)
        features = feature_spec(p.features, dim=p.projection_dim, seed=p.projection_seed)
        width = build_extractor(features, shape).dim + 1
        local_size = None
        if privacy.unit == "record":
            local_size = p.min_local_size or smallest_local_size(spec, population)
        s = sensitivity(
            unit=privacy.unit,
            clip=p.input_clip,
            radius=p.radius,
            regularization=p.regularization,
            local_size=local_size,
        )
        given_bits = spec.secagg.scale_bits
        bits = given_bits if given_bits is not None else ring_scale_bits(s, width)
        details: dict[str, Any] = {
            "num_classes": classes,
            "features": features,
            "feature_dim": width - 1,
            "dimension": classes * width,
            "unit": privacy.unit,
            "min_local_size": local_size,
            "sensitivity": s,
            "noise": privacy.noise,
            "secure_aggregation": spec.secagg.enabled,
            "honest_fraction": privacy.honest_fraction,
            "corrupt_fraction": spec.secagg.corrupt_fraction,
        }
        while True:

            def job_event(sigma: float, bits: int = bits) -> DpEvent:
                return SelfComposedEvent(
                    _class_event(privacy.noise, sigma, s, bits, width), classes
                )

            sigma, record = common.calibrate_or_check(
                job_event,
                given=privacy.noise_multiplier,
                target_epsilon=privacy.target_epsilon,
                delta=privacy.delta,
            )
            std = sigma * math.ldexp(s, bits)
            details["scale_bits"] = bits
            details["noise_total"] = std * std / 2.0 if privacy.noise == "skellam" else std
            plan = JobPlan(
                noise_multiplier=sigma, calibration=record, population=population, details=details
            )
            try:
                self._check_ring(spec, plan, population)
                break
            except AlgorithmError:
                if given_bits is not None or bits == 0:
                    raise
                bits -= 1
        l1, l2 = class_sensitivities(s=s, scale_bits=bits, width=width)
        details["l1_sensitivity"], details["l2_sensitivity"] = l1, l2
        record["scale_bits_rule"] = "given" if given_bits is not None else "inflation<=0.1%"
        record["simple_bound"] = {
            "epsilon": simple_gaussian_epsilon(
                noise_multiplier=sigma, compositions=classes, delta=privacy.delta
            ),
            "note": "DP-Helmet's classical bound sqrt(2 ln(1.25 K/delta)) K/sigma, reported "
            "only; the ledger charges the RDP composition of the K releases",
        }
        return JobPlan(
            noise_multiplier=sigma, calibration=record, population=population, details=details
        )

    def _check_ring(self, job: DpHelmetJob, plan: JobPlan, population: int) -> None:
        survivors = max(1, math.ceil(population * (1.0 - job.secagg.dropout_fraction)))
        task = RoundTask(params={}, vector_length=int(plan.details["dimension"]))
        self.encoding(job, plan, task, participants=population, min_survivors=survivors)

    def initial_state(self, job: JobSpec, plan: JobPlan, data: CoordinatorData) -> CoordinatorState:
        self._job(job)
        if data.num_classes != int(plan.details["num_classes"]):
            raise AlgorithmError(
                f"the data has {data.num_classes} classes, the plan {plan.details['num_classes']}"
            )
        return CoordinatorState(model=None, model_version=0, details={"round": 0})

    def select(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> list[str]:
        self._job(job)
        return list(population)  # one round, every agent contributes its model

    def round_task(
        self, job: JobSpec, plan: JobPlan, state: CoordinatorState, *, round_number: int
    ) -> RoundTask:
        spec = self._job(job)
        if round_number != 1:
            raise AlgorithmError(f"{self.name} has one round, not round {round_number}")
        p, d = spec.params, plan.details
        params = {
            "algorithm": self.name,
            "job": spec.name,
            "round": round_number,
            "num_classes": d["num_classes"],
            "features": d["features"],
            "feature_dim": d["feature_dim"],
            "input_clip": p.input_clip,
            "regularization": p.regularization,
            "radius": p.radius,
            "huber_h": p.huber_h,
            "loss": p.loss,
            "epochs": p.epochs,
            "train_seed": spec.seed % 2**31,
            "unit": d["unit"],
            "min_local_size": d["min_local_size"],
            "dimension": d["dimension"],
            "scale_bits": d["scale_bits"],
            "noise": d["noise"],
            "noise_total": d["noise_total"],
            "noise_multiplier": plan.noise_multiplier,
            "secure_aggregation": d["secure_aggregation"],
            "honest_fraction": d["honest_fraction"],
            "delta": spec.privacy.delta,
        }
        return RoundTask(params=params, vector_length=int(d["dimension"]))

    def encoding(
        self,
        job: JobSpec,
        plan: JobPlan,
        task: RoundTask,
        *,
        participants: int,
        min_survivors: int,
    ) -> EncodingConfig:
        spec = self._job(job)
        d = plan.details
        if task.vector_length != int(d["dimension"]):
            raise AlgorithmError("the task's vector length differs from the plan's dimension")
        if not 1 <= min_survivors <= participants:
            raise AlgorithmError(
                f"min_survivors {min_survivors} must lie in [1, participants={participants}]"
            )
        noise = common.per_agent_noise(
            kind=common.NOISE_KINDS[str(d["noise"])],
            total=float(d["noise_total"]),
            secure_aggregation=bool(d["secure_aggregation"]),
            honest_fraction=float(d["honest_fraction"]),
            min_survivors=min_survivors,
            participants=participants,
            dropout_fraction=spec.secagg.dropout_fraction,
        )
        try:
            return EncodingConfig.for_summands(
                clip=_block_clip(spec.params.radius, int(d["num_classes"])),
                scale_bits=int(d["scale_bits"]),
                summands=participants,
                noise=noise,
            )
        except ParameterError as exc:
            raise AlgorithmError(f"no ring holds this round's sum: {exc}") from exc

    def round_event(self, plan: JobPlan) -> DpEvent:
        """The event of the (only) round: K compositions of one class release."""
        d = plan.details
        return SelfComposedEvent(
            _class_event(
                str(d["noise"]),
                plan.noise_multiplier,
                float(d["sensitivity"]),
                int(d["scale_bits"]),
                int(d["feature_dim"]) + 1,
            ),
            int(d["num_classes"]),
        )

    def invitation_events(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> tuple[DpEvent, ...]:
        self._job(job)
        return (self.round_event(plan),)

    def charges(
        self,
        job: JobSpec,
        plan: JobPlan,
        *,
        round_number: int,
        population: Sequence[str],
        participants: Sequence[str],
    ) -> dict[str, ClientCharge]:
        spec = self._job(job)
        secure = bool(plan.details["secure_aggregation"])
        charge = ClientCharge(
            event=self.round_event(plan),
            unit=spec.privacy.unit,
            approximate=plan.details["noise"] == "gaussian",
            secure_aggregation=secure,
            honest_fraction=spec.privacy.honest_fraction if secure else 1.0,
        )
        return dict.fromkeys(participants, charge)

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
        spec = self._job(job)
        d = plan.details
        classes, width = int(d["num_classes"]), int(d["feature_dim"]) + 1
        total = np.asarray(aggregate, dtype=np.float64)
        if total.shape != (classes * width,):
            raise AlgorithmError(f"aggregate of shape {total.shape}, expected ({classes * width},)")
        if not np.isfinite(total).all() or survivors < 1:
            raise AlgorithmError("aggregate contains NaN or infinity, or nobody contributed")
        models = total.reshape(classes, width) / survivors  # the average: post-processing
        metrics: dict[str, float] = {
            "survivors": float(survivors),
            "simple_bound_epsilon": float(plan.calibration["simple_bound"]["epsilon"]),
        }
        if data.test_x is not None and data.test_y is not None and len(data.test_y):
            extractor = build_extractor(str(d["features"]), data.input_shape)
            inputs = augment_and_clip(extractor(data.test_x), spec.params.input_clip)
            metrics["accuracy"] = float(np.mean(predict(models, inputs) == data.test_y))
        return RoundOutcome(
            state=CoordinatorState(
                model=model_bytes(
                    models, features=str(d["features"]), input_clip=spec.params.input_clip
                ),
                model_version=state.model_version + 1,
                details={"round": round_number},
            ),
            metrics=metrics,
            done=True,
        )

    # -- agent side --------------------------------------------------------------------------

    def _parse(self, params: Mapping[str, Any]) -> dict[str, Any]:
        p = common.TaskParams(params, algorithm=self.name)
        unit = p.text("unit", choices=("record", "agent"))
        task = {
            "num_classes": p.integer("num_classes", minimum=2),
            "features": p.text("features"),
            "feature_dim": p.integer("feature_dim", minimum=1),
            "input_clip": p.number("input_clip", low=0.0),
            "regularization": p.number("regularization", low=0.0),
            "radius": p.number("radius", low=0.0),
            "huber_h": p.number("huber_h", low=0.0),
            "loss": p.text("loss", choices=("huber", "logistic")),
            "epochs": p.integer("epochs", minimum=1),
            "train_seed": p.integer("train_seed", minimum=0),
            "unit": unit,
            "min_local_size": p.integer("min_local_size", minimum=1) if unit == "record" else None,
            "dimension": p.integer("dimension", minimum=1),
            "scale_bits": p.integer("scale_bits", minimum=0),
            "noise": p.text("noise", choices=tuple(common.NOISE_KINDS)),
            "secure_aggregation": p.flag("secure_aggregation"),
            "honest_fraction": p.number("honest_fraction", low=0.0, high=1.0),
        }
        if task["dimension"] != task["num_classes"] * (task["feature_dim"] + 1):
            raise AlgorithmError("params.dimension: must be num_classes × (feature_dim + 1)")
        return task

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
        """Refuse unless the one claimed event is K class releases with the sensitivity the
        agent recomputes itself from the task's c, R, Λ and M (or 2R), at the encoding's scale,
        and the per-agent noise (over ``t·min_survivors`` honest agents, alone without secure
        aggregation) carries it."""
        task = self._parse(params)
        event = common.one_claimed_event(
            events,
            algorithm=self.name,
            task_honest_fraction=task["honest_fraction"],
            honest_fraction=honest_fraction,
            num_clients=num_clients,
            min_survivors=min_survivors,
        )
        classes, width = task["num_classes"], task["feature_dim"] + 1
        clip = _block_clip(task["radius"], classes)
        if encoding.scale_bits != task["scale_bits"] or encoding.clip != clip:
            raise AlgorithmError(
                f"the encoding (clip {encoding.clip:g}, scale 2^{encoding.scale_bits}) does not "
                f"fit {classes} models of radius {task['radius']:g} at scale 2^{task['scale_bits']}"
            )
        if not isinstance(event, SelfComposedEvent) or event.count != classes:
            raise AlgorithmError(f"expected {classes} class releases, got {event!r}")
        s = sensitivity(
            unit=task["unit"],
            clip=task["input_clip"],
            radius=task["radius"],
            regularization=task["regularization"],
            local_size=task["min_local_size"],
        )
        l1, l2 = class_sensitivities(s=s, scale_bits=task["scale_bits"], width=width)
        release = event.event
        if task["noise"] == "skellam":
            if not isinstance(release, SkellamEvent) or release.dimension != width:
                raise AlgorithmError(f"expected a Skellam event over {width} coordinates")
            common.check_sensitivity("L1", release.l1_sensitivity, l1, source=_SOURCE)
            common.check_sensitivity("L2", release.l2_sensitivity, l2, source=_SOURCE)
            total = release.mu
        else:
            if not isinstance(release, GaussianEvent):
                raise AlgorithmError(f"Gaussian noise but a {type(release).__name__} is claimed")
            common.check_sensitivity("L2", release.sensitivity, l2, source=_SOURCE)
            total = release.sigma
        common.check_encoding(
            encoding,
            kind=common.NOISE_KINDS[task["noise"]],
            total=total,
            secure_aggregation=task["secure_aggregation"],
            honest_fraction=honest_fraction,
            min_survivors=min_survivors,
            num_clients=num_clients,
        )

    def agent_compute(
        self,
        params: Mapping[str, Any],
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> npt.NDArray[np.float64]:
        """The K trained models, flattened (norm ≤ R·√K)."""
        task = self._parse(params)
        if data.num_classes != task["num_classes"]:
            raise AlgorithmError(
                f"the agent's data has {data.num_classes} classes, the task {task['num_classes']}"
            )
        size = len(data.y)
        if task["unit"] == "record" and size < task["min_local_size"]:
            raise AlgorithmError(
                f"this agent holds {size} records, fewer than the job's min_local_size "
                f"{task['min_local_size']} its record-level sensitivity assumes"
            )
        extractor = build_extractor(task["features"], tuple(data.input_shape))
        if extractor.dim != task["feature_dim"]:
            raise AlgorithmError(
                f"features {task['features']!r} give {extractor.dim} values, the task "
                f"{task['feature_dim']}"
            )
        if size == 0:  # agent level: an empty data set is one of the data sets protected
            return np.zeros(task["dimension"], dtype=np.float64)
        inputs = augment_and_clip(extractor(data.x), task["input_clip"])
        models = train_one_vs_rest(
            inputs,
            np.asarray(data.y, dtype=np.int64),
            num_classes=task["num_classes"],
            loss=task["loss"],
            regularization=task["regularization"],
            radius=task["radius"],
            huber_h=task["huber_h"],
            clip=task["input_clip"],
            epochs=task["epochs"],
            seed=task["train_seed"],
        )
        flat: npt.NDArray[np.float64] = models.reshape(-1)
        return flat


ALGORITHM = DpHelmet()
