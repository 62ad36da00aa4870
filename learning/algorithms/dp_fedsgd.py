"""DP-FedSGD: record-level DP with S local DP-SGD steps in the secure-aggregation ring.

Every participant runs the same S, C, p, σ and normaliser B (checked by
:meth:`DpFedSgd.agent_check`) and sends the exact integer sum of its noisy steps
(:mod:`~dpfl.learning.algorithms.integer_dpsgd`); the coordinator's update is the mean of the
agents' local deltas. Whose noise the charge ``SelfComposedEvent(PoissonSampledEvent(p,
SkellamEvent(μ, Δ₁, Δ₂, d)), S)`` stands for is decided in
:mod:`~dpfl.learning.algorithms.fedsgd_accounting`: central for S = 1, each agent's own run
otherwise. Math, modes and ring sizing: docs/algorithms.md#dp-fedsgd.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from dpfl.accounting import (
    AccountingError,
    DpEvent,
    SelfComposedEvent,
    compute_epsilon,
    event_to_json,
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
from dpfl.learning.algorithms.federation import mean_local_size
from dpfl.learning.algorithms.fedsgd_accounting import (
    CENTRAL,
    CLAIM_LABEL,
    SUM_DOMINATING,
    accounting_mode,
    agent_event,
    agent_noise_floor,
    shares_noise,
)
from dpfl.learning.algorithms.fedsgd_agent import check_claim, parse_task
from dpfl.learning.algorithms.integer_dpsgd import integer_dp_sgd, required_ring_bits, step_event
from dpfl.learning.algorithms.model_state import initial_model_state, load_model, stepped_model
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import DpFedSgdJob, JobSpec
from dpfl.secagg.encoding import EncodingConfig, to_ring
from dpfl.secagg.noise import NoiseSpec
from dpfl.secagg.prg import MAX_RING_BITS
from dpfl.secagg.randomness import RandomSource, RandomStream, SystemRandomSource

__all__ = ["ALGORITHM", "DpFedSgd", "required_ring_bits", "step_event"]


def _noise_total(noise: str, z: float, l2: float) -> float:
    """μ with √(2μ) = z·Δ₂ (Skellam), or σ = z·Δ₂ (discrete Gaussian), per step."""
    return (z * l2) ** 2 / 2.0 if noise == "skellam" else z * l2


class DpFedSgd(Algorithm):
    """DP-FedSGD; see the module docstring.

    Args:
        random_source: the CSPRNG of client sampling (default: the system CSPRNG).
    """

    name: ClassVar[str] = "dp-fedsgd"

    def __init__(self, *, random_source: RandomSource | None = None) -> None:
        self._random = random_source if random_source is not None else SystemRandomSource()

    def with_random_source(self, source: RandomSource) -> Algorithm:
        """A copy whose client sampling draws from ``source``."""
        return type(self)(random_source=source)

    def _job(self, job: JobSpec) -> DpFedSgdJob:
        if not isinstance(job, DpFedSgdJob):
            raise AlgorithmError(f"{self.name} cannot run a {type(job).__name__}")
        return job

    @staticmethod
    def _mode(job: DpFedSgdJob) -> str:
        """The job's accounting mode (:mod:`~dpfl.learning.algorithms.fedsgd_accounting`)."""
        return accounting_mode(
            accounting=job.privacy.accounting,
            local_steps=job.params.local_steps,
            secure_aggregation=job.secagg.enabled,
        )

    # -- coordinator side --------------------------------------------------------------------

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self._job(job)
        if isinstance(population, bool) or not isinstance(population, int) or population < 1:
            raise AlgorithmError(f"population must be an integer >= 1, got {population!r}")
        p, privacy = spec.params, spec.privacy
        shape, classes = common.data_shape(spec, data)
        dimension = common.model_dimension(spec.model, shape, classes)
        normalizer = p.expected_batch_size
        if normalizer is None:
            normalizer = p.batch_sampling_rate * mean_local_size(spec, population)
        given_bits = spec.secagg.scale_bits
        bits = (
            given_bits
            if given_bits is not None
            else common.choose_scale_bits(clip=p.clip, dimension=dimension)
        )
        while True:
            probe = EncodingConfig(clip=p.clip, scale_bits=bits, ring_bits=64)
            l1, l2 = probe.rounded_l1_bound(dimension), probe.rounded_l2_bound(dimension)

            def job_event(z: float, l1: float = l1, l2: float = l2) -> DpEvent:
                step = step_event(
                    noise=privacy.noise,
                    total=_noise_total(privacy.noise, z, l2),
                    l1=l1,
                    l2=l2,
                    dimension=dimension,
                    rate=p.batch_sampling_rate,
                )
                per_round = SelfComposedEvent(step, p.local_steps)
                return per_round if spec.rounds == 1 else SelfComposedEvent(per_round, spec.rounds)

            z, record = common.calibrate_or_check(
                job_event,
                given=privacy.noise_multiplier,
                target_epsilon=privacy.target_epsilon,
                delta=privacy.delta,
            )
            mode = self._mode(spec)
            total = _noise_total(privacy.noise, z, l2)
            details: dict[str, Any] = {
                "model": spec.model,
                "dimension": dimension,
                "scale_bits": bits,
                "l1_sensitivity": l1,
                "l2_sensitivity": l2,
                "noise": privacy.noise,
                "noise_total": total,
                "accounting": privacy.accounting,
                "accounting_mode": mode,
                "agent_noise": (
                    agent_noise_floor(
                        kind=common.NOISE_KINDS[privacy.noise],
                        total=total,
                        honest_fraction=privacy.honest_fraction,
                        population=population,
                        dropout_fraction=spec.secagg.dropout_fraction,
                    )
                    if mode == SUM_DOMINATING
                    else None
                ),
                "clip": p.clip,
                "local_steps": p.local_steps,
                "batch_sampling_rate": p.batch_sampling_rate,
                "learning_rate": p.learning_rate,
                "expected_batch_size": normalizer,
                "client_sampling_rate": p.client_sampling_rate,
                "max_local_size": p.max_local_size,
                "secure_aggregation": spec.secagg.enabled,
                "honest_fraction": privacy.honest_fraction,
                "corrupt_fraction": spec.secagg.corrupt_fraction,
            }
            plan = JobPlan(
                noise_multiplier=z, calibration=record, population=population, details=details
            )
            try:
                survivors = max(1, math.ceil(population * (1.0 - spec.secagg.dropout_fraction)))
                task = RoundTask(params={}, vector_length=dimension)
                self.encoding(spec, plan, task, participants=population, min_survivors=survivors)
                break
            except AlgorithmError:
                if given_bits is not None or bits == 0:
                    raise
                bits -= 1
        record["scale_bits_rule"] = "given" if given_bits is not None else "inflation<=0.1%"
        record["expected_batch_size_rule"] = (
            "given" if p.expected_batch_size is not None else "p x mean local size of the data spec"
        )
        if mode == SUM_DOMINATING:
            return self._with_claim_apart(spec, plan)
        return plan

    def _with_claim_apart(self, job: DpFedSgdJob, plan: JobPlan) -> JobPlan:
        """The sum-dominating plan: the calibration record's ε, event and method become the
        guaranteed ones (each agent's own share, :meth:`guaranteed_round_event`, over all
        rounds), and the calibrated sum-dominating figure moves to ``calibration["claim"]`` and
        ``details["claimed_epsilon"]`` under :data:`CLAIM_LABEL`: shown, never charged."""
        record = dict(plan.calibration)
        per_round = self.guaranteed_round_event(plan)
        whole = per_round if job.rounds == 1 else SelfComposedEvent(per_round, job.rounds)
        try:
            report = compute_epsilon(whole, delta=job.privacy.delta, tight=True)
        except AccountingError as exc:
            raise AlgorithmError(f"the guaranteed ε cannot be computed: {exc}") from exc
        record["claim"] = {
            "label": CLAIM_LABEL,
            "epsilon": record["epsilon"],
            "method": record["method"],
            "event": record["event"],
        }
        record.update(
            epsilon=report.epsilon,
            method=report.method,
            order=report.order,
            rdp_epsilon=report.rdp_epsilon,
            tight_epsilon=report.tight_epsilon,
            event=event_to_json(whole),
        )
        details = {
            **plan.details,
            "claimed_epsilon": record["claim"]["epsilon"],
            "claim": CLAIM_LABEL,
        }
        return JobPlan(
            noise_multiplier=plan.noise_multiplier,
            calibration=record,
            population=plan.population,
            details=details,
        )

    def initial_state(self, job: JobSpec, plan: JobPlan, data: CoordinatorData) -> CoordinatorState:
        spec = self._job(job)
        dimension = int(plan.details["dimension"])
        return initial_model_state(spec, data, algorithm=self.name, dimension=dimension)

    def select(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> list[str]:
        spec = self._job(job)
        stream = self._random.stream(f"{self.name}/select/{spec.name}/{round_number}")
        return common.poisson_sample(population, spec.params.client_sampling_rate, stream)

    def round_task(
        self, job: JobSpec, plan: JobPlan, state: CoordinatorState, *, round_number: int
    ) -> RoundTask:
        spec = self._job(job)
        d = plan.details
        params = {
            "algorithm": self.name,
            "job": spec.name,
            "round": round_number,
            "model": spec.model,
            "clip": d["clip"],
            "local_steps": d["local_steps"],
            "batch_sampling_rate": d["batch_sampling_rate"],
            "learning_rate": d["learning_rate"],
            "expected_batch_size": d["expected_batch_size"],
            "max_local_size": d["max_local_size"],
            "dimension": d["dimension"],
            "scale_bits": d["scale_bits"],
            "noise": d["noise"],
            "noise_total": d["noise_total"],
            "noise_multiplier": plan.noise_multiplier,
            "secure_aggregation": d["secure_aggregation"],
            "honest_fraction": d["honest_fraction"],
            "unit": "record",
            "delta": spec.privacy.delta,
            "accounting": spec.privacy.accounting,
        }
        if self._mode(spec) == SUM_DOMINATING:
            params["agent_noise"] = d["agent_noise"]
        return RoundTask(
            params=params, vector_length=int(d["dimension"]), model_version=state.model_version
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
        """Clip C per record, scale 2^b, the agent's per-step noise share, and a ring wide
        enough for the S steps of ``participants`` agents of at most M_max records.

        The share is split over the honest agents in the central and sum-dominating modes
        (``common.per_agent_noise``; sum-dominating: never below the plan's ``agent_noise``,
        which the agent's own ledger records), and the whole step noise in the local mode."""
        spec = self._job(job)
        mode = self._mode(spec)
        d = plan.details
        if task.vector_length != int(d["dimension"]):
            raise AlgorithmError("the task's vector length differs from the plan's dimension")
        if not 1 <= min_survivors <= participants:
            raise AlgorithmError(
                f"min_survivors {min_survivors} must lie in [1, participants={participants}]"
            )
        kind = common.NOISE_KINDS[str(d["noise"])]
        noise = common.per_agent_noise(
            kind=kind,
            total=float(d["noise_total"]),
            secure_aggregation=shares_noise(mode),
            honest_fraction=float(d["honest_fraction"]),
            min_survivors=min_survivors,
            participants=participants,
            dropout_fraction=spec.secagg.dropout_fraction,
        )
        if mode == SUM_DOMINATING and noise.parameter < float(d["agent_noise"]):
            noise = NoiseSpec(kind, float(d["agent_noise"]))  # more participants than planned
        probe = EncodingConfig(
            clip=float(d["clip"]), scale_bits=int(d["scale_bits"]), ring_bits=64, noise=noise
        )
        bits = required_ring_bits(
            participants=participants,
            steps=int(d["local_steps"]),
            max_local_size=int(d["max_local_size"]),
            config=probe,
        )
        if bits > MAX_RING_BITS:
            raise AlgorithmError(
                f"{participants} agents × {d['local_steps']} steps × {d['max_local_size']} "
                f"records at scale 2^{d['scale_bits']} need a {bits}-bit ring (> 64)"
            )
        return EncodingConfig(
            clip=probe.clip, scale_bits=probe.scale_bits, ring_bits=bits, noise=noise
        )

    def round_event(self, plan: JobPlan) -> DpEvent:
        """One round: S compositions of the Poisson-subsampled step release with the plan's
        whole μ (in the sum-dominating mode: the claim, never charged)."""
        d = plan.details
        step = step_event(
            noise=str(d["noise"]),
            total=float(d["noise_total"]),
            l1=float(d["l1_sensitivity"]),
            l2=float(d["l2_sensitivity"]),
            dimension=int(d["dimension"]),
            rate=float(d["batch_sampling_rate"]),
        )
        return SelfComposedEvent(step, int(d["local_steps"]))

    def guaranteed_round_event(self, plan: JobPlan) -> DpEvent:
        """What a participant is charged for one round: :meth:`round_event`, or in the
        sum-dominating mode the same S steps of its own share ``agent_noise`` alone
        (:func:`~dpfl.learning.algorithms.fedsgd_accounting.agent_event`)."""
        d = plan.details
        agent_noise = d.get("agent_noise")
        (event,) = agent_event(
            (self.round_event(plan),),
            mode=str(d["accounting_mode"]),
            steps=int(d["local_steps"]),
            agent_noise=None if agent_noise is None else float(agent_noise),
        )
        return event

    def invitation_events(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> tuple[DpEvent, ...]:
        self._job(job)
        return (self.guaranteed_round_event(plan),)

    def charges(
        self,
        job: JobSpec,
        plan: JobPlan,
        *,
        round_number: int,
        population: Sequence[str],
        participants: Sequence[str],
    ) -> dict[str, ClientCharge]:
        """Each participant pays the round's event; a record is only touched when its agent
        takes part, so nobody else pays.

        ``secure_aggregation`` says whether masking was applied; ``honest_fraction`` is the t
        the event relies on (1 in the local and sum-dominating modes: no other agent's noise is
        credited); ``approximate`` marks the Gaussian option only. Under the sum-dominating
        opt-in the event is the guaranteed one (:meth:`guaranteed_round_event`), never the
        claim."""
        spec = self._job(job)
        mode = self._mode(spec)
        charge = ClientCharge(
            event=self.guaranteed_round_event(plan),
            unit="record",
            approximate=plan.details["noise"] == "gaussian",
            secure_aggregation=spec.secagg.enabled,
            honest_fraction=spec.privacy.honest_fraction if mode == CENTRAL else 1.0,
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
        total = np.asarray(aggregate, dtype=np.float64)
        dimension = int(plan.details["dimension"])
        if total.shape != (dimension,):
            raise AlgorithmError(f"aggregate of shape {total.shape}, expected ({dimension},)")
        if not np.isfinite(total).all() or survivors < 1:
            raise AlgorithmError("aggregate contains NaN or infinity, or nobody contributed")
        net = load_model(spec, state, data)
        step = -float(plan.details["learning_rate"]) / (
            float(plan.details["expected_batch_size"]) * survivors
        )
        model, evaluation = stepped_model(spec, net, step * total, data, algorithm=self.name)
        metrics: dict[str, float] = {
            "survivors": float(survivors),
            "update_norm": float(abs(step) * np.linalg.norm(total)),
            **evaluation,
        }
        return RoundOutcome(
            state=CoordinatorState(
                model=model,
                model_version=state.model_version + 1,
                details={"round": round_number},
            ),
            metrics=metrics,
            done=round_number >= spec.rounds,
        )

    # -- agent side --------------------------------------------------------------------------

    def _parse(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return parse_task(params, algorithm=self.name)

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
        """Refuse unless the claim is exactly S steps of this task's release and the noise
        delivers it in the task's accounting mode
        (:func:`~dpfl.learning.algorithms.fedsgd_agent.check_claim` lists the checks)."""
        check_claim(
            self._parse(params),
            events,
            encoding,
            num_clients=num_clients,
            min_survivors=min_survivors,
            honest_fraction=honest_fraction,
        )

    def agent_charge(
        self, params: Mapping[str, Any], events: Sequence[DpEvent]
    ) -> tuple[DpEvent, ...]:
        """The claimed event, or, when the job opted in to the sum-dominating accounting, the
        local-DP event of this agent's own noise share (``params.agent_noise``, checked against
        the round's encoding by :meth:`agent_check`; the coordinator announces the same event):
        what this agent's view proves
        (:func:`~dpfl.learning.algorithms.fedsgd_accounting.agent_event`). The record sampling
        is the agent's own, so the amplification stays.

        Raises:
            AlgorithmError: malformed params, or not one S-fold step event.
        """
        task = self._parse(params)
        return agent_event(
            events, mode=task["mode"], steps=task["local_steps"], agent_noise=task["agent_noise"]
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
        """S integer DP-SGD steps from the global model; ``Z_i`` in the ring (module docs)."""
        task = self._parse(params)
        if model is None:
            raise AlgorithmError(f"{self.name} needs the global model")
        if encoding.clip != task["clip"] or encoding.scale_bits != task["scale_bits"]:
            raise AlgorithmError("the encoding's clip or scale differs from the task's")
        from dpfl.learning.params import model_from_bytes

        net = common.build_model(task["model"], data.input_shape, data.num_classes, seed=0)
        try:
            model_from_bytes(model, model=net)
        except LearningError as exc:
            raise AlgorithmError(f"the global model does not load: {exc}") from exc
        result = integer_dp_sgd(
            net,
            data.x,
            data.y,
            steps=task["local_steps"],
            sampling_rate=task["batch_sampling_rate"],
            clip=task["clip"],
            learning_rate=task["learning_rate"],
            normalizer=task["expected_batch_size"],
            scale_bits=task["scale_bits"],
            rounding_bound=encoding.rounded_l2_bound(task["dimension"]),
            noise=encoding.noise,
            stream=stream,
            device=device,
            coordinate_limit=task["max_local_size"] * encoding.coordinate_bound,
        )
        if result.total.shape != (task["dimension"],):
            raise AlgorithmError(
                f"the model has {result.total.size} parameters, the task {task['dimension']}"
            )
        return to_ring(result.total, encoding.ring_bits)


ALGORITHM = DpFedSgd()
