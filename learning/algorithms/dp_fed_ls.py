"""DP-Fed-LS: DP-FedAvg plus Laplacian smoothing of the noisy aggregate on the coordinator.

Smoothing (:mod:`~dpfl.learning.algorithms.parts.smoothing`) is post-processing, so privacy is
DP-FedAvg's; ``client_sampling: uniform`` draws a fixed-size sample and charges the replace-one
``SampledWithoutReplacementEvent`` instead. The paper's closed-form noise bound is reported beside
the exact calibration, never charged. Details: docs/algorithms.md#dp-fed-ls.
The task is :class:`DpFedLsTask` (DP-FedAvg's plus the sampling and smoothing), the plan
:class:`DpFedLsPlan`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from dpfl.accounting import (
    AccountingError,
    DpEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    compute_epsilon,
    fedls_noise_multiplier,
)
from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData, JobPlan
from dpfl.learning.algorithms.dp_fedavg import (
    DpFedAvgParams,
    FedAvgAgent,
    FedAvgCoordinator,
    FedAvgFamily,
    FedAvgJobBase,
    FedAvgPlanBase,
    FedAvgTaskBase,
    mechanism_event,
    noise_total,
)
from dpfl.learning.algorithms.parts.smoothing import smooth_pieces
from dpfl.learning.jobs import JobSpec
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "ALGORITHM",
    "DpFedLs",
    "DpFedLsAgent",
    "DpFedLsCoordinator",
    "DpFedLsJob",
    "DpFedLsParams",
    "DpFedLsPlan",
    "DpFedLsTask",
    "sample_size",
    "uniform_sample",
]


class DpFedLsParams(DpFedAvgParams):
    """DP-Fed-LS: DP-FedAvg plus Laplacian smoothing with ``sigma_ls``."""

    sigma_ls: float = Field(default=1.0, ge=0)
    client_sampling: Literal["poisson", "uniform"] = "poisson"
    smoothing_scope: Literal["tensor", "vector"] = "tensor"


class DpFedLsJob(FedAvgJobBase):
    algorithm: Literal["dp-fed-ls"]
    params: DpFedLsParams = DpFedLsParams()


class DpFedLsPlan(FedAvgPlanBase):
    """DP-FedAvg's plan plus the sampling and the smoothing (``sample_size``: uniform only)."""

    client_sampling: Literal["poisson", "uniform"]
    sigma_ls: float = Field(ge=0)
    smoothing_scope: Literal["tensor", "vector"]
    sample_size: int | None = Field(default=None, ge=1)

    def round_event(self, population: int) -> DpEvent:
        """Under uniform sampling, ``SampledWithoutReplacementEvent(n, m, ·)`` with replace-one
        sensitivities 2Δ (docs/accounting.md); DP-FedAvg's event otherwise."""
        if self.client_sampling != "uniform" or self.sample_size is None:
            return super().round_event(population)
        inner = mechanism_event(
            noise=self.noise,
            total=self.noise_total,
            l1=REPLACE_ONE * self.l1_sensitivity,
            l2=REPLACE_ONE * self.l2_sensitivity,
            dimension=self.dimension,
        )
        if self.secure_aggregation and self.sample_size < population:
            return SampledWithoutReplacementEvent(population, self.sample_size, inner)
        return inner


class DpFedLsTask(FedAvgTaskBase):
    """DP-FedAvg's task plus the sampling and the smoothing (``sample_size``: uniform only)."""

    algorithm: Literal["dp-fed-ls"]
    client_sampling: Literal["poisson", "uniform"]
    sigma_ls: float = Field(ge=0)
    smoothing_scope: Literal["tensor", "vector"]
    sample_size: int | None = Field(default=None, ge=1)

    def claimed_release(self, event: DpEvent) -> tuple[DpEvent, float]:
        """Under uniform sampling, exactly the fixed-size wrapper at this task's sample size
        (or the bare release), with replace-one sensitivities; DP-FedAvg's check otherwise."""
        if self.client_sampling != "uniform":
            return super().claimed_release(event)
        if self.sample_size is None:
            raise AlgorithmError("params.sample_size: a uniform sample states its size")
        if isinstance(event, PoissonSampledEvent):
            raise AlgorithmError("the task samples a fixed number of clients, not Poisson")
        if isinstance(event, SampledWithoutReplacementEvent):
            if not self.secure_aggregation or event.sample_size != self.sample_size:
                raise AlgorithmError(
                    f"the event claims {event.sample_size} of {event.population} clients "
                    f"sampled; the task samples {self.sample_size} "
                    f"{'with' if self.secure_aggregation else 'without'} secure aggregation"
                )
            return event.event, REPLACE_ONE
        # no amplification claimed: the bare release (replace-one) is never below the truth
        return event, REPLACE_ONE


#: The replace-one sensitivity of fixed-size sampling is twice the add/remove one.
REPLACE_ONE = 2.0


def sample_size(rate: float, population: int) -> int:
    """m = max(1, round(q·n)) clients of a uniform (fixed-size) sample."""
    return max(1, round(rate * population))


def uniform_sample(population: Sequence[str], size: int, stream: RandomStream) -> list[str]:
    """Exactly ``min(size, n)`` members, uniformly without replacement (CSPRNG Fisher–Yates).

    Raises:
        AlgorithmError: a size below 1.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise AlgorithmError(f"sample size must be an integer >= 1, got {size!r}")
    members = list(population)
    take = min(size, len(members))
    for i in range(take):
        j = i + stream.randbelow(len(members) - i)
        members[i], members[j] = members[j], members[i]
    return members[:take]


class DpFedLsCoordinator(FedAvgCoordinator[DpFedLsJob, DpFedLsPlan, DpFedLsTask]):
    """DP-FedAvg's coordinator side with the fixed-size sample and the smoothing."""

    def _variant_task(self, family: FedAvgTaskBase) -> DpFedLsTask:
        d = self.details
        return DpFedLsTask(
            **family.model_dump(),
            client_sampling=d.client_sampling,
            sigma_ls=d.sigma_ls,
            smoothing_scope=d.smoothing_scope,
            sample_size=d.sample_size,
        )

    def _post_process(self, net: Any, update: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        p = self.spec.params
        sizes = None
        if p.smoothing_scope == "tensor":
            from dpfl.learning.params import model_signature

            sizes = [t.size for t in model_signature(net).tensors]
        return smooth_pieces(update, p.sigma_ls, sizes)

    def select(self, *, round_number: int, population: Sequence[str]) -> list[str]:
        d = self.details
        if d.client_sampling != "uniform" or d.sample_size is None:
            return super().select(round_number=round_number, population=population)
        stream = self.algorithm.random.stream(f"{self.name}/select/{self.spec.name}/{round_number}")
        return uniform_sample(population, d.sample_size, stream)


class DpFedLsAgent(FedAvgAgent[DpFedLsTask]):
    """DP-FedAvg's agent side; the agent records its rounds without the sampling it cannot
    verify."""

    def charge(self, events: Sequence[DpEvent]) -> tuple[DpEvent, ...]:
        """The claimed events without client-sampling amplification, Poisson or fixed-size
        (see :meth:`FedAvgAgent.charge`); fixed-size rounds keep their replace-one
        sensitivity, which bounds the add/remove one too."""
        return tuple(
            e.event if isinstance(e, PoissonSampledEvent | SampledWithoutReplacementEvent) else e
            for e in events
        )


class DpFedLs(FedAvgFamily[DpFedLsJob, DpFedLsPlan, DpFedLsTask]):
    """DP-Fed-LS; see the module docstring."""

    name: ClassVar[str] = "dp-fed-ls"
    spec_type = DpFedLsJob
    plan_type = DpFedLsPlan
    task_type = DpFedLsTask
    coordinator_type = DpFedLsCoordinator
    agent_type = DpFedLsAgent

    def _expected_participants(self, job: DpFedLsJob, population: int) -> float:
        p = job.params
        if p.client_sampling == "uniform":
            return float(sample_size(p.sampling_rate, population))
        return super()._expected_participants(job, population)

    def _variant_plan(
        self, job: DpFedLsJob, population: int, family: FedAvgPlanBase
    ) -> DpFedLsPlan:
        p = job.params
        uniform = p.client_sampling == "uniform"
        return DpFedLsPlan(
            **family.model_dump(),
            client_sampling=p.client_sampling,
            sigma_ls=p.sigma_ls,
            smoothing_scope=p.smoothing_scope,
            sample_size=sample_size(p.sampling_rate, population) if uniform else None,
        )

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        """DP-FedAvg's exact plan, plus the seed's closed forms for both samplings (module
        docstring) in ``calibration["closed_form"]``."""
        plan = super().plan(job, population=population, data=data)
        calibration = dict(plan.calibration)
        calibration["closed_form"] = self._closed_forms(self.narrow(job), plan, population)
        return JobPlan(plan.noise_multiplier, calibration, plan.population, plan.details)

    def _closed_forms(self, job: DpFedLsJob, plan: JobPlan, population: int) -> dict[str, Any]:
        delta = job.privacy.delta
        epsilon = float(plan.calibration["epsilon"])
        target = job.privacy.target_epsilon if job.privacy.target_epsilon else epsilon
        d = self.bind(job, plan).details
        out: dict[str, Any] = {"target_epsilon": target}
        for sampling in ("uniform", "poisson"):
            size = sample_size(job.params.sampling_rate, population)
            ratio = size / population if sampling == "uniform" else job.params.sampling_rate
            bound = fedls_noise_multiplier(
                sampling_ratio=ratio,
                steps=job.rounds,
                epsilon=target,
                delta=delta,
                sampling=sampling,
            )
            shape = d.model_copy(
                update={
                    "client_sampling": sampling,
                    "sample_size": size,
                    "noise_total": noise_total(d.noise, bound.noise_multiplier, d.l2_sensitivity),
                }
            )
            event = shape.round_event(population)
            job_event = event if job.rounds == 1 else SelfComposedEvent(event, job.rounds)
            try:
                at: float | None = compute_epsilon(job_event, delta=delta, tight=True).epsilon
            except AccountingError:
                at = None
            out[sampling] = {
                **bound.to_json(),
                "sampling_ratio": ratio,
                "accountant_epsilon": at if at is None or math.isfinite(at) else None,
            }
        return out


ALGORITHM = DpFedLs()
