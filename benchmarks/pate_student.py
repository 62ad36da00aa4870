"""PATE-FL accuracy of a job in one process: the real teachers, votes, student and charges,
with the secure sum replaced by the plain sum plus its Gaussian noise (what the coordinator
decodes), so one core can measure a 100-agent MNIST job.

Prints ONE JSON line: test accuracy, pseudo-label accuracy, σ, the composed ε at the job's δ,
and wall times. Usage: ``python benchmarks/pate_student.py JOB.yaml [--agents 100]
[--seed S] [--threads 1]``. Settings and results:
docs/performance.md#pate-fl-accuracy-benchmarkspate_studentpy.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from dpfl.accounting import ComposedEvent, compute_epsilon
from dpfl.learning.algorithms.federation import simulated_federation
from dpfl.learning.algorithms.pate_fl import ALGORITHM, PateFlJob
from dpfl.learning.jobs import load_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="override the job's seed")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    job = load_job(args.job)
    if args.seed is not None:
        job = job.model_copy(update={"seed": args.seed})
    if not isinstance(job, PateFlJob) or job.privacy.noise != "gaussian":
        raise SystemExit("the benchmark takes a pate-fl job with privacy.noise: gaussian")
    start = time.perf_counter()
    data, agents = simulated_federation(job, args.agents)
    plan = ALGORITHM.plan(job, population=args.agents, data=data)
    state = ALGORITHM.initial_state(job, plan, data)
    sigma = plan.noise_multiplier * math.ldexp(1.0, ALGORITHM.details(plan).scale_bits)
    noise = np.random.default_rng([job.seed, 7])
    events, teachers_s, metrics = [], 0.0, {}
    for r in range(1, job.rounds + 1):
        task = ALGORITHM.round_task(job, plan, state, round_number=r)
        params = ALGORITHM.parse_task(task.params.to_json())
        t = time.perf_counter()
        total = sum(
            ALGORITHM.agent_compute(params, a, model=None, public_x=data.public_x, device="cpu")
            for a in agents.values()
        )
        teachers_s += time.perf_counter() - t
        noisy = np.asarray(total) + noise.normal(0.0, sigma, size=task.vector_length)
        events.append(ALGORITHM.round_event(plan, queries=len(params.queries)))
        outcome = ALGORITHM.finish_round(
            job, plan, state, data, round_number=r, aggregate=noisy, survivors=len(agents)
        )
        state, metrics = outcome.state, outcome.metrics
    epsilon = compute_epsilon(ComposedEvent(tuple(events)), delta=job.privacy.delta).epsilon
    line = {
        "job": job.name,
        "seed": job.seed,
        "agents": args.agents,
        "queries": job.params.queries,
        "query_selection": job.params.query_selection,
        "student": job.params.student.method,
        "sigma": round(plan.noise_multiplier, 4),
        "epsilon": round(epsilon, 4),
        "delta": job.privacy.delta,
        "accuracy": metrics.get("accuracy"),
        "pseudo_label_accuracy": metrics.get("pseudo_label_accuracy"),
        "teachers_s": round(teachers_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
