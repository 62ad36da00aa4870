"""How good PATE-FL's student can be when every pseudo-label is right.

The student of a voting job learns from the answered queries' labels and the unlabeled public
pool. Whatever the teachers and the noise, its accuracy cannot exceed what the same student
reaches on the same queries with the true labels. This script measures that ceiling on a data
set's validation split (its ``holdout`` view: the test split is never read): a pool of
``--pool`` validation records stands for the public pool, the queries are picked from it as
the job picks them (k-means on the records), the student is the MNIST recipe's (cnn,
consistency training on the whole pool, ``MNIST_TEACHERS``'s steps, batch and rate), trained
on the queries with their true labels, and it is scored on the validation records outside the
pool. One JSON line per query count and seed. Run: ``python benchmarks/student_ceiling.py``
(Fashion-MNIST, 100 and 400 queries, 3 seeds: about 8 minutes a run on one core), or
``--quick`` (digits, 40 queries of a pool of 100, 200 steps: seconds).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.pate_fl import MNIST_TEACHERS
from dpfl.learning.algorithms.voting import select_queries
from dpfl.learning.data import load_dataset
from dpfl.learning.jobs import StudentSpec
from dpfl.learning.semisupervised import train_semi_supervised
from dpfl.learning.training import evaluate


def recipe() -> tuple[StudentSpec, int, float]:
    """The MNIST recipe's student, batch size and learning rate."""
    student, batch, rate = (
        MNIST_TEACHERS[k] for k in ("student", "batch_size", "student_learning_rate")
    )
    return StudentSpec.model_validate(student), int(str(batch)), float(str(rate))


def ceiling(
    dataset: str, *, queries: int, pool: int, seed: int, steps: int | None
) -> dict[str, Any]:
    """One student on ``queries`` truly labelled k-means queries of a ``pool`` of validation
    records, scored on the validation records outside the pool."""
    start = time.perf_counter()
    view = load_dataset(f"{dataset}?holdout=0.1&holdout_seed=0")
    x, y = np.asarray(view.x_test), np.asarray(view.y_test, dtype=np.int64)
    if pool >= len(x) or queries > pool:
        raise SystemExit(
            f"a pool of {pool} records holding {queries} queries, with records left to score"
            f" the student on, needs more than the {len(x)} records of the validation split"
        )
    order = np.random.default_rng(seed).permutation(len(x))
    public, scored = order[:pool], order[pool:]
    px = x[public]
    asked = select_queries(px.reshape(pool, -1), queries, method="kmeans", seed=seed)
    student, batch, rate = recipe()
    net = common.build_model("cnn", view.input_shape, view.num_classes, seed=seed)
    report = train_semi_supervised(
        net,
        px[asked],
        y[public][asked],
        px,
        method=student.method,
        steps=steps or student.steps,
        batch_size=batch,
        unlabeled_ratio=student.unlabeled_ratio,
        learning_rate=rate,
        threshold=student.threshold,
        unlabeled_weight=student.unlabeled_weight,
        augment=student.augment,
        seed=seed,
        device="cpu",
    )
    return {
        "dataset": dataset,
        "queries": queries,
        "pool": pool,
        "seed": seed,
        "student": student.method,
        "steps": steps or student.steps,
        "classes_asked": len(np.unique(y[public][asked])),
        "student_restarts": report.restarts,
        "validation_accuracy": round(evaluate(net, x[scored], y[scored], device="cpu").accuracy, 4),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--queries", default="100,400", help="comma-separated query counts")
    parser.add_argument("--pool", type=int, default=3000, help="the row's pool: 30 %% of 10 000")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--quick", action="store_true", help="digits, 40 queries, 200 steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    quick = args.quick
    counts = [40] if quick else [int(q) for q in args.queries.split(",") if q]
    for count in counts:
        for seed in (int(s) for s in args.seeds.split(",") if s):
            line = ceiling(
                "digits" if quick else args.dataset,
                queries=count,
                pool=100 if quick else args.pool,
                seed=seed,
                steps=200 if quick else args.steps,
            )
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
