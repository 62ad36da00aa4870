"""Private-kNN-FL: each agent votes with the labels of its k nearest records in a public feature
space.

Agent i votes ``(1/k_i)·Σ one-hot`` over its ``min(k_i, M_i)`` records nearest to the query
(ties to the lower index), ``k_i ≥ k``; replacing one record swaps at most one neighbour, so the
instance-level charge uses the exact sensitivity √2/k rather than the k-times larger closed form.
The coordinator side is :mod:`~dpfl.learning.algorithms.voting`. Details:
docs/algorithms.md#private-knn-fl.
The task is :class:`PrivateKnnFlTask`, the plan :class:`PrivateKnnFlPlan`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from dpfl.accounting import DpEvent, GaussianEvent, SelfComposedEvent, SkellamEvent
from dpfl.learning.algorithms.base import (
    AgentData,
    AlgorithmError,
    CoordinatorData,
    CoordinatorState,
    RoundTask,
)
from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.parts.extractors import (
    SHA256_PATTERN,
    FeatureParams,
    LearnedFeature,
    build_extractor,
    fit_artifact,
    is_learned,
)
from dpfl.learning.algorithms.voting import (
    SOURCE,
    VoteScale,
    VotingAgent,
    VotingAlgorithm,
    VotingCoordinator,
    VotingPlan,
    VotingTask,
)
from dpfl.learning.jobs import VotingJob, VotingParams
from dpfl.mechanisms.encoding import EncodingConfig

__all__ = [
    "ALGORITHM",
    "PrivateKnnFl",
    "PrivateKnnFlJob",
    "PrivateKnnFlParams",
    "PrivateKnnFlPlan",
    "PrivateKnnFlTask",
    "knn_sensitivities",
    "knn_votes",
    "neighbours_of",
]


class PrivateKnnFlParams(VotingParams, FeatureParams):
    """Private-kNN-FL: votes are the labels of the ``k`` nearest records."""

    k: int = Field(default=10, ge=1)
    student_epochs: int = Field(default=30, ge=1)
    # an agent uses k_i = max(k, floor(k_fraction·M_i)) neighbours; k is the floor every
    # participant respects, which the instance-level charge uses
    k_fraction: float | None = Field(
        default=None, gt=0, le=1, description="null: every agent uses k neighbours"
    )
    student_learning_rate: float = Field(default=0.1, gt=0)
    batch_size: int = Field(default=32, ge=1)


class PrivateKnnFlJob(VotingJob):
    algorithm: Literal["private-knn-fl"]
    params: PrivateKnnFlParams = PrivateKnnFlParams()


class PrivateKnnFlPlan(VotingPlan):
    """The voting plan plus k, k_fraction and the extractor."""

    k: int = Field(ge=1)
    k_fraction: float | None = Field(default=None, gt=0, le=1)
    features: str

    def batch_event(self, count: int, sigma: float) -> DpEvent:
        details = self
        u = math.ldexp(1.0, details.scale_bits)
        if details.noise == "gaussian":
            query: DpEvent = GaussianEvent(sigma=sigma * u, sensitivity=details.l2_sensitivity)
        else:
            query = SkellamEvent(
                mu=(sigma * u) ** 2 / 2.0,
                l1_sensitivity=details.l1_sensitivity,
                l2_sensitivity=details.l2_sensitivity,
                dimension=details.num_classes,
            )
        return SelfComposedEvent(query, count)

    @property
    def vote_sensitivity(self) -> float:
        return 1.0 if self.level == "agent" else 1.0 / self.k


class PrivateKnnFlTask(VotingTask):
    """The voting task plus k, k_fraction (or null), the extractor's spec and, for a learned
    map, its artifact's SHA-256."""

    algorithm: Literal["private-knn-fl"]
    k: int = Field(ge=1)
    k_fraction: float | None = Field(default=None, gt=0, le=1)
    features: str = Field(min_length=1)
    features_sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)

    @model_validator(mode="after")
    def _named(self) -> PrivateKnnFlTask:
        # a learned map's SHA-256 is added once the state holds it (round_task); an agent
        # refuses a learned map without one when it builds the extractor
        if self.features_sha256 is not None and not is_learned(self.features):
            raise ValueError("features_sha256: only a learned feature map is named by a hash")
        return self


_CHUNK_VALUES = 1 << 22  # float64 values per distance chunk (32 MiB)


def knn_sensitivities(
    *, level: str, k: int, scale_bits: int, num_classes: int
) -> tuple[float, float]:
    """``(L1, L2)`` of one agent's change of ONE query's vote, in ring units (module docstring)."""
    u = math.ldexp(1.0, scale_bits)
    c = float(num_classes)
    if level == "agent":
        return (u + c, u + math.sqrt(c))
    return (2.0 * u / k + 2.0 * c, math.sqrt(2.0) * u / k + 2.0 * math.sqrt(c))


def _scale_bits(level: str, k: int, num_classes: int) -> int:
    for bits in range(common.MAX_AUTO_SCALE_BITS + 1):
        u = math.ldexp(1.0, bits)
        data = u if level == "agent" else math.sqrt(2.0) * u / k
        _, l2 = knn_sensitivities(level=level, k=k, scale_bits=bits, num_classes=num_classes)
        if l2 <= (1.0 + common.SCALE_INFLATION) * data:
            return bits
    raise AlgorithmError("no scale keeps the rounding of the votes small")  # pragma: no cover


def neighbour_count(k: int, k_fraction: float | None, size: int) -> int:
    """k_i = max(k, ⌊k_fraction·M_i⌋) (or k)."""
    return k if k_fraction is None else max(k, math.floor(k_fraction * size))


def neighbours_of(
    records: npt.ArrayLike, queries: npt.ArrayLike, count: int
) -> npt.NDArray[np.int64]:
    """Indices ``(Q, min(count, M))`` of the records nearest each query, nearest first.

    Squared Euclidean distances are computed per (query, record) pair from that pair alone (a
    row reduction of the difference), and ties go to the lower record index (stable sort), so
    the order of two records never depends on the others.

    Raises:
        AlgorithmError: features of different widths, no records, or count < 1.
    """
    x = np.asarray(records, dtype=np.float64)
    q = np.asarray(queries, dtype=np.float64)
    if x.ndim != 2 or q.ndim != 2 or x.shape[1] != q.shape[1] or x.shape[0] == 0:
        raise AlgorithmError(f"records {x.shape} and queries {q.shape} do not match")
    if count < 1:
        raise AlgorithmError(f"the neighbour count must be >= 1, got {count}")
    take = min(count, x.shape[0])
    step = max(1, _CHUNK_VALUES // (x.shape[0] * x.shape[1]))
    out = np.empty((q.shape[0], take), dtype=np.int64)
    for start in range(0, q.shape[0], step):
        diff = q[start : start + step, None, :] - x[None, :, :]
        distances = np.sum(diff * diff, axis=2)
        out[start : start + step] = np.argsort(distances, axis=1, kind="stable")[:, :take]
    return out


def knn_votes(
    neighbour_labels: npt.ArrayLike, *, k: int, num_classes: int
) -> npt.NDArray[np.float64]:
    """``(Q, C)`` votes: the label histogram of each query's neighbours, divided by k."""
    labels = np.asarray(neighbour_labels, dtype=np.int64)
    counts = np.zeros((labels.shape[0], num_classes))
    np.add.at(counts, (np.arange(labels.shape[0])[:, None], labels), 1.0)
    out: npt.NDArray[np.float64] = counts / float(k)
    return out


class PrivateKnnFlCoordinator(
    VotingCoordinator[PrivateKnnFlJob, PrivateKnnFlPlan, PrivateKnnFlTask]
):
    """Private-kNN-FL's coordinator side: k and the extractor in the task, a learned map
    shipped as model version 0."""

    def _task(self, common: VotingTask) -> PrivateKnnFlTask:
        d = self.details
        return PrivateKnnFlTask(
            **common.model_dump(), k=d.k, k_fraction=d.k_fraction, features=d.features
        )

    def initial_state(self, data: CoordinatorData) -> CoordinatorState:
        """The voting state; a learned map is fitted on the public pool only and shipped as
        model version 0 (the student, when trained, becomes version 1)."""
        state = super().initial_state(data)
        features = self.details.features
        if not is_learned(features):
            return state
        artifact, learned = fit_artifact(features, data)
        details = {**state.details, "features": learned.model_dump()}
        return replace(state, model=artifact, model_version=0, details=details)

    def round_task(self, state: CoordinatorState, *, round_number: int) -> RoundTask:
        """The voting task, pointing agents at the learned map (model version 0) by hash."""
        task = super().round_task(state, round_number=round_number)
        entry = state.details.get("features")
        if entry is None:
            return task
        learned = LearnedFeature.model_validate(entry)
        params = self.algorithm.task_type.model_validate(
            {**task.params.model_dump(), "features_sha256": learned.sha256}
        )
        return replace(task, params=params, model_version=state.model_version)

    def _student_recipe(self) -> tuple[int, int, float]:
        p = self.spec.params
        return p.student_epochs, p.batch_size, p.student_learning_rate


class PrivateKnnFlAgent(VotingAgent[PrivateKnnFlTask]):
    """Private-kNN-FL's agent side: its kNN votes, and the checks of their claim."""

    def check(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> float:
        """Refuse unless the one claimed event is the round's queries with the sensitivities
        the agent recomputes from the task's level, k and this encoding's scale, and the
        per-agent noise (over ``t·min_survivors`` honest agents, or alone) carries it."""
        t = self.task
        counts = common.Counts(
            num_clients=num_clients, min_survivors=min_survivors, honest_fraction=honest_fraction
        )
        query = self._per_query(self._claimed(events, encoding, counts))
        l1, l2 = knn_sensitivities(
            level=t.level, k=t.k, scale_bits=t.scale_bits, num_classes=t.num_classes
        )
        total = common.claimed_total(
            query, noise=t.noise, l1=l1, l2=l2, dimension=t.num_classes, source=SOURCE
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
        """The ``Q_r × C`` kNN votes (module docstring); under a cap the agent keeps the
        queries its neighbours agree on most."""
        t = self.task
        queries = self._public_queries(public_x, data.num_classes)
        labels = np.asarray(data.y, dtype=np.int64)
        if labels.size == 0:
            raise AlgorithmError("this agent holds no records to vote with")
        extractor = build_extractor(
            t.features, tuple(data.input_shape), artifact=model, sha256=t.features_sha256
        )
        k = neighbour_count(t.k, t.k_fraction, labels.size)
        nearest = neighbours_of(extractor(data.x), extractor(queries), k)
        votes = knn_votes(labels[nearest], k=k, num_classes=t.num_classes)
        return votes, (votes.max(axis=1),)


class PrivateKnnFl(VotingAlgorithm[PrivateKnnFlJob, PrivateKnnFlPlan, PrivateKnnFlTask]):
    """Private-kNN-FL; see the module docstring."""

    name: ClassVar[str] = "private-knn-fl"
    spec_type = PrivateKnnFlJob
    plan_type = PrivateKnnFlPlan
    task_type = PrivateKnnFlTask
    coordinator_type = PrivateKnnFlCoordinator
    agent_type = PrivateKnnFlAgent

    def _vote_scale(self, job: PrivateKnnFlJob, *, classes: int, level: str) -> VoteScale:
        p = job.params
        given_bits = job.secagg.scale_bits
        bits = given_bits if given_bits is not None else _scale_bits(level, p.k, classes)
        l1, l2 = knn_sensitivities(level=level, k=p.k, scale_bits=bits, num_classes=classes)
        return VoteScale(bits, l1, l2, "given" if given_bits is not None else "inflation<=0.1%")

    def _plan_details(self, job: PrivateKnnFlJob, common: VotingPlan) -> PrivateKnnFlPlan:
        p = job.params
        return PrivateKnnFlPlan(
            **common.model_dump(), k=p.k, k_fraction=p.k_fraction, features=p.feature_spec()
        )


ALGORITHM = PrivateKnnFl()
