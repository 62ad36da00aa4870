"""DP-FedAvg: client-level DP with Poisson client sampling, clipped model deltas and distributed
integer noise summed by secure aggregation.

Agents send ``clip_S(θ_i − θ)`` with their noise share; the coordinator divides the sum by the
EXPECTED participant count q·n (so one agent moves the update by at most S/m) and charges every
population member ``PoissonSampledEvent(q, SkellamEvent(μ, Δ₁, Δ₂, d))`` per round, since
sampling amplifies only at population level. Math, charge, the no-secure-aggregation case and the
task parameters: docs/algorithms.md#dp-fedavg.
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
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
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
from dpfl.learning.algorithms.model_state import initial_model_state, load_model, stepped_model
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import DpFedAvgJob, JobSpec
from dpfl.secagg.encoding import EncodingConfig
from dpfl.secagg.errors import ParameterError
from dpfl.secagg.noise import NoiseKind
from dpfl.secagg.randomness import RandomSource, SystemRandomSource

__all__ = ["ALGORITHM", "DpFedAvg", "mechanism_event"]

_MOMENTUM_BLOB = "momentum"


def mechanism_event(
    *, noise: str, total: float, l1: float, l2: float, dimension: int
) -> SkellamEvent | GaussianEvent:
    """One release of the noisy sum, in scaled integer units (no sampling)."""
    if noise == "skellam":
        return SkellamEvent(mu=total, l1_sensitivity=l1, l2_sensitivity=l2, dimension=dimension)
    return GaussianEvent(sigma=total, sensitivity=l2)


def _noise_total(noise: str, z: float, l2: float) -> float:
    """μ with √(2μ) = z·Δ₂ (Skellam), or σ = z·Δ₂ (discrete Gaussian)."""
    return (z * l2) ** 2 / 2.0 if noise == "skellam" else z * l2


def _sensitivities(clip: float, scale_bits: int, dimension: int) -> tuple[float, float]:
    config = EncodingConfig(clip=clip, scale_bits=scale_bits, ring_bits=64)
    return config.rounded_l1_bound(dimension), config.rounded_l2_bound(dimension)


class DpFedAvg(Algorithm):
    """DP-FedAvg; see the module docstring.

    Args:
        random_source: the CSPRNG of client sampling (default: the system CSPRNG; tests and
            reproducible simulations pass a :class:`~dpfl.secagg.SeededRandomSource`).
    """

    name: ClassVar[str] = "dp-fedavg"
    job_type: ClassVar[type] = DpFedAvgJob

    def __init__(self, *, random_source: RandomSource | None = None) -> None:
        self._random = random_source if random_source is not None else SystemRandomSource()

    def with_random_source(self, source: RandomSource) -> Algorithm:
        """A copy whose client sampling draws from ``source``."""
        return type(self)(random_source=source)

    # -- coordinator side --------------------------------------------------------------------

    def _job(self, job: JobSpec) -> DpFedAvgJob:
        if not isinstance(job, self.job_type):
            raise AlgorithmError(f"{self.name} cannot run a {type(job).__name__}")
        return job  # type: ignore[return-value]

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self._job(job)
        if isinstance(population, bool) or not isinstance(population, int) or population < 1:
            raise AlgorithmError(f"population must be an integer >= 1, got {population!r}")
        p, privacy, secagg = spec.params, spec.privacy, spec.secagg
        expected = self._expected_participants(spec, population)
        if expected < 1.0:
            raise AlgorithmError(
                f"sampling_rate {p.sampling_rate:g} x population {population} expects "
                f"{expected:.3g} participants per round; at least 1 is needed"
            )
        shape, classes = common.data_shape(spec, data)
        dimension = common.model_dimension(spec.model, shape, classes)
        given_bits = spec.secagg.scale_bits
        bits = (
            given_bits
            if given_bits is not None
            else common.choose_scale_bits(clip=p.clip, dimension=dimension)
        )
        kind = common.NOISE_KINDS[privacy.noise]
        while True:
            l1, l2 = _sensitivities(p.clip, bits, dimension)
            shape = {
                **self._plan_extras(spec, population),
                "dimension": dimension,
                "l1_sensitivity": l1,
                "l2_sensitivity": l2,
                "noise": privacy.noise,
                "sampling_rate": p.sampling_rate,
                "secure_aggregation": secagg.enabled,
            }

            def round_event(z: float, shape: dict[str, Any] = shape) -> DpEvent:
                total = _noise_total(privacy.noise, z, float(shape["l2_sensitivity"]))
                return self._round_event_from({**shape, "noise_total": total}, population)

            def job_event(z: float, round_event: Any = round_event) -> DpEvent:
                event: DpEvent = round_event(z)
                return event if spec.rounds == 1 else SelfComposedEvent(event, spec.rounds)

            z, record = common.calibrate_or_check(
                job_event,
                given=privacy.noise_multiplier,
                target_epsilon=privacy.target_epsilon,
                delta=privacy.delta,
            )
            total = _noise_total(privacy.noise, z, l2)
            try:
                self._check_ring(spec, population, bits, kind, total)
                break
            except AlgorithmError:
                if given_bits is not None or bits == 0:
                    raise
                bits -= 1
        details = {
            **self._plan_extras(spec, population),
            "model": spec.model,
            "dimension": dimension,
            "scale_bits": bits,
            "l1_sensitivity": l1,
            "l2_sensitivity": l2,
            "noise": privacy.noise,
            "noise_total": total,
            "sampling_rate": p.sampling_rate,
            "expected_participants": expected,
            "secure_aggregation": secagg.enabled,
            "honest_fraction": privacy.honest_fraction,
            "corrupt_fraction": secagg.corrupt_fraction,
        }
        record["scale_bits_rule"] = "given" if given_bits is not None else "inflation<=0.1%"
        return JobPlan(
            noise_multiplier=z, calibration=record, population=population, details=details
        )

    def _check_ring(
        self, job: DpFedAvgJob, population: int, bits: int, kind: NoiseKind, total: float
    ) -> None:
        """The whole population, each adding its share, must fit a 64-bit ring."""
        survivors = max(1, math.ceil(population * (1.0 - job.secagg.dropout_fraction)))
        noise = common.per_agent_noise(
            kind=kind,
            total=total,
            secure_aggregation=job.secagg.enabled,
            honest_fraction=job.privacy.honest_fraction,
            min_survivors=survivors,
            participants=population,
            dropout_fraction=job.secagg.dropout_fraction,
        )
        try:
            EncodingConfig.for_summands(
                clip=job.params.clip, scale_bits=bits, summands=population, noise=noise
            )
        except ParameterError as exc:
            raise AlgorithmError(f"scale bits {bits}: {exc}") from exc

    def initial_state(self, job: JobSpec, plan: JobPlan, data: CoordinatorData) -> CoordinatorState:
        spec = self._job(job)
        dimension = _plan_int(plan, "dimension")
        return initial_model_state(spec, data, algorithm=self.name, dimension=dimension)

    def select(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> list[str]:
        spec = self._job(job)
        stream = self._random.stream(f"{self.name}/select/{spec.name}/{round_number}")
        return common.poisson_sample(population, spec.params.sampling_rate, stream)

    def round_task(
        self, job: JobSpec, plan: JobPlan, state: CoordinatorState, *, round_number: int
    ) -> RoundTask:
        spec = self._job(job)
        p, d = spec.params, plan.details
        params = {
            "algorithm": self.name,
            "job": spec.name,
            "round": round_number,
            "model": spec.model,
            "clip": p.clip,
            "local_steps": p.local_steps,
            "learning_rate": p.learning_rate,
            "batch_size": p.batch_size,
            "train_seed": (spec.seed * 1_000_003 + round_number) % 2**31,
            "sampling_rate": p.sampling_rate,
            "population": plan.population,
            "expected_participants": d["expected_participants"],
            "dimension": d["dimension"],
            "scale_bits": d["scale_bits"],
            "noise": d["noise"],
            "noise_total": d["noise_total"],
            "noise_multiplier": plan.noise_multiplier,
            "secure_aggregation": d["secure_aggregation"],
            "honest_fraction": d["honest_fraction"],
            "unit": "agent",
            "delta": spec.privacy.delta,
        }
        return RoundTask(
            params=params,
            vector_length=_plan_int(plan, "dimension"),
            model_version=state.model_version,
        )

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
        if task.vector_length != _plan_int(plan, "dimension"):
            raise AlgorithmError("the task's vector length differs from the plan's dimension")
        if not 1 <= min_survivors <= participants:
            raise AlgorithmError(
                f"min_survivors {min_survivors} must lie in [1, participants={participants}]"
            )
        noise = common.per_agent_noise(
            kind=common.NOISE_KINDS[str(plan.details["noise"])],
            total=float(plan.details["noise_total"]),
            secure_aggregation=bool(plan.details["secure_aggregation"]),
            honest_fraction=float(plan.details["honest_fraction"]),
            min_survivors=min_survivors,
            participants=participants,
            dropout_fraction=spec.secagg.dropout_fraction,
        )
        try:
            return EncodingConfig.for_summands(
                clip=spec.params.clip,
                scale_bits=_plan_int(plan, "scale_bits"),
                summands=participants,
                noise=noise,
            )
        except ParameterError as exc:
            raise AlgorithmError(f"no ring holds this round's sum: {exc}") from exc

    def round_event(self, plan: JobPlan, *, population: int | None = None) -> DpEvent:
        """The event one committed round charges (see the module docstring).

        ``population``: the size of the population the round's participants were drawn from
        (default: the plan's); only fixed-size sampling (DP-Fed-LS) depends on it.
        """
        _plan_int(plan, "dimension")
        return self._round_event_from(
            plan.details, plan.population if population is None else population
        )

    def invitation_events(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> tuple[DpEvent, ...]:
        """``(round_event,)``: what :meth:`charges` charges any participant of any round."""
        self._job(job)
        return (self.round_event(plan, population=len(population)),)

    def releases_every_sample(self, job: JobSpec, plan: JobPlan) -> bool:
        """Under secure aggregation the whole population is charged the client-sampled event,
        which bounds the release of ``M(S)`` for every sample S, so every sample is released
        (docs/accounting.md, "Client sampling: every sample is released")."""
        self._job(job)
        return bool(plan.details["secure_aggregation"])

    def noise_alone_encoding(self, job: JobSpec, plan: JobPlan, task: RoundTask) -> EncodingConfig:
        """One agent's encoding of a one-agent round: its noise, ``total/(t·(1−δ))``
        (:func:`~dpfl.learning.algorithms.common.per_agent_noise` with N = m_s = 1), is the law
        of the N shares' sum in every round without dropouts, whatever N is."""
        if not self.releases_every_sample(job, plan):
            raise AlgorithmError(
                f"{self.name} without secure aggregation never releases noise alone"
            )
        return self.encoding(job, plan, task, participants=1, min_survivors=1)

    # -- hooks of variants (DP-Fed-LS: fixed-size client sampling, smoothing) ----------------

    def _expected_participants(self, job: DpFedAvgJob, population: int) -> float:
        """m, the divisor of the summed update: q·n under Poisson sampling."""
        return job.params.sampling_rate * population

    def _plan_extras(self, job: DpFedAvgJob, population: int) -> dict[str, Any]:
        """Further plan details a variant needs in every round (JSON values)."""
        del job, population
        return {}

    def _round_event_from(self, details: Mapping[str, Any], population: int) -> DpEvent:
        """One round's event from the plan's details: the release of the noisy sum, wrapped in
        Poisson client sampling under secure aggregation (add/remove one agent)."""
        del population
        inner = mechanism_event(
            noise=str(details["noise"]),
            total=float(details["noise_total"]),
            l1=float(details["l1_sensitivity"]),
            l2=float(details["l2_sensitivity"]),
            dimension=int(details["dimension"]),
        )
        rate = float(details["sampling_rate"])
        if bool(details["secure_aggregation"]) and rate < 1.0:
            return PoissonSampledEvent(rate, inner)
        return inner

    def _unwrap_claim(self, event: DpEvent, task: Mapping[str, Any]) -> tuple[DpEvent, float]:
        """The claimed release inside its client-sampling wrapper, checked against the task, and
        the factor its sensitivities carry over the encoding's rounded bounds (1: add/remove).

        Raises:
            AlgorithmError: a wrapper the task does not sample with.
        """
        sampled = task["secure_aggregation"] and task["sampling_rate"] < 1.0
        if isinstance(event, PoissonSampledEvent):
            if not sampled or event.sampling_rate != task["sampling_rate"]:
                raise AlgorithmError(
                    f"the event claims client sampling at rate {event.sampling_rate:g}; "
                    f"the task samples at {task['sampling_rate']:g} "
                    f"{'with' if task['secure_aggregation'] else 'without'} secure aggregation"
                )
            return event.event, 1.0
        if sampled:
            raise AlgorithmError("the task samples clients but the event does not say so")
        return event, 1.0

    def _post_process(
        self, job: DpFedAvgJob, net: Any, update: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Post-processing of the averaged noisy update before the model step (identity)."""
        del job, net
        return update

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
        event = self.round_event(plan, population=len(population))
        approximate = plan.details["noise"] == "gaussian"
        if bool(plan.details["secure_aggregation"]):
            # every client of the population (and any participant outside it: never under-count)
            charged = dict.fromkeys([*population, *participants])
            charge = ClientCharge(
                event=event,
                unit="agent",
                approximate=approximate,
                secure_aggregation=True,
                honest_fraction=spec.privacy.honest_fraction,
            )
        else:
            charged = dict.fromkeys(participants)
            charge = ClientCharge(
                event=event,
                unit="agent",
                approximate=approximate,
                secure_aggregation=False,
                honest_fraction=1.0,
            )
        return dict.fromkeys(charged, charge)

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
        total = np.asarray(aggregate, dtype=np.float64)
        dimension = _plan_int(plan, "dimension")
        if total.shape != (dimension,):
            raise AlgorithmError(f"aggregate of shape {total.shape}, expected ({dimension},)")
        if not np.isfinite(total).all():
            raise AlgorithmError("aggregate contains NaN or infinity")
        net = load_model(spec, state, data)
        update = self._post_process(spec, net, total / float(plan.details["expected_participants"]))
        momentum = spec.params.server_momentum
        blobs = dict(state.blobs)
        if momentum > 0.0:
            previous = blobs.get(_MOMENTUM_BLOB)
            velocity = (
                np.frombuffer(previous, dtype="<f8").copy()
                if previous is not None
                else np.zeros(dimension)
            )
            if velocity.shape != (dimension,):
                raise AlgorithmError("the stored momentum buffer has the wrong length")
            velocity = momentum * velocity + update
            blobs[_MOMENTUM_BLOB] = velocity.astype("<f8").tobytes()
            step = velocity
        else:
            step = update
        model, evaluation = stepped_model(
            spec, net, spec.params.server_learning_rate * step, data, algorithm=self.name
        )
        metrics: dict[str, float] = {
            "survivors": float(survivors),
            "update_norm": float(np.linalg.norm(update)),
            **evaluation,
        }
        return RoundOutcome(
            state=CoordinatorState(
                model=model,
                model_version=state.model_version + 1,
                details={"round": round_number},
                blobs=blobs,
            ),
            metrics=metrics,
            done=round_number >= spec.rounds,
        )

    # -- agent side --------------------------------------------------------------------------

    def _parse(self, params: Mapping[str, Any]) -> dict[str, Any]:
        p = common.TaskParams(params, algorithm=self.name)
        return {
            "model": p.text("model"),
            "clip": p.number("clip", low=0.0),
            "local_steps": p.integer("local_steps", minimum=1),
            "learning_rate": p.number("learning_rate", low=0.0),
            "batch_size": p.integer("batch_size", minimum=1),
            "train_seed": p.integer("train_seed", minimum=0),
            "sampling_rate": p.number("sampling_rate", low=0.0, high=1.0),
            "dimension": p.integer("dimension", minimum=1),
            "scale_bits": p.integer("scale_bits", minimum=0),
            "noise": p.text("noise", choices=tuple(common.NOISE_KINDS)),
            "secure_aggregation": p.flag("secure_aggregation"),
            "honest_fraction": p.number("honest_fraction", low=0.0, high=1.0),
        }

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
        """Refuse unless the events describe exactly this encoding and its noise suffices.

        Checks: well-formed params; the encoding's clip and scale are the task's; one event of
        the shape this configuration charges (client sampling only under secure aggregation,
        at the task's rate); its sensitivities are the encoding's rounded bounds for d
        coordinates; the per-agent noise of the encoding, summed over ``t·min_survivors``
        honest agents (alone without secure aggregation), reaches the event's noise; the ring
        holds the sum of ``num_clients`` vectors.
        """
        task = self._parse(params)
        if honest_fraction != task["honest_fraction"]:
            raise AlgorithmError(
                f"honest fraction {honest_fraction:g} differs from the task's "
                f"{task['honest_fraction']:g}"
            )
        if encoding.clip != task["clip"] or encoding.scale_bits != task["scale_bits"]:
            raise AlgorithmError(
                f"the encoding (clip {encoding.clip:g}, scale 2^{encoding.scale_bits}) differs "
                f"from the task (clip {task['clip']:g}, scale 2^{task['scale_bits']})"
            )
        if not 1 <= min_survivors <= num_clients:
            raise AlgorithmError(f"min_survivors {min_survivors} outside [1, {num_clients}]")
        if len(events) != 1:
            raise AlgorithmError(f"a {self.name} round charges one event, {len(events)} claimed")
        inner, factor = self._unwrap_claim(events[0], task)
        d = task["dimension"]
        l1 = factor * encoding.rounded_l1_bound(d)
        l2 = factor * encoding.rounded_l2_bound(d)
        kind = common.NOISE_KINDS[task["noise"]]
        if task["noise"] == "skellam":
            if not isinstance(inner, SkellamEvent):
                raise AlgorithmError(f"Skellam noise but a {type(inner).__name__} is claimed")
            if inner.dimension != d:
                raise AlgorithmError(f"the event has dimension {inner.dimension}, the task {d}")
            _same_sensitivity("L2", inner.l2_sensitivity, l2)
            _same_sensitivity("L1", inner.l1_sensitivity, l1)
            total = inner.mu
        else:
            if not isinstance(inner, GaussianEvent):
                raise AlgorithmError(f"Gaussian noise but a {type(inner).__name__} is claimed")
            _same_sensitivity("L2", inner.sensitivity, l2)
            total = inner.sigma
        common.check_encoding(
            encoding,
            kind=kind,
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
        task = self._parse(params)
        if model is None:
            raise AlgorithmError(f"{self.name} needs the global model")
        from dpfl.learning.params import model_from_bytes
        from dpfl.learning.training import local_update

        net = common.build_model(task["model"], data.input_shape, data.num_classes, seed=0)
        try:
            model_from_bytes(model, model=net)
            update = local_update(
                net,
                data.x,
                data.y,
                steps=task["local_steps"],
                batch_size=task["batch_size"],
                learning_rate=task["learning_rate"],
                seed=task["train_seed"],
                device=device,
            )
        except LearningError as exc:
            raise AlgorithmError(f"local training failed: {exc}") from exc
        delta = update.delta.astype(np.float64)
        if delta.shape != (task["dimension"],):
            raise AlgorithmError(
                f"the model has {delta.size} parameters, the task {task['dimension']}"
            )
        norm = float(np.linalg.norm(delta))
        clip = task["clip"]
        return delta * (clip / norm) if norm > clip else delta

    def agent_charge(
        self, params: Mapping[str, Any], events: Sequence[DpEvent]
    ) -> tuple[DpEvent, ...]:
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
        self._parse(params)
        return tuple(common.strip_client_sampling(e) for e in events)


def _plan_int(plan: JobPlan, key: str) -> int:
    value = plan.details.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise AlgorithmError(f"plan.details.{key} must be an integer, got {value!r}")
    return value


def _same_sensitivity(name: str, claimed: float, actual: float) -> None:
    if not math.isclose(claimed, actual, rel_tol=1e-12):
        raise AlgorithmError(
            f"the event's {name} sensitivity {claimed:.10g} differs from the encoding's "
            f"{actual:.10g} (clip and scale)"
        )


ALGORITHM = DpFedAvg()
