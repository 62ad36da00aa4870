"""PATE-FL: noisy votes of locally trained teachers label public queries.

This module is how a teacher votes (one-hot or soft) and what one agent's vote can change; the
coordinator side is :mod:`~dpfl.learning.algorithms.voting`. Teachers are trained once per job
without DP (:mod:`~dpfl.learning.algorithms.teachers`). Each round charges the summed voters the
round's queries composed at the data-independent cost; the data-dependent bound is only
informational, because secure aggregation releases the whole noisy histogram
(docs/algorithms.md#why-no-data-dependent-charge). Sensitivities and charge:
docs/algorithms.md#pate-fl.
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
    VotingEvent,
)
from dpfl.learning.algorithms import common, teachers
from dpfl.learning.algorithms.base import AgentData, AlgorithmError, JobPlan
from dpfl.learning.algorithms.voting import VotingAlgorithm, batch_sizes, same_sensitivity
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import PateFlJob
from dpfl.secagg.encoding import EncodingConfig

__all__ = ["ALGORITHM", "PateFl", "batch_sizes", "vote_sensitivities"]

_TEACHER_MOMENTUM = 0.9
#: One-hot votes are exact integers at any scale; scaling them by 2^10 makes Skellam noise fine
#: next to one vote, so its RDP is within a factor 1 + ~1/(σ·2^10)² of the Gaussian one (the
#: correction terms of Agarwal, Kairouz & Liu 2021, Thm. 3.5, shrink as 1/u² with μ = (σu)²/2).
ONE_HOT_SKELLAM_SCALE_BITS = 10


def vote_sensitivities(
    *, level: str, vote: str, scale_bits: int, num_classes: int
) -> tuple[float, float]:
    """``(L1, L2)`` of one agent's change of ONE query's vote, in ring units (module docstring)."""
    u = math.ldexp(1.0, scale_bits)
    c = float(num_classes)
    if vote == "one-hot":
        return (u, u) if level == "agent" else (2.0 * u, math.sqrt(2.0) * u)
    if level == "agent":
        return (u + c, u + math.sqrt(c))
    return (2.0 * u + 2.0 * c, math.sqrt(2.0) * u + 2.0 * math.sqrt(c))


def _soft_scale_bits(level: str, num_classes: int) -> int:
    for bits in range(common.MAX_AUTO_SCALE_BITS + 1):
        _, l2 = vote_sensitivities(
            level=level, vote="soft", scale_bits=bits, num_classes=num_classes
        )
        ideal = math.ldexp(1.0 if level == "agent" else math.sqrt(2.0), bits)
        if l2 <= (1.0 + common.SCALE_INFLATION) * ideal:
            return bits
    raise AlgorithmError("no scale keeps the rounding of soft votes small")  # pragma: no cover


def _batch_event(details: Mapping[str, Any], count: int, sigma: float) -> DpEvent:
    """The event of ``count`` queries answered with the plan's noise (σ in vote units)."""
    noise, vote, level = str(details["noise"]), str(details["vote"]), str(details["level"])
    l1, l2 = float(details["l1_sensitivity"]), float(details["l2_sensitivity"])
    u = math.ldexp(1.0, int(details["scale_bits"]))
    if noise == "gaussian" and vote == "one-hot":
        return VotingEvent(
            queries=count, sigma=sigma, level="agent" if level == "agent" else "instance"
        )
    if noise == "gaussian":
        query: DpEvent = GaussianEvent(sigma=sigma * u, sensitivity=l2)
    else:
        query = SkellamEvent(
            mu=(sigma * u) ** 2 / 2.0,
            l1_sensitivity=l1,
            l2_sensitivity=l2,
            dimension=int(details["num_classes"]),
        )
    return SelfComposedEvent(query, count)


class PateFl(VotingAlgorithm):
    """PATE-FL; see the module docstring."""

    name: ClassVar[str] = "pate-fl"
    job_type: ClassVar[type] = PateFlJob

    # -- the votes ---------------------------------------------------------------------------

    def _vote_details(self, job: Any, *, classes: int, level: str) -> dict[str, Any]:
        given_bits = job.secagg.scale_bits
        vote = job.params.vote
        if given_bits is not None:
            bits = given_bits
        elif vote == "soft":
            bits = _soft_scale_bits(level, classes)
        else:
            bits = ONE_HOT_SKELLAM_SCALE_BITS if job.privacy.noise == "skellam" else 0
        l1, l2 = vote_sensitivities(level=level, vote=vote, scale_bits=bits, num_classes=classes)
        return {
            "vote": vote,
            "scale_bits": bits,
            "l1_sensitivity": l1,
            "l2_sensitivity": l2,
            "scale_bits_rule": (
                "given"
                if given_bits is not None
                else ("exact votes" if bits == 0 else "inflation<=0.1%")
            ),
        }

    def _batch_event(self, details: Mapping[str, Any], count: int, sigma: float) -> DpEvent:
        return _batch_event(details, count, sigma)

    def _task_extras(self, job: Any, plan: JobPlan) -> dict[str, Any]:
        return {
            "vote": plan.details["vote"],
            "teacher": {
                "epochs": job.params.teacher_epochs,
                "learning_rate": job.params.teacher_learning_rate,
                "momentum": _TEACHER_MOMENTUM,
                "batch_size": job.params.batch_size,
                "seed": job.seed,
            },
        }

    def _student_recipe(self, job: Any) -> dict[str, Any]:
        return {
            "epochs": job.params.student_epochs,
            "batch_size": job.params.batch_size,
            "learning_rate": job.params.student_learning_rate,
        }

    def _vote_sensitivity(self, plan: JobPlan) -> float:
        return 1.0

    # -- agent side --------------------------------------------------------------------------

    def _parse(self, params: Mapping[str, Any]) -> dict[str, Any]:
        _, task = self._parse_common(params)
        p = common.TaskParams(params, algorithm=self.name)
        teacher = params.get("teacher")
        if not isinstance(teacher, Mapping):
            raise AlgorithmError("params.teacher: must be an object")
        t = common.TaskParams({**teacher, "algorithm": self.name}, algorithm=self.name)
        return {
            **task,
            "vote": p.text("vote", choices=("one-hot", "soft")),
            "teacher": {
                "epochs": t.integer("epochs", minimum=1),
                "learning_rate": t.number("learning_rate", low=0.0),
                "momentum": t.number("momentum", low=0.0, high=1.0, strict=False),
                "batch_size": t.integer("batch_size", minimum=1),
                "seed": t.integer("seed", minimum=0),
            },
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
        """Refuse unless the one claimed event is the round's queries at the task's level and
        vote kind, with this encoding's scale, and the per-agent noise (over
        ``t·min_survivors`` honest agents, or alone without secure aggregation) carries it."""
        task = self._parse(params)
        counts = {
            "num_clients": num_clients,
            "min_survivors": min_survivors,
            "honest_fraction": honest_fraction,
        }
        event = self._check_round(task, events, encoding, **counts)
        count, classes = len(task["queries"]), task["num_classes"]
        u = math.ldexp(1.0, task["scale_bits"])
        l1, l2 = vote_sensitivities(
            level=task["level"],
            vote=task["vote"],
            scale_bits=task["scale_bits"],
            num_classes=classes,
        )
        if isinstance(event, VotingEvent):
            if task["noise"] != "gaussian" or task["vote"] != "one-hot":
                raise AlgorithmError("a voting event only describes Gaussian one-hot votes")
            if (event.queries, event.level, event.k) != (count, task["level"], 1):
                raise AlgorithmError(
                    f"the event answers {event.queries} queries at level {event.level} (k = "
                    f"{event.k}); the task asks {count} at level {task['level']}"
                )
            total = event.sigma * u
        else:
            if not isinstance(event, SelfComposedEvent) or event.count != count:
                raise AlgorithmError(f"expected {count} per-query events, got {event!r}")
            query = event.event
            if task["noise"] == "skellam":
                if not isinstance(query, SkellamEvent) or query.dimension != classes:
                    raise AlgorithmError(f"expected a Skellam event over {classes} classes")
                same_sensitivity("L1", query.l1_sensitivity, l1)
                same_sensitivity("L2", query.l2_sensitivity, l2)
                total = query.mu
            else:
                if task["vote"] != "soft" or not isinstance(query, GaussianEvent):
                    raise AlgorithmError("Gaussian noise: one-hot votes claim a VotingEvent")
                same_sensitivity("L2", query.sensitivity, l2)
                total = query.sigma
        self._check_noise(task, total, encoding, **counts)

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
        queries = self._public_queries(task, public_x, self.name)
        if data.num_classes != task["num_classes"]:
            raise AlgorithmError(
                f"the agent's data has {data.num_classes} classes, the task {task['num_classes']}"
            )
        from dpfl.learning.training import predict_probabilities, train

        recipe = {"model": task["model"], **task["teacher"]}

        def fit() -> Any:
            net = common.build_model(
                task["model"], data.input_shape, data.num_classes, seed=task["teacher"]["seed"]
            )
            t = task["teacher"]
            train(
                net,
                data.x,
                data.y,
                epochs=t["epochs"],
                batch_size=t["batch_size"],
                learning_rate=t["learning_rate"],
                momentum=t["momentum"],
                seed=t["seed"],
                device=device,
            )
            return net

        try:
            teacher = teachers.teacher_for(task["job_key"], recipe, data.x, data.y, fit)
            probs = predict_probabilities(teacher, queries, device=device).astype(np.float64)
        except LearningError as exc:
            raise AlgorithmError(f"teacher failed: {exc}") from exc
        if probs.shape[1] != task["num_classes"]:
            raise AlgorithmError("the teacher's outputs do not match the number of classes")
        if task["vote"] == "one-hot":
            votes = np.eye(task["num_classes"])[probs.argmax(axis=1)]
        else:
            # exact probability vectors (L1 = 1, L2 ≤ 1 per query, as the sensitivities assume);
            # the factor below absorbs the last ulps of the float normalisation
            votes = np.clip(probs, 0.0, None)
            votes = votes / votes.sum(axis=1, keepdims=True) * (1.0 - 2.0**-40)
        flat: npt.NDArray[np.float64] = votes.reshape(-1).astype(np.float64)
        return flat


ALGORITHM = PateFl()
