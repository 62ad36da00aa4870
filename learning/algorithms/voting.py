"""What PATE-FL and Private-kNN-FL share: noisy vote histograms on public queries, pseudo-labels and
a student.

Each subclass supplies how an agent votes and what one agent's vote can change (per-query
sensitivities and event); this module batches the job's public queries over the rounds, takes
the argmax of each decoded noisy sum, trains the student after the last round, and charges every
summed voter exactly the round's answered queries (docs/algorithms.md#pate-fl).

Every voting task is a :class:`VotingTask`, every plan a :class:`VotingPlan`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator
from typing_extensions import TypeVar

from dpfl.accounting import ComposedEvent, DataDependentVotingEvent, DpEvent, SelfComposedEvent
from dpfl.learning.algorithms.base import (
    AgentData,
    AgentSide,
    Algorithm,
    AlgorithmError,
    ClientCharge,
    CoordinatorData,
    CoordinatorSide,
    CoordinatorState,
    JobPlan,
    PlanDetails,
    RoundCharge,
    RoundOutcome,
    RoundTask,
    TaskParams,
)
from dpfl.learning.algorithms.parts import common
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, VotingJob
from dpfl.mechanisms.encoding import EncodingConfig

__all__ = [
    "VotingAgent",
    "VotingAlgorithm",
    "VotingCoordinator",
    "VotingPlan",
    "VotingTask",
    "batch_sizes",
    "capped",
    "select_queries",
    "vote_cap",
    "vote_clip",
]

_CLIP_SLACK = 1.0 + 1e-9  # the block norm √Q_r must never trigger the encoding's clip


def batch_sizes(queries: int, rounds: int) -> list[int]:
    """``queries`` split into ``rounds`` batches differing by at most one (larger first)."""
    base, extra = divmod(queries, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def vote_clip(batch: int) -> float:
    """The encoding's clip for ``batch`` votes of L2 norm ≤ 1 each (never binding)."""
    return math.sqrt(batch) * _CLIP_SLACK


def vote_cap(count: int, share: float) -> int:
    """How many of a round's ``count`` queries one agent may vote on: ⌈share·count⌉, at least
    one (the product is rounded to 9 places first, so 0.3 of 100 is 30, not 31)."""
    return max(1, min(count, math.ceil(round(share * count, 9))))


def capped(
    votes: npt.NDArray[np.float64], keys: Sequence[npt.NDArray[np.float64]], keep: int
) -> npt.NDArray[np.float64]:
    """``votes`` (one row per query) with every row set to zero but the ``keep`` cast votes
    ranked first by ``keys`` (most important first, higher first; ties to the lower row)."""
    rows = len(votes)
    cast = np.abs(votes).sum(axis=1) > 0
    if int(cast.sum()) <= keep:
        return votes
    # np.lexsort sorts by its last key first: cast rows, then each key, then the row index
    order = np.lexsort((np.arange(rows), *(-np.asarray(k) for k in reversed(keys)), ~cast))
    out = np.zeros_like(votes)
    out[order[:keep]] = votes[order[:keep]]
    return out


def select_queries(
    public_x: npt.NDArray[np.floating[Any]], count: int, *, method: str, seed: int
) -> list[int]:
    """``count`` distinct public indices, a pure function of the public records and ``seed``.

    ``random``: a seeded permutation. ``kmeans``: the record nearest each of ``count`` k-means
    centroids (k-means++ start, Lloyd steps), so the few answered queries cover the pool's modes;
    the result is shuffled so every round's batch mixes them. Reads no private data and no labels,
    so it costs no privacy.
    """
    size = len(public_x)
    if not 1 <= count <= size:
        raise AlgorithmError(f"cannot select {count} queries from {size} public records")
    rng = np.random.default_rng(seed)
    if method == "random":
        return [int(i) for i in rng.permutation(size)[:count]]
    if method != "kmeans":
        raise AlgorithmError(f"unknown query selection {method!r}")
    x = np.asarray(public_x, dtype=np.float64).reshape(size, -1)
    sq = (x * x).sum(axis=1)

    def distances(centres: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        d: npt.NDArray[np.float64] = sq[:, None] - 2.0 * x @ centres.T + (centres**2).sum(1)
        return np.maximum(d, 0.0)

    chosen = [int(rng.integers(size))]
    nearest = distances(x[chosen])[:, 0]
    for _ in range(1, count):
        weights = nearest / nearest.sum() if nearest.sum() > 0 else None
        chosen.append(int(rng.choice(size, p=weights)))
        nearest = np.minimum(nearest, distances(x[chosen[-1:]])[:, 0])
    centres = x[chosen]
    for _ in range(_KMEANS_STEPS):
        assign = distances(centres).argmin(axis=1)
        for c in range(count):
            members = assign == c
            if members.any():
                centres[c] = x[members].mean(axis=0)
    # the nearest not-yet-taken record of each centre (greedy, closest pairs first)
    d = distances(centres).T  # (centre, record)
    taken: set[int] = set()
    picks: list[int] = []
    for c in np.argsort(d.min(axis=1), kind="stable"):
        for i in np.argsort(d[c], kind="stable"):
            if int(i) not in taken:
                taken.add(int(i))
                picks.append(int(i))
                break
    return [picks[i] for i in rng.permutation(count)]


_KMEANS_STEPS = 20


class VotingPlan(PlanDetails):
    """The plan of a voting job: per-query sensitivities in ring units, the batches."""

    model: str
    num_classes: int = Field(ge=2)
    queries: int = Field(ge=1)
    batch_sizes: tuple[int, ...]
    level: Literal["agent", "instance"]
    l1_sensitivity: float = Field(gt=0)
    l2_sensitivity: float = Field(gt=0)
    vote_share: float = Field(default=1.0, gt=0, le=1)

    def charged(self, count: int) -> int:
        """The per-query releases a round of ``count`` queries charges each voter: the rows one
        agent can move (docs/accounting.md#capped-votes)."""
        return vote_cap(count, self.vote_share)

    def batch_event(self, count: int, sigma: float) -> DpEvent:
        """The event of ``count`` queries answered with vote noise σ (vote units); it reads the
        plan's noise kind, scale and sensitivities, never its ``noise_total``."""
        raise AlgorithmError(f"{type(self).__name__} states no batch event")

    @property
    def vote_sensitivity(self) -> float:
        """s of the data-dependent bound: the L2 change of one agent's vote."""
        return 1.0


@dataclass(frozen=True, slots=True)
class VoteScale:
    """The votes' scale 2^``scale_bits``, their per-query sensitivities (ring units), and the
    rule that chose the scale (for the calibration record)."""

    scale_bits: int
    l1_sensitivity: float
    l2_sensitivity: float
    rule: str


class VotingTask(TaskParams):
    """What every voter is told: the round's public query indices and how to vote."""

    model: str = Field(min_length=1)
    num_classes: int = Field(ge=2)
    queries: tuple[int, ...] = Field(min_length=1)
    public_size: int = Field(ge=1)
    level: Literal["agent", "instance"]
    vote_share: float = Field(default=1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _queries_in_range(self) -> VotingTask:
        if len(set(self.queries)) != len(self.queries):
            raise ValueError("queries: contains duplicates")
        if min(self.queries) < 0 or max(self.queries) >= self.public_size:
            raise ValueError(f"queries: every index must lie in [0, {self.public_size})")
        # the unit states the votes' relation in the agent's ledger and the level their
        # sensitivities: agent-level votes recorded under a record unit would be composed as
        # replace-one releases with add/remove sensitivities (docs/accounting.md, section (d))
        if (self.level == "agent") != (self.unit == "agent"):
            raise ValueError(f"level {self.level!r} does not fit privacy unit {self.unit!r}")
        if self.vote_share < 1 and self.level != "agent":
            raise ValueError("vote_share: capped votes are only defined at agent level")
        return self

    @property
    def vote_cap(self) -> int:
        """The most of this round's queries the agent votes on (every other row is zero)."""
        return vote_cap(len(self.queries), self.vote_share)

    @property
    def job_key(self) -> str:
        """The job's stable id when the shell sent it, else its name."""
        return self.job_id or self.job


SpecT = TypeVar("SpecT", bound=VotingJob, default=VotingJob)
PlanT = TypeVar("PlanT", bound=VotingPlan, default=VotingPlan)
TaskT = TypeVar("TaskT", bound=VotingTask, default=VotingTask)


class VotingCoordinator(CoordinatorSide[SpecT, PlanT, TaskT]):
    """The shared coordinator side of the voting algorithms: every agent votes on the round's
    batch of public queries; the student is trained on the confident labels at the end."""

    @abc.abstractmethod
    def _task(self, common: VotingTask) -> TaskT:
        """The round's task: ``common`` (the fields every voting task carries) plus the
        subclass's own."""

    @abc.abstractmethod
    def _student_recipe(self) -> tuple[int, int, float]:
        """``(epochs, batch_size, learning_rate)`` of the student."""

    def initial_state(self, data: CoordinatorData) -> CoordinatorState:
        spec, d = self.spec, self.details
        if data.public_x is None or len(data.public_x) == 0:
            raise AlgorithmError(f"{self.name} needs a public pool (data.public)")
        if data.num_classes != d.num_classes:
            raise AlgorithmError(
                f"the data has {data.num_classes} classes, the plan {d.num_classes}"
            )
        size = len(data.public_x)
        if spec.params.queries > size:
            raise AlgorithmError(
                f"params.queries = {spec.params.queries} exceeds the {size} public examples"
            )
        # the public split is public: a seeded choice made from it alone costs no privacy
        order = select_queries(
            np.asarray(data.public_x),
            spec.params.queries,
            method=spec.params.query_selection,
            seed=spec.seed,
        )
        return CoordinatorState(
            model=None,
            model_version=0,
            details={
                "public_size": size,
                "query_order": [int(i) for i in order],
                "answered": [],
                "labels": [],
                "rounds": [],
            },
        )

    def select(self, *, round_number: int, population: Sequence[str]) -> list[str]:
        return list(population)  # every agent votes; no sampling, no amplification

    def _batch(self, state: CoordinatorState, round_number: int) -> list[int]:
        sizes = self._sizes(round_number)
        start = sum(sizes[: round_number - 1])
        order = state.details.get("query_order")
        if not isinstance(order, list) or len(order) != self.spec.params.queries:
            raise AlgorithmError("the coordinator state holds no query order")
        return [int(i) for i in order[start : start + sizes[round_number - 1]]]

    def _sizes(self, round_number: int) -> list[int]:
        if not 1 <= round_number <= self.spec.rounds:
            raise AlgorithmError(f"round {round_number} outside 1..{self.spec.rounds}")
        return batch_sizes(self.spec.params.queries, self.spec.rounds)

    def round_task(self, state: CoordinatorState, *, round_number: int) -> RoundTask:
        spec, d = self.spec, self.details
        batch = self._batch(state, round_number)
        common = VotingTask(
            **self.task_params(round_number).model_dump(exclude_none=True),
            model=spec.model,
            num_classes=d.num_classes,
            queries=tuple(batch),
            public_size=state.details["public_size"],
            level=d.level,
            vote_share=d.vote_share,
        )
        return RoundTask(
            params=self._task(common),
            vector_length=len(batch) * d.num_classes,
            model_version=None,
            needs_public_data=True,
        )

    def ring(self, *, batch: int, participants: int, min_survivors: int) -> EncodingConfig:
        """The encoding of ``batch`` votes of ``participants`` agents, ``min_survivors`` of
        them summed."""
        noise = common.split_noise(
            self.details,
            dropout_fraction=self.spec.secagg.dropout_fraction,
            participants=participants,
            min_survivors=min_survivors,
        )
        return common.ring_encoding(
            clip=vote_clip(batch),
            scale_bits=self.details.scale_bits,
            participants=participants,
            noise=noise,
        )

    def encoding(self, task: RoundTask, *, participants: int, min_survivors: int) -> EncodingConfig:
        classes = self.details.num_classes
        if task.vector_length < classes or task.vector_length % classes:
            raise AlgorithmError(
                f"vector length {task.vector_length} is not a multiple of {classes}"
            )
        if not 1 <= min_survivors <= participants:
            raise AlgorithmError(
                f"min_survivors {min_survivors} must lie in [1, participants={participants}]"
            )
        return self.ring(
            batch=task.vector_length // classes,
            participants=participants,
            min_survivors=min_survivors,
        )

    def round_event(self, *, queries: int) -> DpEvent:
        """The event of one committed round answering ``queries`` queries: each voter moves at
        most the plan's cap of them."""
        return self.details.batch_event(self.details.charged(queries), self.plan.noise_multiplier)

    def round_charge(self, *, round_number: int, population: Sequence[str]) -> RoundCharge:
        """Each voter pays the event of the round's batch of queries."""
        spec, d = self.spec, self.details
        sizes = self._sizes(round_number)
        charge = ClientCharge(
            event=self.round_event(queries=sizes[round_number - 1]),
            unit=spec.privacy.unit,
            approximate=d.noise == "gaussian",
            secure_aggregation=d.secure_aggregation,
            honest_fraction=spec.privacy.honest_fraction if d.secure_aggregation else 1.0,
        )
        return RoundCharge(charge, tuple(population))

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
        batch = self._batch(state, round_number)
        classes = d.num_classes
        votes = common.checked_aggregate(
            aggregate, length=len(batch) * classes, survivors=survivors
        ).reshape(len(batch), classes)
        labels = votes.argmax(axis=1)
        top2 = np.sort(votes, axis=1)[:, -2:]
        margins = np.clip((top2[:, 1] - top2[:, 0]) / survivors, 0.0, 1.0)
        answered = [*state.details.get("answered", []), *batch]
        all_labels = [*state.details.get("labels", []), *(int(v) for v in labels)]
        rounds = [
            *state.details.get("rounds", []),
            {"round": round_number, "survivors": survivors, "noisy_margins": margins.tolist()},
        ]
        details = {**state.details, "answered": answered, "labels": all_labels, "rounds": rounds}
        metrics: dict[str, float] = {
            "survivors": float(survivors),
            "answered_queries": float(len(answered)),
        }
        if data.public_y is not None:
            truth = np.asarray(data.public_y)[answered]
            metrics["pseudo_label_accuracy"] = float(np.mean(truth == np.asarray(all_labels)))
        done = round_number >= spec.rounds
        model, version = state.model, state.model_version
        if done:
            kept = _confident(rounds, spec.params.student.min_margin, len(answered))
            metrics["student_labels"] = float(len(kept))
            model = self._train_student(
                data, [answered[i] for i in kept], [all_labels[i] for i in kept], metrics
            )
            version += 1
        return RoundOutcome(
            state=CoordinatorState(model=model, model_version=version, details=details),
            metrics=metrics,
            done=done,
        )

    def _train_student(
        self,
        data: CoordinatorData,
        answered: list[int],
        labels: list[int],
        metrics: dict[str, float],
    ) -> bytes:
        if data.public_x is None:
            raise AlgorithmError(f"{self.name} needs the public split to train the student")
        from dpfl.learning.params import model_to_bytes
        from dpfl.learning.training import train_student

        job = self.spec
        epochs, batch_size, learning_rate = self._student_recipe()
        net = common.build_model(job.model, data.input_shape, data.num_classes, seed=job.seed)
        student = job.params.student
        pool = np.asarray(data.public_x)
        try:
            if student.method == "supervised":
                train_student(
                    net,
                    pool[answered],
                    np.asarray(labels, dtype=np.int64),
                    epochs=epochs,
                    batch_size=batch_size,
                    learning_rate=learning_rate,
                    seed=job.seed,
                )
            else:
                from dpfl.learning.semisupervised import train_semi_supervised

                report = train_semi_supervised(
                    net,
                    pool[answered],
                    np.asarray(labels, dtype=np.int64),
                    pool,
                    method=student.method,
                    steps=student.steps,
                    batch_size=batch_size,
                    unlabeled_ratio=student.unlabeled_ratio,
                    learning_rate=learning_rate,
                    threshold=student.threshold,
                    unlabeled_weight=student.unlabeled_weight,
                    vat_epsilon=student.vat_epsilon,
                    self_training_rounds=student.self_training_rounds,
                    augment=student.augment,
                    seed=job.seed,
                )
                metrics["student_confident_fraction"] = report.confident_fraction
                metrics["student_labelled_fit"] = report.labelled_fit
                metrics["student_restarts"] = float(report.restarts)
        except LearningError as exc:
            raise AlgorithmError(f"student training failed: {exc}") from exc
        metrics.update(common.evaluate_on_test(net, data))
        return model_to_bytes(net, metadata={"model": job.model, "algorithm": self.name})

    def informational_data_dependent_event(self, state: CoordinatorState) -> DpEvent | None:
        """The data-dependent bound from the NOISY margins: informational only (module docs).

        It speaks about releasing the pseudo-labels (the argmax), not the histogram the
        coordinator saw, and its margins are those of the noisy sums; it is itself a function
        of private data. Never charge or enforce budgets with it.
        """
        d = self.details
        rounds = state.details.get("rounds", [])
        events: list[DpEvent] = [
            DataDependentVotingEvent(
                margins=tuple(r["noisy_margins"]),
                num_agents=int(r["survivors"]),
                num_classes=d.num_classes,
                sigma=self.plan.noise_multiplier,
                s=d.vote_sensitivity,
                level=d.level,
            )
            for r in rounds
            if r["noisy_margins"]
        ]
        return ComposedEvent(tuple(events)) if events else None

    # -- agent side (shared checks) ----------------------------------------------------------


class VotingAgent(AgentSide[TaskT]):
    """The shared checks of a voting agent."""

    def _claimed(
        self, events: Sequence[DpEvent], encoding: EncodingConfig, counts: common.Counts
    ) -> DpEvent:
        """The checks every voting agent makes before its own claim check; returns the one
        claimed event."""
        task = self.task
        count = len(task.queries)  # the encoding's clip bounds the whole uncapped block
        event = common.one_claimed_event(
            events, algorithm=self.name, task_honest_fraction=task.honest_fraction, **counts
        )
        if encoding.scale_bits != task.scale_bits or encoding.clip != vote_clip(count):
            raise AlgorithmError(
                f"the encoding (clip {encoding.clip:g}, scale 2^{encoding.scale_bits}) does not "
                f"fit {count} votes at scale 2^{task.scale_bits}"
            )
        return event

    def _per_query(self, event: DpEvent) -> DpEvent:
        """The one query's release of a claimed round: as many as the rows this agent may
        move (its cap of the round's queries)."""
        count = self.task.vote_cap
        if not isinstance(event, SelfComposedEvent) or event.count != count:
            raise AlgorithmError(f"expected {count} per-query events, got {event!r}")
        return event.event

    def compute(
        self,
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> npt.NDArray[np.float64]:
        """The flattened ``Q_r × C`` votes, every row beyond the task's cap set to zero: the
        cap is enforced here, for every voting algorithm, whatever its ballots."""
        votes, keys = self.ballots(data, model=model, public_x=public_x, device=device)
        flat: npt.NDArray[np.float64] = capped(votes, keys, self.task.vote_cap).reshape(-1)
        return flat

    @abc.abstractmethod
    def ballots(
        self,
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> tuple[npt.NDArray[np.float64], tuple[npt.NDArray[np.float64], ...]]:
        """The ``Q_r × C`` votes before the cap (zero rows abstain), and the keys that rank
        the rows to keep under it (most important first, higher first)."""

    def _public_queries(
        self, public_x: npt.NDArray[np.float32] | None, data_classes: int
    ) -> npt.NDArray[np.float32]:
        task = self.task
        if public_x is None or len(public_x) != task.public_size:
            raise AlgorithmError(
                f"{self.name} needs the job's {task.public_size} public examples, got "
                f"{'none' if public_x is None else len(public_x)}"
            )
        if data_classes != task.num_classes:
            raise AlgorithmError(
                f"the agent's data has {data_classes} classes, the task {task.num_classes}"
            )
        return np.asarray(public_x)[list(task.queries)]


class VotingAlgorithm(Algorithm[SpecT, PlanT, TaskT]):
    """The plan of the voting algorithms: calibrated on a job's whole set of queries."""

    coordinator_type: ClassVar[type[VotingCoordinator[Any, Any, Any]]]

    @abc.abstractmethod
    def _vote_scale(self, job: SpecT, *, classes: int, level: str) -> VoteScale:
        """The votes' scale and per-query sensitivities."""

    @abc.abstractmethod
    def _plan_details(self, job: SpecT, common: VotingPlan) -> PlanT:
        """The plan: ``common`` (the fields every voting plan carries) plus the subclass's
        own."""

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self.narrow_for_plan(job, population)
        p, privacy = spec.params, spec.privacy
        _, classes = common.data_shape(spec, data)
        level: Literal["agent", "instance"] = "agent" if privacy.unit == "agent" else "instance"
        scale = self._vote_scale(spec, classes=classes, level=level)
        fields = VotingPlan(
            model=spec.model,
            num_classes=classes,
            queries=p.queries,
            batch_sizes=tuple(batch_sizes(p.queries, spec.rounds)),
            level=level,
            scale_bits=scale.scale_bits,
            l1_sensitivity=scale.l1_sensitivity,
            l2_sensitivity=scale.l2_sensitivity,
            vote_share=p.vote_share,
            noise=privacy.noise,
            noise_total=1.0,  # batch_event never reads the total
            secure_aggregation=spec.secagg.enabled,
            honest_fraction=privacy.honest_fraction,
            corrupt_fraction=spec.secagg.corrupt_fraction,
        )
        shape = self._plan_details(spec, fields)
        given = p.sigma if p.sigma is not None else privacy.noise_multiplier
        charged = sum(shape.charged(b) for b in shape.batch_sizes)
        sigma, record = common.calibrate_or_check(
            lambda s: shape.batch_event(charged, s),
            given=given,
            target_epsilon=privacy.target_epsilon,
            delta=privacy.delta,
        )
        u = math.ldexp(1.0, shape.scale_bits)
        total = (sigma * u) ** 2 / 2.0 if privacy.noise == "skellam" else sigma * u
        record["scale_bits_rule"] = scale.rule
        plan = JobPlan(sigma, record, population, shape.model_copy(update={"noise_total": total}))
        survivors = max(1, math.ceil(population * (1.0 - spec.secagg.dropout_fraction)))
        self.coordinator_type(self, spec, plan, plan.details).ring(
            batch=max(shape.batch_sizes),
            participants=population,
            min_survivors=survivors,
        )
        return plan


#: What the agent recomputes a voting claim's sensitivities from.
SOURCE = "the task (level, vote kind and scale)"


def _confident(rounds: list[dict[str, Any]], min_margin: float, answered: int) -> list[int]:
    """The indices of the answered queries whose noisy margin reaches ``min_margin`` (all with
    0): a function of the released histograms only, in answering order.

    Raises:
        AlgorithmError: margins that do not match the answered queries, or none kept.
    """
    margins = [float(m) for r in rounds for m in r.get("noisy_margins", [])]
    if len(margins) != answered:
        raise AlgorithmError(
            f"the state records {len(margins)} vote margins for {answered} answered queries"
        )
    kept = [i for i, m in enumerate(margins) if m >= min_margin]
    if not kept:
        raise AlgorithmError(
            f"params.student.min_margin {min_margin:g}: no answered query reaches it, the "
            "student would have no label"
        )
    return kept
