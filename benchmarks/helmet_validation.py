"""Validation accuracy of DP-Helmet recipes on MNIST, never reading the test split.

The job (``benchmarks/utility/mnist-dp-helmet.yaml``) holds out its public pool as a run does;
``--validation`` of the remaining training images (drawn with ``--split-seed``) are the
validation set and the rest is split over ``--agents`` agents. Each agent trains with DP-Helmet's
own learner on the map fitted on the public pool; the plan of the recipe (with M the smallest
share) gives σ and the sensitivity s, and the average of the agents' models gets Gaussian noise
of std ``σ·s/N`` per coordinate, the summed noise divided by the N averaged agents, over
``--noise-draws`` draws. Prints ONE JSON line per recipe. Results and the choice they led to:
docs/features.md#measurements.
Usage: ``python benchmarks/helmet_validation.py [--quick] [--recipes FILE.jsonl]``; a recipe is a
JSON object of the job's ``params`` to override (``public_kmeans`` merges into the job's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from dpfl.learning.algorithms.base import CoordinatorData
from dpfl.learning.algorithms.dp_helmet import ALGORITHM, DpHelmetJob
from dpfl.learning.algorithms.parts.extractors import build_extractor, fit_artifact, is_learned
from dpfl.learning.algorithms.parts.helmet_training import augment_and_clip, predict, train
from dpfl.learning.data import Dataset, load_dataset
from dpfl.learning.data.partition import IidPartition, federate
from dpfl.learning.jobs import parse_job

JOB = Path(__file__).parent / "utility" / "mnist-dp-helmet.yaml"
# docs/features.md's softmax table, row by row; {loss: softmax, regularization: 0.0007} on the
# job's map is the job's own recipe
_SMALL = {"centroids": 128, "dim": 64}
RECIPES: tuple[dict[str, Any], ...] = (
    {"loss": "huber", "regularization": 0.002, "public_kmeans": _SMALL},
    {"loss": "logistic", "regularization": 0.002, "public_kmeans": _SMALL},
    *(
        {"loss": "softmax", "regularization": lam, "public_kmeans": _SMALL}
        for lam in (0.003, 0.002, 0.001, 0.0005, 0.0003, 0.0002)
    ),
    {"loss": "softmax", "regularization": 0.0005, "epochs": 20, "public_kmeans": _SMALL},
    {"loss": "softmax", "regularization": 0.0005, "public_kmeans": {"centroids": 256, "dim": 64}},
    *({"loss": "softmax", "regularization": lam} for lam in (0.001, 0.0007, 0.0005, 0.0003)),
    *(
        {"loss": "softmax", "regularization": lam, "public_kmeans": {"dim": 256}}
        for lam in (0.001, 0.0007)
    ),
)
QUICK: dict[str, Any] = {
    "data": {"dataset": "digits", "partition": {"scheme": "iid"}, "public_fraction": 0.2},
    "params": {"epochs": 3, "public_kmeans": {"centroids": 16, "patch": 3, "stride": 1, "dim": 16}},
}
QUICK_RECIPES: tuple[dict[str, Any], ...] = (
    {"loss": "huber", "regularization": 0.05},
    {"loss": "softmax", "regularization": 0.05},
)


@dataclass(frozen=True)
class Split:
    """Indices into the data set's training split: the public pool, the validation set and
    each agent's share (disjoint; the test split is not among them)."""

    public: npt.NDArray[np.int64]
    validation: npt.NDArray[np.int64]
    shares: tuple[npt.NDArray[np.int64], ...]


def split(
    dataset: Dataset,
    *,
    public_fraction: float,
    data_seed: int,
    validation: int,
    agents: int,
    seed: int,
) -> Split:
    """The job's public pool (as :func:`federate` holds it out), then ``validation`` records of
    the rest drawn with ``seed``, then the rest split evenly over ``agents``."""
    fed = federate(
        dataset,
        scheme=IidPartition(),
        num_agents=1,
        seed=data_seed,
        public_fraction=public_fraction,
    )
    private = np.random.default_rng(seed).permutation(fed.agent_indices[0])
    if not 0 < validation < len(private) - agents:
        raise SystemExit(f"--validation {validation} leaves too few records for {agents} agents")
    shares = tuple(np.array_split(private[validation:], agents))
    return Split(fed.public_indices, private[:validation], shares)


def job_for(base: dict[str, Any], recipe: dict[str, Any], local_size: int) -> DpHelmetJob:
    """The job document with the recipe's params merged in and ``min_local_size`` = M."""
    doc = json.loads(json.dumps(base))
    params = doc.setdefault("params", {})
    for key, value in recipe.items():
        if isinstance(value, dict):
            params[key] = {**params.get(key, {}), **value}
        else:
            params[key] = value
    params["min_local_size"] = local_size
    job = parse_job(doc)
    assert isinstance(job, DpHelmetJob)
    return job


def evaluate(
    base: dict[str, Any], recipe: dict[str, Any], parts: Split, *, noise_draws: int, seed: int
) -> dict[str, Any]:
    """One recipe's validation accuracy with and without the plan's noise."""
    started = time.perf_counter()
    local_size = min(len(s) for s in parts.shares)
    job = job_for(base, recipe, local_size)
    dataset = load_dataset(job.data.dataset)
    x, y = dataset.x_train, dataset.y_train.astype(np.int64)
    shape, classes = tuple(dataset.input_shape), dataset.num_classes
    coordinator = CoordinatorData(shape, classes, public_x=x[parts.public])
    plan = ALGORITHM.plan(job, population=len(parts.shares), data=coordinator)
    details = plan.details
    features = details.features
    artifact, learned = (
        fit_artifact(features, coordinator) if is_learned(features) else (None, None)
    )
    extractor = build_extractor(
        features, shape, artifact=artifact, sha256=learned.sha256 if learned else None
    )
    p = job.params
    models = [
        train(
            augment_and_clip(extractor(x[share]), p.input_clip),
            y[share],
            num_classes=classes,
            loss=p.loss,
            regularization=p.regularization,
            radius=p.radius,
            huber_h=p.huber_h,
            clip=p.input_clip,
            epochs=p.epochs,
            seed=seed,
        )
        for share in parts.shares
    ]
    average = np.mean(models, axis=0)
    std = plan.noise_multiplier * details.sensitivity / len(parts.shares)
    inputs = augment_and_clip(extractor(x[parts.validation]), p.input_clip)
    truth = y[parts.validation]
    noisy = [
        float(np.mean(predict(average + rng.normal(0.0, std, average.shape), inputs) == truth))
        for rng in (np.random.default_rng(seed * 1000 + k) for k in range(noise_draws))
    ]
    return {
        "recipe": recipe,
        "features": features,
        "local_size": local_size,
        "noise_multiplier": plan.noise_multiplier,
        "sensitivity": details.sensitivity,
        "noise_std": std,
        "validation_accuracy": float(np.mean(noisy)),
        "without_noise": float(np.mean(predict(average, inputs) == truth)),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small digits smoke run")
    parser.add_argument("--recipes", type=Path, default=None, help="JSON lines of params")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--validation", type=int, default=5000, help="validation records")
    parser.add_argument("--split-seed", type=int, default=123)
    parser.add_argument("--noise-draws", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1, help="the learners' order seed")
    args = parser.parse_args(argv)
    base = yaml.safe_load(JOB.read_text())
    recipes = list(RECIPES)
    if args.quick:
        base = {**base, "data": QUICK["data"]}
        base["params"] = {**base["params"], **QUICK["params"]}
        recipes = list(QUICK_RECIPES)
        args.agents, args.validation = 10, 200
    if args.recipes is not None:
        lines = args.recipes.read_text().splitlines()
        recipes = [json.loads(line) for line in lines if line.strip()]
    parts = split(
        load_dataset(base["data"]["dataset"]),
        public_fraction=float(base["data"]["public_fraction"]),
        data_seed=int(base["data"].get("seed", 0)),
        validation=args.validation,
        agents=args.agents,
        seed=args.split_seed,
    )
    out = []
    for recipe in recipes:
        row = evaluate(base, recipe, parts, noise_draws=args.noise_draws, seed=args.seed)
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
