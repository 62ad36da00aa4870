"""Private-kNN-FL: each agent votes with the labels of its k nearest records in a public feature
space.

Agent i votes ``(1/k_i)·Σ one-hot`` over its ``min(k_i, M_i)`` records nearest to the query
(ties to the lower index), ``k_i ≥ k``; replacing one record swaps at most one neighbour, so the
instance-level charge uses the exact sensitivity √2/k rather than the k-times larger closed form.
The coordinator side is :mod:`~dpfl.learning.algorithms.voting`. Details:
docs/algorithms.md#private-knn-fl.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from dpfl.accounting import DpEvent, GaussianEvent, SelfComposedEvent, SkellamEvent
from dpfl.learning.algorithms import common
from dpfl.learning.algorithms.base import AgentData, AlgorithmError, JobPlan
from dpfl.learning.algorithms.extractors import build_extractor, feature_spec
from dpfl.learning.algorithms.voting import VotingAlgorithm, same_sensitivity
from dpfl.learning.jobs import PrivateKnnFlJob
from dpfl.secagg.encoding import EncodingConfig

__all__ = ["ALGORITHM", "PrivateKnnFl", "knn_sensitivities", "knn_votes", "neighbours_of"]

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


class PrivateKnnFl(VotingAlgorithm):
    """Private-kNN-FL; see the module docstring."""

    name: ClassVar[str] = "private-knn-fl"
    job_type: ClassVar[type] = PrivateKnnFlJob

    # -- the votes ---------------------------------------------------------------------------

    def _vote_details(self, job: Any, *, classes: int, level: str) -> dict[str, Any]:
        p = job.params
        given_bits = job.secagg.scale_bits
        bits = given_bits if given_bits is not None else _scale_bits(level, p.k, classes)
        l1, l2 = knn_sensitivities(level=level, k=p.k, scale_bits=bits, num_classes=classes)
        return {
            "k": p.k,
            "k_fraction": p.k_fraction,
            "features": feature_spec(p.features, dim=p.projection_dim, seed=p.projection_seed),
            "scale_bits": bits,
            "l1_sensitivity": l1,
            "l2_sensitivity": l2,
            "scale_bits_rule": "given" if given_bits is not None else "inflation<=0.1%",
        }

    def _batch_event(self, details: Mapping[str, Any], count: int, sigma: float) -> DpEvent:
        u = math.ldexp(1.0, int(details["scale_bits"]))
        l1, l2 = float(details["l1_sensitivity"]), float(details["l2_sensitivity"])
        if details["noise"] == "gaussian":
            query: DpEvent = GaussianEvent(sigma=sigma * u, sensitivity=l2)
        else:
            query = SkellamEvent(
                mu=(sigma * u) ** 2 / 2.0,
                l1_sensitivity=l1,
                l2_sensitivity=l2,
                dimension=int(details["num_classes"]),
            )
        return SelfComposedEvent(query, count)

    def _task_extras(self, job: Any, plan: JobPlan) -> dict[str, Any]:
        d = plan.details
        return {"k": d["k"], "k_fraction": d["k_fraction"], "features": d["features"]}

    def _student_recipe(self, job: Any) -> dict[str, Any]:
        p = job.params
        return {
            "epochs": p.student_epochs,
            "batch_size": p.batch_size,
            "learning_rate": p.student_learning_rate,
        }

    def _vote_sensitivity(self, plan: JobPlan) -> float:
        return 1.0 if plan.details["level"] == "agent" else 1.0 / int(plan.details["k"])

    # -- agent side --------------------------------------------------------------------------

    def _parse(self, params: Mapping[str, Any]) -> dict[str, Any]:
        p, task = self._parse_common(params)
        fraction = params.get("k_fraction")
        return {
            **task,
            "k": p.integer("k", minimum=1),
            "k_fraction": None if fraction is None else p.number("k_fraction", low=0.0, high=1.0),
            "features": p.text("features"),
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
        """Refuse unless the one claimed event is the round's queries with the sensitivities
        the agent recomputes from the task's level, k and this encoding's scale, and the
        per-agent noise (over ``t·min_survivors`` honest agents, or alone) carries it."""
        task = self._parse(params)
        counts = {
            "num_clients": num_clients,
            "min_survivors": min_survivors,
            "honest_fraction": honest_fraction,
        }
        event = self._check_round(task, events, encoding, **counts)
        count, classes = len(task["queries"]), task["num_classes"]
        l1, l2 = knn_sensitivities(
            level=task["level"], k=task["k"], scale_bits=task["scale_bits"], num_classes=classes
        )
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
            if not isinstance(query, GaussianEvent):
                raise AlgorithmError(f"Gaussian noise but a {type(query).__name__} is claimed")
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
        """The flattened ``Q_r × C`` block of kNN votes (module docstring)."""
        task = self._parse(params)
        queries = self._public_queries(task, public_x, self.name)
        if data.num_classes != task["num_classes"]:
            raise AlgorithmError(
                f"the agent's data has {data.num_classes} classes, the task {task['num_classes']}"
            )
        labels = np.asarray(data.y, dtype=np.int64)
        if labels.size == 0:
            raise AlgorithmError("this agent holds no records to vote with")
        extractor = build_extractor(task["features"], tuple(data.input_shape))
        k = neighbour_count(task["k"], task["k_fraction"], labels.size)
        nearest = neighbours_of(extractor(data.x), extractor(queries), k)
        votes = knn_votes(labels[nearest], k=k, num_classes=task["num_classes"])
        flat: npt.NDArray[np.float64] = votes.reshape(-1)
        return flat


ALGORITHM = PrivateKnnFl()
