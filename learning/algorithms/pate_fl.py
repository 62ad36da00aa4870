"""PATE-FL: noisy votes of locally trained teachers label public queries.

This module is how a teacher votes (one-hot or soft) and what one agent's vote can change; the
coordinator side is :mod:`~dpfl.learning.algorithms.voting`. Teachers are trained once per job
without DP (:mod:`~dpfl.learning.algorithms.parts.teachers`). Each round charges the summed
voters the round's queries composed at the data-independent cost; the data-dependent bound is only
informational, because secure aggregation releases the whole noisy histogram
(docs/algorithms.md#why-no-data-dependent-charge). Sensitivities and charge:
docs/algorithms.md#pate-fl.
The task is :class:`PateFlTask` (``job_id``, or
``job``, keys the agent's teacher cache), the plan :class:`PateFlPlan`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, JsonValue, model_validator

from dpfl.accounting import (
    DpEvent,
    GaussianEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
)
from dpfl.learning.algorithms.base import AgentData, AlgorithmError, Contract
from dpfl.learning.algorithms.parts import common, teachers
from dpfl.learning.algorithms.parts.abstain import Abstention
from dpfl.learning.algorithms.parts.adaptation import DomainAdaptation
from dpfl.learning.algorithms.voting import (
    SOURCE,
    VoteScale,
    VotingAgent,
    VotingAlgorithm,
    VotingCoordinator,
    VotingPlan,
    VotingTask,
    batch_sizes,
)
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import VotingJob, VotingParams
from dpfl.mechanisms.encoding import EncodingConfig

__all__ = [
    "ALGORITHM",
    "MNIST_TEACHERS",
    "DomainAdaptation",
    "PateFl",
    "PateFlJob",
    "PateFlParams",
    "PateFlPlan",
    "PateFlTask",
    "batch_sizes",
    "vote_sensitivities",
]


class PateFlParams(VotingParams):
    """PATE-FL: ``queries`` public examples labelled by noisy votes of local teachers."""

    teacher_epochs: int = Field(default=20, ge=1)
    student_epochs: int = Field(default=30, ge=1)
    vote: Literal["one-hot", "soft"] = "one-hot"
    teacher_learning_rate: float = Field(default=0.1, gt=0)
    student_learning_rate: float = Field(default=0.1, gt=0)
    batch_size: int = Field(default=32, ge=1)
    # teachers on small non-IID shards (docs/algorithms.md#teachers-on-small-shards)
    teacher_augment_shift: float = Field(default=0.0, ge=0, le=8)
    teacher_schedule: Literal["constant", "cosine"] = "constant"
    teacher_validation_fraction: float = Field(default=0.0, ge=0, lt=1)
    teacher_patience: int = Field(default=0, ge=0)
    teacher_max_grad_norm: float | None = Field(default=3.0, gt=0)
    # docs/algorithms.md#abstaining-teachers
    teacher_abstain: Abstention = Abstention()
    # docs/algorithms.md#teachers-adapted-to-the-public-domain
    teacher_domain_adaptation: DomainAdaptation = DomainAdaptation()


class PateFlJob(VotingJob):
    algorithm: Literal["pate-fl"]
    params: PateFlParams = PateFlParams()

    @model_validator(mode="after")
    def _adaptation_needs_hidden_layers(self) -> PateFlJob:
        if self.params.teacher_domain_adaptation.method != "none" and self.model == "logreg":
            raise ValueError(
                "params.teacher_domain_adaptation needs a model with hidden layers to align "
                "(mlp or cnn), but model is logreg"
            )
        return self


class PateFlPlan(VotingPlan):
    """The voting plan plus the vote kind."""

    vote: Literal["one-hot", "soft"]

    def batch_event(self, count: int, sigma: float) -> DpEvent:
        return _batch_event(self, count, sigma)


class TeacherRecipe(Contract):
    """How every agent trains its teacher (once per job)."""

    epochs: int = Field(ge=1)
    learning_rate: float = Field(gt=0)
    momentum: float = Field(ge=0, le=1)
    batch_size: int = Field(ge=1)
    seed: int = Field(ge=0)
    augment_shift: float = Field(default=0.0, ge=0, le=8)
    schedule: Literal["constant", "cosine"] = "constant"
    validation_fraction: float = Field(default=0.0, ge=0, lt=1)
    patience: int = Field(default=0, ge=0)
    max_grad_norm: float | None = Field(default=None, gt=0)
    domain_adaptation: DomainAdaptation = DomainAdaptation()
    abstain: Abstention = Abstention()


class PateFlTask(VotingTask):
    """The voting task plus the vote kind and the teacher's recipe."""

    algorithm: Literal["pate-fl"]
    vote: Literal["one-hot", "soft"]
    teacher: TeacherRecipe


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


def query_dimension(*, level: str, vote: str, num_classes: int) -> int:
    """The coordinates of one query's release that one agent's change moves: 1 for a one-hot
    vote at agent level (adding or removing the agent moves only the class it voted for; the
    other coordinates' outputs are the same law under both neighbours), else every class.
    docs/accounting.md#skellam-votes-the-pld-of-one-coordinate."""
    return 1 if (vote, level) == ("one-hot", "agent") else num_classes


def _batch_event(details: PateFlPlan, count: int, sigma: float) -> DpEvent:
    """The event of ``count`` queries answered with the plan's noise (σ in vote units)."""
    u = math.ldexp(1.0, details.scale_bits)
    if details.noise == "gaussian" and details.vote == "one-hot":
        return VotingEvent(queries=count, sigma=sigma, level=details.level)
    if details.noise == "gaussian":
        query: DpEvent = GaussianEvent(sigma=sigma * u, sensitivity=details.l2_sensitivity)
    else:
        query = SkellamEvent(
            mu=(sigma * u) ** 2 / 2.0,
            l1_sensitivity=details.l1_sensitivity,
            l2_sensitivity=details.l2_sensitivity,
            dimension=query_dimension(
                level=details.level, vote=details.vote, num_classes=details.num_classes
            ),
        )
    return SelfComposedEvent(query, count)


class PateFlCoordinator(VotingCoordinator[PateFlJob, PateFlPlan, PateFlTask]):
    """PATE-FL's coordinator side: the teachers' recipe in the task, the student's."""

    def _task(self, common: VotingTask) -> PateFlTask:
        job, plan = self.spec, self.details
        p = job.params
        return PateFlTask(
            **common.model_dump(),
            vote=plan.vote,
            teacher=TeacherRecipe(
                epochs=p.teacher_epochs,
                learning_rate=p.teacher_learning_rate,
                momentum=_TEACHER_MOMENTUM,
                batch_size=p.batch_size,
                seed=job.seed,
                augment_shift=p.teacher_augment_shift,
                schedule=p.teacher_schedule,
                validation_fraction=p.teacher_validation_fraction,
                patience=p.teacher_patience,
                max_grad_norm=p.teacher_max_grad_norm,
                domain_adaptation=p.teacher_domain_adaptation,
                abstain=p.teacher_abstain,
            ),
        )

    def _student_recipe(self) -> tuple[int, int, float]:
        p = self.spec.params
        return p.student_epochs, p.batch_size, p.student_learning_rate


class PateFlAgent(VotingAgent[PateFlTask]):
    """PATE-FL's agent side: its teacher's votes, and the checks of their claim."""

    def check(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> float:
        """Refuse unless the one claimed event is the round's queries at the task's level and
        vote kind, with this encoding's scale, and the per-agent noise (over
        ``t·min_survivors`` honest agents, or alone without secure aggregation) carries it."""
        t = self.task
        counts = common.Counts(
            num_clients=num_clients, min_survivors=min_survivors, honest_fraction=honest_fraction
        )
        event = self._claimed(events, encoding, counts)
        count = t.vote_cap
        l1, l2 = vote_sensitivities(
            level=t.level, vote=t.vote, scale_bits=t.scale_bits, num_classes=t.num_classes
        )
        if isinstance(event, VotingEvent):
            if t.noise != "gaussian" or t.vote != "one-hot":
                raise AlgorithmError("a voting event only describes Gaussian one-hot votes")
            if (event.queries, event.level, event.k) != (count, t.level, 1):
                raise AlgorithmError(
                    f"the event answers {event.queries} queries at level {event.level} (k = "
                    f"{event.k}); the task asks {count} at level {t.level}"
                )
            total = event.sigma * math.ldexp(1.0, t.scale_bits)
        else:
            query = self._per_query(event)
            if t.noise == "gaussian" and t.vote != "soft":
                raise AlgorithmError("Gaussian noise: one-hot votes claim a VotingEvent")
            dimension = query_dimension(level=t.level, vote=t.vote, num_classes=t.num_classes)
            total = common.claimed_total(
                query, noise=t.noise, l1=l1, l2=l2, dimension=dimension, source=SOURCE
            )
        return common.check_encoding(encoding, t, total=total, **counts)

    def ballots(
        self,
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> tuple[npt.NDArray[np.float64], tuple[npt.NDArray[np.float64], ...]]:
        """The teacher's votes, zero where it abstains; under a cap it keeps the queries where
        its own share of the neighbours, then its confidence, is highest."""
        t = self.task
        queries = self._public_queries(public_x, data.num_classes)
        from dpfl.learning.training import fit_teacher, predict_probabilities

        recipe = t.teacher
        adaptation = recipe.domain_adaptation
        assert public_x is not None  # _public_queries refused None

        # fit_teacher's keywords, and the teacher cache's key with the model
        settings = recipe.model_dump(exclude={"domain_adaptation", "abstain"})

        def fit() -> Any:
            net = common.build_model(t.model, data.input_shape, data.num_classes, seed=recipe.seed)
            if adaptation.method == "dann":
                from dpfl.learning.domain_adaptation import fit_teacher_dann

                # the target domain: every public image received (public, so free)
                fit_teacher_dann(
                    net,
                    data.x,
                    data.y,
                    public_x,
                    weight=adaptation.weight,
                    domain_hidden=adaptation.hidden,
                    device=device,
                    **settings,
                )
            else:
                fit_teacher(net, data.x, data.y, device=device, **settings)
            return net

        try:
            key = {"model": t.model, **settings}
            if adaptation.method != "none":  # plain teachers keep their old cache key
                digest = hashlib.sha256(np.ascontiguousarray(public_x).tobytes()).hexdigest()
                key |= {"domain_adaptation": adaptation.model_dump(), "target": digest}
            teacher = teachers.teacher_for(t.job_key, key, data.x, data.y, fit)
            probs = predict_probabilities(teacher, queries, device=device).astype(np.float64)
        except LearningError as exc:
            raise AlgorithmError(f"teacher failed: {exc}") from exc
        votes = _votes(probs, vote=t.vote, num_classes=t.num_classes).astype(np.float64)
        # an abstaining teacher sends the zero vector (parts/abstain.py)
        shares = recipe.abstain.shares(data.x, public_x, np.asarray(t.queries))
        votes[shares < recipe.abstain.share] = 0.0
        return votes, (shares, probs.max(axis=1))


def _votes(
    probs: npt.NDArray[np.float64], *, vote: str, num_classes: int
) -> npt.NDArray[np.float64]:
    """A teacher's vote per query: one-hot on its top class, or its exact probabilities (L1 = 1,
    L2 ≤ 1, as the sensitivities assume; the factor absorbs the float normalisation's last ulps)."""
    if probs.shape[1] != num_classes:
        raise AlgorithmError("the teacher's outputs do not match the number of classes")
    if vote == "one-hot":
        one_hot: npt.NDArray[np.float64] = np.eye(num_classes)[probs.argmax(axis=1)]
        return one_hot
    clipped = np.clip(probs, 0.0, None)
    soft: npt.NDArray[np.float64] = clipped / clipped.sum(axis=1, keepdims=True) * (1.0 - 2.0**-40)
    return soft


#: The MNIST recipe's teachers, queries and student (benchmarks/utility.py, chosen on a
#: validation split: docs/algorithms.md#semi-supervised-student).
MNIST_TEACHERS: dict[str, JsonValue] = {
    "queries": 100,
    "query_selection": "kmeans",
    "batch_size": 32,
    "teacher_epochs": 20,
    "teacher_learning_rate": 0.1,
    "teacher_augment_shift": 1.5,
    "teacher_schedule": "cosine",
    "teacher_validation_fraction": 0.1,
    "student_learning_rate": 0.1,
    "student": {"method": "consistency", "steps": 8000, "min_margin": 0.1},
}


_ABSTAINING: dict[str, JsonValue] = {
    **MNIST_TEACHERS,
    "teacher_abstain": {"method": "public-share"},
}


class PateFl(VotingAlgorithm[PateFlJob, PateFlPlan, PateFlTask]):
    """PATE-FL; see the module docstring."""

    name: ClassVar[str] = "pate-fl"
    # the MNIST recipe (docs/algorithms.md#pate-fl) with teachers that abstain (the rule's
    # defaults: vote_ceiling.py's public-0.1), alone or with each agent's votes capped at the
    # share of queries a 3-class shard can know (docs/utility.md#recipes)
    recipe_candidates = MappingProxyType(
        {
            "cnn-teachers-abstaining": {"model": "cnn", "params": _ABSTAINING},
            "cnn-teachers-capped": {
                "model": "cnn",
                "params": {**_ABSTAINING, "vote_share": 0.3},
            },
            "cnn-teachers-capped-200": {
                "model": "cnn",
                "params": {**_ABSTAINING, "vote_share": 0.3, "queries": 200},
            },
        }
    )
    spec_type = PateFlJob
    plan_type = PateFlPlan
    task_type = PateFlTask
    coordinator_type = PateFlCoordinator
    agent_type = PateFlAgent

    def _vote_scale(self, job: PateFlJob, *, classes: int, level: str) -> VoteScale:
        given_bits = job.secagg.scale_bits
        vote = job.params.vote
        if given_bits is not None:
            bits = given_bits
        elif vote == "soft":
            bits = _soft_scale_bits(level, classes)
        else:
            bits = ONE_HOT_SKELLAM_SCALE_BITS if job.privacy.noise == "skellam" else 0
        l1, l2 = vote_sensitivities(level=level, vote=vote, scale_bits=bits, num_classes=classes)
        rule = "given" if given_bits is not None else ("exact votes" if bits == 0 else None)
        return VoteScale(bits, l1, l2, rule or "inflation<=0.1%")

    def _plan_details(self, job: PateFlJob, common: VotingPlan) -> PateFlPlan:
        return PateFlPlan(**common.model_dump(), vote=job.params.vote)


ALGORITHM = PateFl()
