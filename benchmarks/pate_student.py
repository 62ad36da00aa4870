"""PATE-FL accuracy of a job in one process: the real teachers, votes, student and charges,
with the secure sum replaced by the plain sum plus its Gaussian noise (what the coordinator
decodes), so one core can measure a 100-agent MNIST job.

Prints one JSON line per ``--queries`` value (default: the job's; the teachers are trained once
and reused): test accuracy, pseudo-label accuracy, σ, the composed ε at the job's δ,
``validation_accuracy`` (the student on every 10th record the simulated agents hold, at most
5000: a validation split for choosing ``--queries``, never the test split), and wall times.
Usage: ``python benchmarks/pate_student.py JOB.yaml [--agents 100]
[--seed S] [--threads 1] [--queries 100,200] [--students JSON]`` (``--students``: student
variants to compare on the validation split with the same teachers). Settings and results:
docs/performance.md#pate-fl-accuracy-benchmarkspate_studentpy.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.accounting import ComposedEvent, DpEvent, compute_epsilon
from dpfl.learning.algorithms.base import AgentData, CoordinatorData
from dpfl.learning.algorithms.parts.data_sizes import simulated_federation
from dpfl.learning.algorithms.pate_fl import ALGORITHM, PateFlJob
from dpfl.learning.jobs import load_job
from dpfl.learning.models import build_model
from dpfl.learning.params import model_from_bytes
from dpfl.learning.training import evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="override the job's seed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--queries", default="", help="comma-separated query counts to try")
    parser.add_argument(
        "--students",
        default="",
        help="a JSON list of params.student overrides to try, e.g. "
        '\'[{"steps": 4000}, {"method": "vat"}]\' (the teachers are trained once)',
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    job = load_job(args.job)
    if args.seed is not None:
        job = job.model_copy(update={"seed": args.seed})
    if not isinstance(job, PateFlJob) or job.privacy.noise != "gaussian":
        raise SystemExit("the benchmark takes a pate-fl job with privacy.noise: gaussian")
    data, agents = simulated_federation(job, args.agents)
    counts = [int(q) for q in args.queries.split(",") if q] or [job.params.queries]
    students = json.loads(args.students) if args.students else [{}]
    if not isinstance(students, list) or not all(isinstance(s, dict) for s in students):
        raise SystemExit("--students must be a JSON list of objects")
    for count in counts:
        for override in students:
            student = job.params.student.model_validate(
                {**job.params.student.model_dump(), **override}
            )
            params = job.params.model_copy(update={"queries": count, "student": student})
            print(json.dumps(run(job.model_copy(update={"params": params}), data, agents)))


def run(job: PateFlJob, data: CoordinatorData, agents: dict[str, AgentData]) -> dict[str, Any]:
    """One whole job; its teachers come from the process's cache when an earlier run trained
    them (same job name, recipe and data)."""
    start = time.perf_counter()
    plan = ALGORITHM.plan(job, population=len(agents), data=data)
    state = ALGORITHM.bind(job, plan).initial_state(data)
    sigma = plan.noise_multiplier * math.ldexp(1.0, plan.details.scale_bits)
    noise = np.random.default_rng([job.seed, 7])
    events: list[DpEvent] = []
    teachers_s, metrics = 0.0, {}
    for r in range(1, job.rounds + 1):
        task = ALGORITHM.bind(job, plan).round_task(state, round_number=r)
        params = ALGORITHM.parse_task(task.params.to_json())
        t = time.perf_counter()
        total = sum(
            ALGORITHM.agent(params).compute(a, model=None, public_x=data.public_x, device="cpu")
            for a in agents.values()
        )
        teachers_s += time.perf_counter() - t
        noisy = np.asarray(total) + noise.normal(0.0, sigma, size=task.vector_length)
        events.append(ALGORITHM.bind(job, plan).round_event(queries=len(params.queries)))
        outcome = ALGORITHM.bind(job, plan).finish_round(
            state, data, round_number=r, aggregate=noisy, survivors=len(agents)
        )
        state, metrics = outcome.state, outcome.metrics
    assert state.model is not None
    student = model_from_bytes(
        state.model,
        model=build_model(job.model, input_shape=data.input_shape, num_classes=data.num_classes),
    )
    held = [(a.x[::10], a.y[::10]) for a in agents.values()]
    vx = np.concatenate([x for x, _ in held])[:5000]
    vy = np.concatenate([y for _, y in held])[:5000]
    validation = evaluate(student, vx, vy, device="cpu").accuracy
    epsilon = compute_epsilon(ComposedEvent(tuple(events)), delta=job.privacy.delta).epsilon
    return {
        "job": job.name,
        "seed": job.seed,
        "agents": len(agents),
        "queries": job.params.queries,
        "query_selection": job.params.query_selection,
        "student": job.params.student.model_dump(),
        "sigma": round(plan.noise_multiplier, 4),
        "epsilon": round(epsilon, 4),
        "delta": job.privacy.delta,
        "accuracy": metrics.get("accuracy"),
        "pseudo_label_accuracy": metrics.get("pseudo_label_accuracy"),
        "validation_accuracy": validation,
        "teachers_s": round(teachers_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
    }


if __name__ == "__main__":
    main()
