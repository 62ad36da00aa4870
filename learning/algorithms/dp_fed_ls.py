"""DP-Fed-LS: DP-FedAvg plus Laplacian smoothing of the noisy aggregate on the coordinator.

Smoothing (:mod:`~dpfl.learning.algorithms.smoothing`) is post-processing, so privacy is
DP-FedAvg's; ``client_sampling: uniform`` draws a fixed-size sample and charges the replace-one
``SampledWithoutReplacementEvent`` instead. The paper's closed-form noise bound is reported beside
the exact calibration, never charged. Details: docs/algorithms.md#dp-fed-ls.
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
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    compute_epsilon,
    fedls_noise_multiplier,
)
from dpfl.learning.algorithms import common
from dpfl.learning.algorithms.base import (
    AlgorithmError,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundTask,
)
from dpfl.learning.algorithms.dp_fedavg import DpFedAvg, mechanism_event
from dpfl.learning.algorithms.smoothing import smooth_pieces
from dpfl.learning.jobs import DpFedAvgJob, DpFedLsJob, JobSpec
from dpfl.secagg.randomness import RandomStream

__all__ = ["ALGORITHM", "DpFedLs", "sample_size", "uniform_sample"]

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


class DpFedLs(DpFedAvg):
    """DP-Fed-LS; see the module docstring."""

    name: ClassVar[str] = "dp-fed-ls"
    job_type: ClassVar[type] = DpFedLsJob

    # -- hooks -------------------------------------------------------------------------------

    def _expected_participants(self, job: DpFedAvgJob, population: int) -> float:
        p = job.params
        if getattr(p, "client_sampling", "poisson") == "uniform":
            return float(sample_size(p.sampling_rate, population))
        return super()._expected_participants(job, population)

    def _plan_extras(self, job: DpFedAvgJob, population: int) -> dict[str, Any]:
        p: Any = job.params
        extras: dict[str, Any] = {
            "client_sampling": p.client_sampling,
            "sigma_ls": p.sigma_ls,
            "smoothing_scope": p.smoothing_scope,
        }
        if p.client_sampling == "uniform":
            extras["sample_size"] = sample_size(p.sampling_rate, population)
        return extras

    def _round_event_from(self, details: Mapping[str, Any], population: int) -> DpEvent:
        if details.get("client_sampling") != "uniform":
            return super()._round_event_from(details, population)
        inner = mechanism_event(
            noise=str(details["noise"]),
            total=float(details["noise_total"]),
            l1=REPLACE_ONE * float(details["l1_sensitivity"]),
            l2=REPLACE_ONE * float(details["l2_sensitivity"]),
            dimension=int(details["dimension"]),
        )
        size = int(details["sample_size"])
        if bool(details["secure_aggregation"]) and size < population:
            return SampledWithoutReplacementEvent(population, size, inner)
        return inner

    def _unwrap_claim(self, event: DpEvent, task: Mapping[str, Any]) -> tuple[DpEvent, float]:
        if task["client_sampling"] != "uniform":
            return super()._unwrap_claim(event, task)
        if isinstance(event, PoissonSampledEvent):
            raise AlgorithmError("the task samples a fixed number of clients, not Poisson")
        if isinstance(event, SampledWithoutReplacementEvent):
            if not task["secure_aggregation"] or event.sample_size != task["sample_size"]:
                raise AlgorithmError(
                    f"the event claims {event.sample_size} of {event.population} clients "
                    f"sampled; the task samples {task['sample_size']} "
                    f"{'with' if task['secure_aggregation'] else 'without'} secure aggregation"
                )
            return event.event, REPLACE_ONE
        # no amplification claimed: the bare release (replace-one) is never below the truth
        return event, REPLACE_ONE

    def _post_process(
        self, job: DpFedAvgJob, net: Any, update: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        p: Any = job.params
        sizes = None
        if p.smoothing_scope == "tensor":
            from dpfl.learning.params import model_signature

            sizes = [t.size for t in model_signature(net).tensors]
        return smooth_pieces(update, p.sigma_ls, sizes)

    # -- coordinator side --------------------------------------------------------------------

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        """DP-FedAvg's exact plan, plus the seed's closed forms for both samplings (module
        docstring) in ``calibration["closed_form"]``."""
        plan = super().plan(job, population=population, data=data)
        spec: Any = self._job(job)
        calibration = dict(plan.calibration)
        calibration["closed_form"] = self._closed_forms(spec, plan, population)
        return JobPlan(
            noise_multiplier=plan.noise_multiplier,
            calibration=calibration,
            population=plan.population,
            details=plan.details,
        )

    def _closed_forms(self, job: Any, plan: JobPlan, population: int) -> dict[str, Any]:
        delta = job.privacy.delta
        epsilon = float(plan.calibration["epsilon"])
        target = job.privacy.target_epsilon if job.privacy.target_epsilon else epsilon
        d = plan.details
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
            z = bound.noise_multiplier
            l2 = float(d["l2_sensitivity"])
            total = (z * l2) ** 2 / 2.0 if d["noise"] == "skellam" else z * l2
            shape = {**d, "client_sampling": sampling, "sample_size": size, "noise_total": total}
            event = self._round_event_from(shape, population)
            job_event = event if job.rounds == 1 else SelfComposedEvent(event, job.rounds)
            try:
                at = compute_epsilon(job_event, delta=delta, tight=True).epsilon
            except AccountingError:
                at = None
            out[sampling] = {
                **bound.to_json(),
                "sampling_ratio": ratio,
                "accountant_epsilon": at if at is None or math.isfinite(at) else None,
            }
        return out

    def select(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> list[str]:
        spec: Any = self._job(job)
        if spec.params.client_sampling != "uniform":
            return super().select(job, plan, round_number=round_number, population=population)
        stream = self._random.stream(f"{self.name}/select/{spec.name}/{round_number}")
        return uniform_sample(population, int(plan.details["sample_size"]), stream)

    def round_task(
        self, job: JobSpec, plan: JobPlan, state: CoordinatorState, *, round_number: int
    ) -> RoundTask:
        task = super().round_task(job, plan, state, round_number=round_number)
        d = plan.details
        params = {
            **task.params,
            "client_sampling": d["client_sampling"],
            "sigma_ls": d["sigma_ls"],
            "smoothing_scope": d["smoothing_scope"],
        }
        if d["client_sampling"] == "uniform":
            params["sample_size"] = d["sample_size"]
        return RoundTask(
            params=params, vector_length=task.vector_length, model_version=task.model_version
        )

    # -- agent side --------------------------------------------------------------------------

    def _parse(self, params: Mapping[str, Any]) -> dict[str, Any]:
        task = super()._parse(params)
        p = common.TaskParams(params, algorithm=self.name)
        task["client_sampling"] = p.text("client_sampling", choices=("poisson", "uniform"))
        if task["client_sampling"] == "uniform":
            task["sample_size"] = p.integer("sample_size", minimum=1)
        return task

    def agent_charge(
        self, params: Mapping[str, Any], events: Sequence[DpEvent]
    ) -> tuple[DpEvent, ...]:
        """The claimed events without client-sampling amplification, Poisson or fixed-size
        (see :meth:`DpFedAvg.agent_charge`); fixed-size rounds keep their replace-one
        sensitivity, which bounds the add/remove one too."""
        self._parse(params)
        return tuple(
            e.event if isinstance(e, PoissonSampledEvent | SampledWithoutReplacementEvent) else e
            for e in events
        )


ALGORITHM = DpFedLs()
