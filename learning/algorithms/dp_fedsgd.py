"""DP-FedSGD: record-level DP with S local DP-SGD steps in the secure-aggregation ring.

Every participant runs the same S, C, p, σ and normaliser B (checked by
:meth:`DpFedSgd.agent_check`) and sends the exact integer sum of its noisy steps
(:mod:`~dpfl.learning.algorithms.parts.integer_dpsgd`); the coordinator's update is the mean of the
agents' local deltas. Whose noise the charge ``SelfComposedEvent(PoissonSampledEvent(p,
SkellamEvent(μ, Δ₁, Δ₂, d)), S)`` stands for is decided in
:mod:`~dpfl.learning.algorithms.parts.fedsgd_accounting`: central for S = 1, each agent's own run
otherwise. Math, modes and ring sizing: docs/algorithms.md#dp-fedsgd.
The task is :class:`DpFedSgdTask`, the
plan :class:`DpFedSgdPlan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from dpfl.accounting import (
    AccountingError,
    DpEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    compute_epsilon,
    event_to_json,
)
from dpfl.learning.algorithms.base import (
    AgentData,
    AlgorithmError,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundOutcome,
)
from dpfl.learning.algorithms.dp_fedavg import noise_total
from dpfl.learning.algorithms.model_update import (
    ModelUpdateAgent,
    ModelUpdateAlgorithm,
    ModelUpdateCoordinator,
    ModelUpdatePlan,
    ModelUpdateTask,
    initial_model_state,
    optimizer_round,
)
from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.parts.data_sizes import mean_local_size
from dpfl.learning.algorithms.parts.extractors import FeatureParams
from dpfl.learning.algorithms.parts.fedsgd_accounting import (
    CENTRAL,
    CLAIM_LABEL,
    SUM_DOMINATING,
    AccountingMode,
    accounting_mode,
    agent_event,
    agent_noise_floor,
    shares_noise,
)
from dpfl.learning.algorithms.parts.frozen_features import (
    FeaturePlanFields,
    FeatureTaskFields,
    agent_inputs,
    front_for,
    model_input_shape,
)
from dpfl.learning.algorithms.parts.integer_dpsgd import (
    integer_dp_sgd,
    required_ring_bits,
    step_event,
    step_sensitivities,
)
from dpfl.learning.algorithms.parts.server_optimizers import (
    AdaptiveServer,
    MomentumServer,
    ServerOptimizer,
    SgdServer,
)
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, ModelUpdateJob
from dpfl.mechanisms.encoding import EncodingConfig, to_ring
from dpfl.mechanisms.noise import NoiseSpec
from dpfl.secagg.prg import MAX_RING_BITS
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "ALGORITHM",
    "DpFedSgd",
    "DpFedSgdJob",
    "DpFedSgdParams",
    "DpFedSgdPlan",
    "DpFedSgdTask",
    "required_ring_bits",
    "step_event",
]

_SOURCE = "the encoding (clip C at scale 2^b, per record)"


class DpFedSgdParams(FeatureParams):
    """DP-FedSGD: ``local_steps`` DP-SGD steps, per-sample clip ``clip``.

    ``batch_sampling_rate`` p is each local record's inclusion probability per step (Poisson).
    ``expected_batch_size`` B normalises every agent's noisy gradient sum
    (θ ← θ − γ·(g + noise)/B); it is one number for all agents so that the secure sum is the sum
    of their steps (None: p × the mean local data size the coordinator derives from the job's
    data set). ``client_sampling_rate`` samples agents per round (no amplification is credited
    for it: only participants are charged). ``max_local_size`` sizes the ring: each local
    step's integer gradient sum is clamped per coordinate to what ``max_local_size`` records can
    reach, which never acts below that size and keeps the sensitivity whatever the size (a
    refusal would make the guarantee depend on the data set's size). ``features`` puts a frozen
    map φ in front of the model (docs/features.md#behind-a-trained-model).
    """

    clip: float = Field(default=1.0, gt=0)
    local_steps: int = Field(default=5, ge=1)
    batch_sampling_rate: float = Field(default=0.05, gt=0, le=1)
    learning_rate: float = Field(default=0.1, gt=0)
    expected_batch_size: float | None = Field(
        default=None,
        gt=0,
        description="null: batch_sampling_rate × the mean local data size of the job's data set",
    )
    client_sampling_rate: float = Field(default=1.0, gt=0, le=1)
    max_local_size: int = Field(default=100_000, ge=1)
    server_optimizer: ServerOptimizer | None = Field(
        default=None, description="null: FedAvg, the mean update added at rate 1"
    )

    def optimizer(self) -> SgdServer | MomentumServer | AdaptiveServer:
        """The coordinator's step on the mean model delta (default: add it, FedAvg)."""
        if self.server_optimizer is not None:
            return self.server_optimizer
        return SgdServer(kind="sgd", learning_rate=1.0)


class DpFedSgdJob(ModelUpdateJob):
    algorithm: Literal["dp-fedsgd"]
    params: DpFedSgdParams = DpFedSgdParams()
    UNITS = ("record",)
    ACCOUNTINGS = ("provable", "sum-dominating")

    @model_validator(mode="after")
    def _sum_dominating_applies(self) -> DpFedSgdJob:
        if self.privacy.accounting == "provable":
            return self
        if not self.secagg.enabled:
            raise ValueError(
                f"privacy.accounting: {self.privacy.accounting!r} needs secure aggregation "
                "(without it each agent's own noise is the only guarantee: 'provable')"
            )
        if self.params.local_steps == 1:
            raise ValueError(
                f"privacy.accounting: {self.privacy.accounting!r} means nothing with "
                "params.local_steps = 1 (one step from the global model is charged exactly "
                "on the summed noise already): use 'provable'"
            )
        return self


class DpFedSgdPlan(ModelUpdatePlan, FeaturePlanFields):
    """The plan; ``agent_noise`` (sum-dominating only) is the smallest per-agent share, and
    ``claimed_epsilon``/``claim`` the labelled figure that is not a bound."""

    model: str
    clip: float = Field(gt=0)
    local_steps: int = Field(ge=1)
    batch_sampling_rate: float = Field(gt=0, le=1)
    learning_rate: float = Field(gt=0)
    expected_batch_size: float = Field(gt=0)
    client_sampling_rate: float = Field(gt=0, le=1)
    max_local_size: int = Field(ge=1)
    accounting: Literal["provable", "sum-dominating"]
    accounting_mode: Literal["central", "local", "sum-dominating"]
    agent_noise: float | None = Field(default=None, gt=0)
    claimed_epsilon: float | None = None
    claim: str | None = None

    def shown_claim(self) -> tuple[float, str] | None:
        if self.claimed_epsilon is None or self.claim is None:
            return None
        return self.claimed_epsilon, self.claim

    def claimed_round_event(self) -> DpEvent:
        """One round: S compositions of the Poisson-subsampled step release with the plan's
        whole μ (in the sum-dominating mode: the claim, never charged)."""
        d = self
        step = step_event(
            noise=d.noise,
            total=d.noise_total,
            l1=d.l1_sensitivity,
            l2=d.l2_sensitivity,
            dimension=d.dimension,
            rate=d.batch_sampling_rate,
        )
        return SelfComposedEvent(step, d.local_steps)

    def guaranteed_round_event(self) -> DpEvent:
        """What a participant is charged for one round: :meth:`claimed_round_event`, or in the
        sum-dominating mode the same S steps of its own share ``agent_noise`` alone
        (:func:`~dpfl.learning.algorithms.parts.fedsgd_accounting.agent_event`)."""
        d = self
        (event,) = agent_event(
            (self.claimed_round_event(),),
            mode=d.accounting_mode,
            steps=d.local_steps,
            agent_noise=d.agent_noise,
        )
        return event


class DpFedSgdTask(ModelUpdateTask, FeatureTaskFields):
    """What a DP-FedSGD agent runs; its accounting ``mode`` is derived, never sent."""

    algorithm: Literal["dp-fedsgd"]
    model: str = Field(min_length=1)
    clip: float = Field(gt=0)
    local_steps: int = Field(ge=1)
    batch_sampling_rate: float = Field(gt=0, le=1)
    learning_rate: float = Field(gt=0)
    expected_batch_size: float = Field(gt=0)
    max_local_size: int = Field(ge=1)
    accounting: Literal["provable", "sum-dominating"]
    agent_noise: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _mode_allowed(self) -> DpFedSgdTask:
        try:
            mode = self.mode
        except AlgorithmError as exc:
            raise ValueError(str(exc)) from None
        if mode == SUM_DOMINATING and self.agent_noise is None:
            raise ValueError("agent_noise: a sum-dominating task must state it")
        return self

    @property
    def mode(self) -> str:
        """The accounting mode (:mod:`~dpfl.learning.algorithms.parts.fedsgd_accounting`)."""
        return accounting_mode(
            accounting=self.accounting,
            local_steps=self.local_steps,
            secure_aggregation=self.secure_aggregation,
        )


class DpFedSgdCoordinator(ModelUpdateCoordinator[DpFedSgdJob, DpFedSgdPlan, DpFedSgdTask]):
    """DP-FedSGD's coordinator side."""

    unit = "record"

    def initial_state(self, data: CoordinatorData) -> CoordinatorState:
        front = front_for(self.details.features, data)
        return initial_model_state(
            self.spec, data, algorithm=self.name, dimension=self.details.dimension, front=front
        )

    def _sampling_rate(self) -> float:
        return self.spec.params.client_sampling_rate

    def _clip(self) -> float:
        return self.details.clip

    def _credits_others(self) -> bool:
        return self.details.accounting_mode == CENTRAL

    def _task(self, common: ModelUpdateTask) -> DpFedSgdTask:
        spec, d = self.spec, self.details
        return DpFedSgdTask(
            **common.model_dump(),
            model=spec.model,
            features=d.features,
            clip=d.clip,
            local_steps=d.local_steps,
            batch_sampling_rate=d.batch_sampling_rate,
            learning_rate=d.learning_rate,
            expected_batch_size=d.expected_batch_size,
            max_local_size=d.max_local_size,
            accounting=spec.privacy.accounting,
            agent_noise=d.agent_noise if d.accounting_mode == SUM_DOMINATING else None,
        )

    def ring(self, *, participants: int, min_survivors: int) -> EncodingConfig:
        """Clip C per record, scale 2^b, the agent's per-step noise share, and a ring wide
        enough for the S steps of ``participants`` agents of at most M_max records.

        The share is split over the honest agents in the central and sum-dominating modes
        (``common.per_agent_noise``; sum-dominating: never below the plan's ``agent_noise``,
        which the agent's own ledger records), and the whole step noise in the local mode."""
        d = self.details
        noise = common.split_noise(
            d,
            dropout_fraction=self.spec.secagg.dropout_fraction,
            participants=participants,
            min_survivors=min_survivors,
            secure_aggregation=shares_noise(d.accounting_mode),
        )
        if d.agent_noise is not None and noise.parameter < d.agent_noise:
            noise = NoiseSpec(noise.kind, d.agent_noise)  # more participants than planned
        probe = EncodingConfig(
            clip=d.clip, scale_bits=d.scale_bits, ring_bits=64, noise=noise, rounding_beta=0.0
        )
        bits = required_ring_bits(
            participants=participants,
            steps=d.local_steps,
            max_local_size=d.max_local_size,
            config=probe,
        )
        if bits > MAX_RING_BITS:
            raise AlgorithmError(
                f"{participants} agents × {d.local_steps} steps × {d.max_local_size} "
                f"records at scale 2^{d.scale_bits} need a {bits}-bit ring (> 64)"
            )
        return EncodingConfig(
            clip=d.clip, scale_bits=d.scale_bits, ring_bits=bits, noise=noise, rounding_beta=0.0
        )

    def round_event(self, *, population: int = 0) -> DpEvent:
        """What a committed round charges each participant:
        :meth:`DpFedSgdPlan.guaranteed_round_event` (a record is only touched when its agent
        takes part, so nobody else pays)."""
        return self.details.guaranteed_round_event()

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
        total = common.checked_aggregate(aggregate, length=d.dimension, survivors=survivors)
        scale = -d.learning_rate / (d.expected_batch_size * survivors)
        return optimizer_round(
            spec,
            state,
            data,
            update=scale * total,  # the mean of the agents' local model deltas
            optimizer=spec.params.optimizer(),
            algorithm=self.name,
            round_number=round_number,
            survivors=survivors,
        )

    # -- agent side --------------------------------------------------------------------------


class DpFedSgdAgent(ModelUpdateAgent[DpFedSgdTask]):
    """DP-FedSGD's agent side: S integer DP-SGD steps, and the checks of their claim."""

    def check(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> float:
        """Refuse unless the claim is exactly S steps of this task's release and the noise
        delivers it.

        Checks: the setup's honest fraction is the task's, ``1 ≤ min_survivors ≤ num_clients``;
        the encoding's clip and scale are the task's C and b; one event
        ``SelfComposedEvent(step, S)`` whose step is Poisson-subsampled at the task's p (bare
        when p = 1), with the encoding's rounded sensitivities for d coordinates; the per-agent
        per-step noise of the encoding reaches the step's noise summed over ``t·min_survivors``
        honest agents in the central mode, and ALONE in the local and sum-dominating modes (so a
        task with S > 1 whose claimed event rests on split noise is refused: the sum-dominating
        figure is a claim, never the charged event); in the sum-dominating mode it also
        reaches, alone, the ``agent_noise`` this agent's own ledger records; the ring holds S
        steps of ``num_clients`` agents of M_max records.
        """
        t = self.task
        counts = common.Counts(
            num_clients=num_clients, min_survivors=min_survivors, honest_fraction=honest_fraction
        )
        event = self._claimed(events, encoding, counts, clip=t.clip)
        l1, l2 = step_sensitivities(clip=t.clip, scale_bits=t.scale_bits, dimension=t.dimension)
        step = self._claimed_step(event)
        total = common.claimed_total(
            step, noise=t.noise, l1=l1, l2=l2, dimension=t.dimension, source=_SOURCE
        )
        fraction = self._check_step_noise(encoding, total, honest_fraction, min_survivors)
        need = required_ring_bits(
            participants=num_clients,
            steps=t.local_steps,
            max_local_size=t.max_local_size,
            config=encoding,
        )
        if need > encoding.ring_bits:
            raise AlgorithmError(
                f"the ring would wrap: {num_clients} agents need {need} bits, the encoding has "
                f"{encoding.ring_bits}"
            )
        return fraction

    def _claimed_step(self, event: DpEvent) -> DpEvent:
        """The one step's release of a claim of S steps, outside its record sampling (which
        must be the task's)."""
        t = self.task
        if not isinstance(event, SelfComposedEvent) or event.count != t.local_steps:
            raise AlgorithmError(
                f"expected {t.local_steps} compositions of one step, got {event!r}"
            )
        step = event.event
        if isinstance(step, PoissonSampledEvent):
            if step.sampling_rate != t.batch_sampling_rate:
                raise AlgorithmError(
                    f"the event samples records at rate {step.sampling_rate:g}, the task at "
                    f"{t.batch_sampling_rate:g}"
                )
            return step.event
        if t.batch_sampling_rate < 1.0:
            raise AlgorithmError("the task samples records but the event does not say so")
        return step

    def _check_step_noise(
        self, encoding: EncodingConfig, total: float, honest_fraction: float, min_survivors: int
    ) -> float:
        """The per-step noise share carries ``total``: over the honest survivors in the central
        mode, alone otherwise; in the sum-dominating mode also the ``agent_noise`` the agent's
        own ledger records."""
        t, mode = self.task, self.task.mode
        check = partial(
            common.check_noise,
            encoding.noise,
            kind=common.NOISE_KINDS[t.noise],
            honest_fraction=honest_fraction,
            min_survivors=min_survivors,
        )
        try:
            fraction = check(total=total, secure_aggregation=mode == CENTRAL)
        except AlgorithmError as exc:
            if mode == CENTRAL or not t.secure_aggregation:
                raise
            raise AlgorithmError(
                f"{t.local_steps} local steps are accounted as local DP "
                f"(privacy.accounting: {t.accounting}): this agent's own noise must carry "
                f"the claimed event alone, but the encoding only gives it a share ({exc})"
            ) from exc
        if t.agent_noise is not None and mode == SUM_DOMINATING:
            # the charge is then the local-DP event of agent_noise, which the share carries alone
            return check(total=t.agent_noise, secure_aggregation=False)
        return fraction

    def charge(self, events: Sequence[DpEvent]) -> tuple[DpEvent, ...]:
        """The claimed event, or, when the job opted in to the sum-dominating accounting, the
        local-DP event of this agent's own noise share (``agent_noise``, checked against the
        round's encoding by :meth:`check`; the coordinator announces the same event):
        what this agent's view proves
        (:func:`~dpfl.learning.algorithms.parts.fedsgd_accounting.agent_event`). The record sampling
        is the agent's own, so the amplification stays.

        Raises:
            AlgorithmError: not one S-fold step event.
        """
        t = self.task
        return agent_event(events, mode=t.mode, steps=t.local_steps, agent_noise=t.agent_noise)

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
        """S integer DP-SGD steps from the global model; ``Z_i`` in the ring (module docs)."""
        t = self.task
        if model is None:
            raise AlgorithmError(f"{self.name} needs the global model")
        if encoding.clip != t.clip or encoding.scale_bits != t.scale_bits:
            raise AlgorithmError("the encoding's clip or scale differs from the task's")
        from dpfl.learning.params import model_from_bytes

        x, shape, model = agent_inputs(t, data, model)
        net = common.build_model(t.model, shape, data.num_classes, seed=0)
        try:
            model_from_bytes(model, model=net)
        except LearningError as exc:
            raise AlgorithmError(f"the global model does not load: {exc}") from exc
        result = integer_dp_sgd(
            net,
            x,
            data.y,
            steps=t.local_steps,
            sampling_rate=t.batch_sampling_rate,
            clip=t.clip,
            learning_rate=t.learning_rate,
            normalizer=t.expected_batch_size,
            scale_bits=t.scale_bits,
            noise=encoding.noise,
            stream=stream,
            device=device,
            coordinate_limit=t.max_local_size * encoding.coordinate_bound,
        )
        if result.total.shape != (t.dimension,):
            raise AlgorithmError(
                f"the model has {result.total.size} parameters, the task {t.dimension}"
            )
        return to_ring(result.total, encoding.ring_bits)


class DpFedSgd(ModelUpdateAlgorithm[DpFedSgdJob, DpFedSgdPlan, DpFedSgdTask]):
    """DP-FedSGD; see the module docstring.

    Args:
        random_source: the CSPRNG of client sampling (default: the system CSPRNG).
    """

    name: ClassVar[str] = "dp-fedsgd"
    spec_type = DpFedSgdJob
    plan_type = DpFedSgdPlan
    task_type = DpFedSgdTask
    model_direction = -1.0  # the model steps against the summed gradients
    coordinator_type = DpFedSgdCoordinator
    agent_type = DpFedSgdAgent
    #: One rounding per step costs √d over c (docs/accounting.md#dp-fedsgd-one-rounding-per-step);
    #: keeping that within 0.1 % would need b with μ ∝ 4^b so large that the exact Poisson
    #: sampler's rare exact fallback takes seconds per call (docs/mechanisms.md#integer-noise).
    scale_inflation: ClassVar[float] = 1e-2

    @staticmethod
    def _mode(job: DpFedSgdJob) -> AccountingMode:
        """The job's accounting mode (:mod:`~dpfl.learning.algorithms.parts.fedsgd_accounting`)."""
        return accounting_mode(
            accounting=job.privacy.accounting,
            local_steps=job.params.local_steps,
            secure_aggregation=job.secagg.enabled,
        )

    # -- coordinator side --------------------------------------------------------------------

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self.narrow_for_plan(job, population)
        p, privacy = spec.params, spec.privacy
        shape, classes = common.data_shape(spec, data)
        features = p.feature_spec()
        shape, width = model_input_shape(features, shape, spec.model)
        dimension = common.model_dimension(spec.model, shape, classes)
        normalizer = p.expected_batch_size
        if normalizer is None:
            normalizer = p.batch_sampling_rate * mean_local_size(spec, population)
        mode = self._mode(spec)

        def make(bits: int) -> JobPlan:
            l1, l2 = step_sensitivities(clip=p.clip, scale_bits=bits, dimension=dimension)

            def job_event(z: float) -> DpEvent:
                step = step_event(
                    noise=privacy.noise,
                    total=noise_total(privacy.noise, z, l2),
                    l1=l1,
                    l2=l2,
                    dimension=dimension,
                    rate=p.batch_sampling_rate,
                )
                per_round = SelfComposedEvent(step, p.local_steps)
                return per_round if spec.rounds == 1 else SelfComposedEvent(per_round, spec.rounds)

            z, record = common.calibrate(job_event, privacy)
            total = noise_total(privacy.noise, z, l2)
            record["expected_batch_size_rule"] = (
                "given"
                if p.expected_batch_size is not None
                else "p x mean local size of the data spec"
            )
            agent_noise = None
            if mode == SUM_DOMINATING:
                agent_noise = agent_noise_floor(
                    kind=common.NOISE_KINDS[privacy.noise],
                    total=total,
                    honest_fraction=privacy.honest_fraction,
                    population=population,
                    dropout_fraction=spec.secagg.dropout_fraction,
                )
            details = DpFedSgdPlan(
                model=spec.model,
                features=features,
                feature_dim=width,
                dimension=dimension,
                scale_bits=bits,
                l1_sensitivity=l1,
                l2_sensitivity=l2,
                noise=privacy.noise,
                noise_total=total,
                accounting=privacy.accounting,
                accounting_mode=mode,
                agent_noise=agent_noise,
                clip=p.clip,
                local_steps=p.local_steps,
                batch_sampling_rate=p.batch_sampling_rate,
                learning_rate=p.learning_rate,
                expected_batch_size=normalizer,
                client_sampling_rate=p.client_sampling_rate,
                max_local_size=p.max_local_size,
                secure_aggregation=spec.secagg.enabled,
                honest_fraction=privacy.honest_fraction,
                corrupt_fraction=spec.secagg.corrupt_fraction,
            )
            return JobPlan(z, record, population, details)

        bits = spec.secagg.scale_bits
        if bits is None:
            bits = common.choose_scale_bits(
                clip=p.clip, dimension=dimension, inflation=self.scale_inflation, rounding_beta=0.0
            )
        plan = self._fit_scale(spec, population, bits, make)
        return self._with_claim_apart(spec, plan) if mode == SUM_DOMINATING else plan

    def _with_claim_apart(self, job: DpFedSgdJob, plan: JobPlan) -> JobPlan:
        """The sum-dominating plan: the calibration record's ε, event and method become the
        guaranteed ones (each agent's own share, :meth:`DpFedSgdPlan.guaranteed_round_event`,
        over all rounds), and the calibrated sum-dominating figure moves to
        ``calibration["claim"]`` and the plan's ``claimed_epsilon`` under :data:`CLAIM_LABEL`:
        shown, never charged."""
        record = dict(plan.calibration)
        details = self.bind(job, plan).details
        per_round = details.guaranteed_round_event()
        whole = per_round if job.rounds == 1 else SelfComposedEvent(per_round, job.rounds)
        try:
            report = compute_epsilon(whole, delta=job.privacy.delta, tight=True)
        except AccountingError as exc:
            raise AlgorithmError(f"the guaranteed ε cannot be computed: {exc}") from exc
        claim = {key: record[key] for key in ("epsilon", "method", "event")}
        record["claim"] = {"label": CLAIM_LABEL, **claim}
        record.update(
            epsilon=report.epsilon,
            method=report.method,
            order=report.order,
            rdp_epsilon=report.rdp_epsilon,
            tight_epsilon=report.tight_epsilon,
            event=event_to_json(whole),
        )
        details = details.model_copy(
            update={"claimed_epsilon": float(record["claim"]["epsilon"]), "claim": CLAIM_LABEL}
        )
        return JobPlan(plan.noise_multiplier, record, plan.population, details)


ALGORITHM = DpFedSgd()
