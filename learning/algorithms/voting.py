"""What PATE-FL and Private-kNN-FL share: noisy vote histograms on public queries, pseudo-labels and
a student.

Each subclass supplies how an agent votes and what one agent's vote can change (per-query
sensitivities and event); this module batches the job's public queries over the rounds, takes
the argmax of each decoded noisy sum, trains the student after the last round, and charges every
summed voter exactly the round's answered queries (docs/algorithms.md#pate-fl).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from dpfl.accounting import ComposedEvent, DataDependentVotingEvent, DpEvent
from dpfl.learning.algorithms import common
from dpfl.learning.algorithms.base import (
    Algorithm,
    AlgorithmError,
    ClientCharge,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundOutcome,
    RoundTask,
)
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec
from dpfl.secagg.encoding import EncodingConfig
from dpfl.secagg.errors import ParameterError

__all__ = ["VotingAlgorithm", "batch_sizes", "vote_clip"]

_CLIP_SLACK = 1.0 + 1e-9  # the block norm √Q_r must never trigger the encoding's clip


def batch_sizes(queries: int, rounds: int) -> list[int]:
    """``queries`` split into ``rounds`` batches differing by at most one (larger first)."""
    base, extra = divmod(queries, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def vote_clip(batch: int) -> float:
    """The encoding's clip for ``batch`` votes of L2 norm ≤ 1 each (never binding)."""
    return math.sqrt(batch) * _CLIP_SLACK


class VotingAlgorithm(Algorithm):
    """The shared coordinator side and agent-side checks of the voting algorithms."""

    #: The job variant this algorithm runs.
    job_type: ClassVar[type]

    def _job(self, job: JobSpec) -> Any:
        if not isinstance(job, self.job_type):
            raise AlgorithmError(f"{self.name} cannot run a {type(job).__name__}")
        return job

    # -- what a subclass defines -------------------------------------------------------------

    @abc.abstractmethod
    def _vote_details(self, job: Any, *, classes: int, level: str) -> dict[str, Any]:
        """Plan details of the votes: at least ``scale_bits``, ``l1_sensitivity``,
        ``l2_sensitivity`` (per query, ring units) and ``scale_bits_rule`` (for the record)."""

    @abc.abstractmethod
    def _batch_event(self, details: Mapping[str, Any], count: int, sigma: float) -> DpEvent:
        """The event of ``count`` queries answered with vote noise σ (vote units)."""

    @abc.abstractmethod
    def _task_extras(self, job: Any, plan: JobPlan) -> dict[str, Any]:
        """The subclass's own task parameters."""

    @abc.abstractmethod
    def _student_recipe(self, job: Any) -> dict[str, Any]:
        """``{"epochs", "batch_size", "learning_rate"}`` of the student."""

    @abc.abstractmethod
    def _vote_sensitivity(self, plan: JobPlan) -> float:
        """s of the data-dependent bound: the L2 change of one agent's vote (1, or 1/k)."""

    # -- coordinator side --------------------------------------------------------------------

    def plan(
        self, job: JobSpec, *, population: int, data: CoordinatorData | None = None
    ) -> JobPlan:
        spec = self._job(job)
        if isinstance(population, bool) or not isinstance(population, int) or population < 1:
            raise AlgorithmError(f"population must be an integer >= 1, got {population!r}")
        p, privacy = spec.params, spec.privacy
        _, classes = common.data_shape(spec, data)
        level = "agent" if privacy.unit == "agent" else "instance"
        votes = self._vote_details(spec, classes=classes, level=level)
        rule = votes.pop("scale_bits_rule")
        details: dict[str, Any] = {
            "model": spec.model,
            "num_classes": classes,
            "queries": p.queries,
            "batch_sizes": batch_sizes(p.queries, spec.rounds),
            "level": level,
            **votes,
            "noise": privacy.noise,
            "secure_aggregation": spec.secagg.enabled,
            "honest_fraction": privacy.honest_fraction,
            "corrupt_fraction": spec.secagg.corrupt_fraction,
        }
        given = p.sigma if p.sigma is not None else privacy.noise_multiplier
        sigma, record = common.calibrate_or_check(
            lambda s: self._batch_event(details, p.queries, s),
            given=given,
            target_epsilon=privacy.target_epsilon,
            delta=privacy.delta,
        )
        u = math.ldexp(1.0, int(details["scale_bits"]))
        details["noise_total"] = (sigma * u) ** 2 / 2.0 if privacy.noise == "skellam" else sigma * u
        record["scale_bits_rule"] = rule
        plan = JobPlan(
            noise_multiplier=sigma, calibration=record, population=population, details=details
        )
        self._check_ring(spec, plan, population)
        return plan

    def _check_ring(self, job: Any, plan: JobPlan, population: int) -> None:
        survivors = max(1, math.ceil(population * (1.0 - job.secagg.dropout_fraction)))
        task = RoundTask(
            params={}, vector_length=max(plan.details["batch_sizes"]) * self._classes(plan)
        )
        self.encoding(job, plan, task, participants=population, min_survivors=survivors)

    @staticmethod
    def _classes(plan: JobPlan) -> int:
        return int(plan.details["num_classes"])

    def initial_state(self, job: JobSpec, plan: JobPlan, data: CoordinatorData) -> CoordinatorState:
        spec = self._job(job)
        if data.public_x is None or len(data.public_x) == 0:
            raise AlgorithmError(f"{self.name} needs the public split (data.public_fraction > 0)")
        if data.num_classes != self._classes(plan):
            raise AlgorithmError(
                f"the data has {data.num_classes} classes, the plan {self._classes(plan)}"
            )
        size = len(data.public_x)
        if spec.params.queries > size:
            raise AlgorithmError(
                f"params.queries = {spec.params.queries} exceeds the {size} public examples"
            )
        # the public split is public: a seeded (non-secret) choice of queries costs no privacy
        order = np.random.default_rng(spec.seed).permutation(size)[: spec.params.queries]
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

    def select(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> list[str]:
        self._job(job)
        return list(population)  # every agent votes; no sampling, no amplification

    def _batch(self, job: Any, state: CoordinatorState, round_number: int) -> list[int]:
        sizes = batch_sizes(job.params.queries, job.rounds)
        if not 1 <= round_number <= job.rounds:
            raise AlgorithmError(f"round {round_number} outside 1..{job.rounds}")
        start = sum(sizes[: round_number - 1])
        order = state.details.get("query_order")
        if not isinstance(order, list) or len(order) != job.params.queries:
            raise AlgorithmError("the coordinator state holds no query order")
        return [int(i) for i in order[start : start + sizes[round_number - 1]]]

    def round_task(
        self, job: JobSpec, plan: JobPlan, state: CoordinatorState, *, round_number: int
    ) -> RoundTask:
        spec = self._job(job)
        batch = self._batch(spec, state, round_number)
        d = plan.details
        params = {
            "algorithm": self.name,
            "job": spec.name,
            "round": round_number,
            "model": spec.model,
            "num_classes": d["num_classes"],
            "queries": batch,
            "public_size": state.details["public_size"],
            "level": d["level"],
            "scale_bits": d["scale_bits"],
            "noise": d["noise"],
            "noise_total": d["noise_total"],
            "noise_multiplier": plan.noise_multiplier,
            "secure_aggregation": d["secure_aggregation"],
            "honest_fraction": d["honest_fraction"],
            "unit": spec.privacy.unit,
            "delta": spec.privacy.delta,
            **self._task_extras(spec, plan),
        }
        return RoundTask(
            params=params,
            vector_length=len(batch) * self._classes(plan),
            model_version=None,
            needs_public_data=True,
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
        classes = self._classes(plan)
        if task.vector_length < classes or task.vector_length % classes:
            raise AlgorithmError(
                f"vector length {task.vector_length} is not a multiple of {classes}"
            )
        if not 1 <= min_survivors <= participants:
            raise AlgorithmError(
                f"min_survivors {min_survivors} must lie in [1, participants={participants}]"
            )
        d = plan.details
        noise = common.per_agent_noise(
            kind=common.NOISE_KINDS[str(d["noise"])],
            total=float(d["noise_total"]),
            secure_aggregation=bool(d["secure_aggregation"]),
            honest_fraction=float(d["honest_fraction"]),
            min_survivors=min_survivors,
            participants=participants,
            dropout_fraction=spec.secagg.dropout_fraction,
        )
        try:
            return EncodingConfig.for_summands(
                clip=vote_clip(task.vector_length // classes),
                scale_bits=int(d["scale_bits"]),
                summands=participants,
                noise=noise,
            )
        except ParameterError as exc:
            raise AlgorithmError(f"no ring holds this round's vote sum: {exc}") from exc

    def round_event(self, plan: JobPlan, *, queries: int) -> DpEvent:
        """The event of one committed round answering ``queries`` queries."""
        return self._batch_event(plan.details, queries, plan.noise_multiplier)

    def invitation_events(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> tuple[DpEvent, ...]:
        """The round's event (its batch of queries), as :meth:`charges` charges each voter."""
        spec = self._job(job)
        sizes = batch_sizes(spec.params.queries, spec.rounds)
        if not 1 <= round_number <= spec.rounds:
            raise AlgorithmError(f"round {round_number} outside 1..{spec.rounds}")
        return (self.round_event(plan, queries=sizes[round_number - 1]),)

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
        sizes = batch_sizes(spec.params.queries, spec.rounds)
        if not 1 <= round_number <= spec.rounds:
            raise AlgorithmError(f"round {round_number} outside 1..{spec.rounds}")
        secure = bool(plan.details["secure_aggregation"])
        charge = ClientCharge(
            event=self.round_event(plan, queries=sizes[round_number - 1]),
            unit=spec.privacy.unit,
            approximate=plan.details["noise"] == "gaussian",
            secure_aggregation=secure,
            honest_fraction=spec.privacy.honest_fraction if secure else 1.0,
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
        batch = self._batch(spec, state, round_number)
        classes = self._classes(plan)
        votes = np.asarray(aggregate, dtype=np.float64)
        if votes.shape != (len(batch) * classes,):
            raise AlgorithmError(
                f"aggregate of shape {votes.shape}, expected ({len(batch) * classes},)"
            )
        if not np.isfinite(votes).all() or survivors < 1:
            raise AlgorithmError("aggregate contains NaN or infinity, or nobody voted")
        votes = votes.reshape(len(batch), classes)
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
            model = self._train_student(spec, data, answered, all_labels, metrics)
            version += 1
        return RoundOutcome(
            state=CoordinatorState(model=model, model_version=version, details=details),
            metrics=metrics,
            done=done,
        )

    def _train_student(
        self,
        job: Any,
        data: CoordinatorData,
        answered: list[int],
        labels: list[int],
        metrics: dict[str, float],
    ) -> bytes:
        if data.public_x is None:
            raise AlgorithmError(f"{self.name} needs the public split to train the student")
        from dpfl.learning.params import model_to_bytes
        from dpfl.learning.training import train_student

        recipe = self._student_recipe(job)
        net = common.build_model(job.model, data.input_shape, data.num_classes, seed=job.seed)
        try:
            train_student(
                net,
                np.asarray(data.public_x)[answered],
                np.asarray(labels, dtype=np.int64),
                epochs=recipe["epochs"],
                batch_size=recipe["batch_size"],
                learning_rate=recipe["learning_rate"],
                seed=job.seed,
            )
        except LearningError as exc:
            raise AlgorithmError(f"student training failed: {exc}") from exc
        metrics.update(common.evaluate_on_test(net, data))
        return model_to_bytes(net, metadata={"model": job.model, "algorithm": self.name})

    def informational_data_dependent_event(
        self, plan: JobPlan, state: CoordinatorState
    ) -> DpEvent | None:
        """The data-dependent bound from the NOISY margins: informational only (module docs).

        It speaks about releasing the pseudo-labels (the argmax), not the histogram the
        coordinator saw, and its margins are those of the noisy sums; it is itself a function
        of private data. Never charge or enforce budgets with it.
        """
        rounds = state.details.get("rounds", [])
        events: list[DpEvent] = [
            DataDependentVotingEvent(
                margins=tuple(r["noisy_margins"]),
                num_agents=int(r["survivors"]),
                num_classes=self._classes(plan),
                sigma=plan.noise_multiplier,
                s=self._vote_sensitivity(plan),
                level="agent" if plan.details["level"] == "agent" else "instance",
            )
            for r in rounds
            if r["noisy_margins"]
        ]
        return ComposedEvent(tuple(events)) if events else None

    # -- agent side (shared checks) ----------------------------------------------------------

    def _parse_common(self, params: Mapping[str, Any]) -> tuple[common.TaskParams, dict[str, Any]]:
        p = common.TaskParams(params, algorithm=self.name)
        public_size = p.integer("public_size", minimum=1)
        return p, {
            "job_key": p.optional_text("job_id") or p.text("job"),
            "model": p.text("model"),
            "num_classes": p.integer("num_classes", minimum=2),
            "queries": p.integers("queries", below=public_size),
            "public_size": public_size,
            "level": p.text("level", choices=("agent", "instance")),
            "scale_bits": p.integer("scale_bits", minimum=0),
            "noise": p.text("noise", choices=tuple(common.NOISE_KINDS)),
            "secure_aggregation": p.flag("secure_aggregation"),
            "honest_fraction": p.number("honest_fraction", low=0.0, high=1.0),
        }

    def _check_round(
        self,
        task: Mapping[str, Any],
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> DpEvent:
        """The checks every voting agent makes before its own claim check; returns the one
        claimed event."""
        count = len(task["queries"])
        event = common.one_claimed_event(
            events,
            algorithm=self.name,
            task_honest_fraction=task["honest_fraction"],
            honest_fraction=honest_fraction,
            num_clients=num_clients,
            min_survivors=min_survivors,
        )
        if encoding.scale_bits != task["scale_bits"] or encoding.clip != vote_clip(count):
            raise AlgorithmError(
                f"the encoding (clip {encoding.clip:g}, scale 2^{encoding.scale_bits}) does not "
                f"fit {count} votes at scale 2^{task['scale_bits']}"
            )
        return event

    def _check_noise(
        self,
        task: Mapping[str, Any],
        total: float,
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> None:
        """The encoding's per-agent noise carries ``total`` and the ring holds the sum."""
        common.check_encoding(
            encoding,
            kind=common.NOISE_KINDS[task["noise"]],
            total=total,
            secure_aggregation=task["secure_aggregation"],
            honest_fraction=honest_fraction,
            min_survivors=min_survivors,
            num_clients=num_clients,
        )

    @staticmethod
    def _public_queries(
        task: Mapping[str, Any], public_x: npt.NDArray[np.float32] | None, name: str
    ) -> npt.NDArray[np.float32]:
        if public_x is None or len(public_x) != task["public_size"]:
            raise AlgorithmError(
                f"{name} needs the job's {task['public_size']} public examples, got "
                f"{'none' if public_x is None else len(public_x)}"
            )
        return np.asarray(public_x)[task["queries"]]


def same_sensitivity(name: str, claimed: float, actual: float) -> None:
    """Refuse a claimed per-query sensitivity that is not the task's (relative 1e-12)."""
    common.check_sensitivity(
        f"per-query {name}", claimed, actual, source="the task (level, vote kind and scale)"
    )
