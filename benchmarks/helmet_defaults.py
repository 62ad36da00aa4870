"""DP-Helmet's default regularisation Λ and radius R, chosen on a validation split.

Digits, record level, ε = 4 at δ = 1e-5, 50 agents (iid), the defaults' other parameters
(Huber h = 0.1, c = 1, 10 epochs, identity features). The training split is cut into 80 % for the
agents and 20 % for validation (the test split is not used here). For each (Λ, R) every agent
trains its K models; the plan (``DpHelmet.plan`` with the smallest agent's M) gives σ and s;
the average of the agents' models gets Gaussian noise of std σ·s/N per coordinate (the summed
Skellam noise at these scales, divided by the N summed agents); validation accuracy is averaged
over noise seeds. Run: ``python benchmarks/helmet_defaults.py`` (about a minute).
"""

from __future__ import annotations

import itertools

import numpy as np

from dpfl.learning.algorithms.dp_helmet import ALGORITHM
from dpfl.learning.algorithms.parts.helmet_training import augment_and_clip, predict, train
from dpfl.learning.data import load_dataset
from dpfl.learning.jobs import parse_job

AGENTS = 50
EPSILON = 4.0
REGULARIZATIONS = (0.03, 0.1, 0.3, 1.0, 3.0)
RADII = (0.5, 1.0, 2.0, 5.0)
NOISE_SEEDS = 5


def validation_accuracy(regularization: float, radius: float, epochs: int = 10) -> float:
    ds = load_dataset("digits")
    x = ds.x_train.reshape(len(ds.x_train), -1)
    y = ds.y_train
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))
    training, val = order[:cut], order[cut:]
    shares = np.array_split(training, AGENTS)
    smallest = min(len(s) for s in shares)
    job = parse_job(
        {
            "name": "defaults",
            "algorithm": "dp-helmet",
            "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
            "privacy": {"unit": "record", "target_epsilon": EPSILON, "delta": 1e-5},
            "params": {
                "regularization": regularization,
                "radius": radius,
                "epochs": epochs,
                "min_local_size": smallest,
            },
        }
    )
    plan = ALGORITHM.plan(job, population=AGENTS)
    sigma, s = plan.noise_multiplier, plan.details.sensitivity
    models = [
        train(
            augment_and_clip(x[idx], 1.0),
            y[idx],
            num_classes=10,
            loss="huber",
            regularization=regularization,
            radius=radius,
            huber_h=0.1,
            clip=1.0,
            epochs=epochs,
            seed=0,
        )
        for idx in shares
    ]
    mean = np.mean(models, axis=0)
    inputs = augment_and_clip(x[val], 1.0)
    accuracies = []
    for seed in range(NOISE_SEEDS):
        noisy = mean + np.random.default_rng(100 + seed).normal(0, sigma * s / AGENTS, mean.shape)
        accuracies.append(float(np.mean(predict(noisy, inputs) == y[val])))
    return float(np.mean(accuracies))


def main() -> None:
    print(f"digits, {AGENTS} agents, eps = {EPSILON}: validation accuracy (mean of seeds)")
    for lam, r in itertools.product(REGULARIZATIONS, RADII):
        print(f"  regularization {lam:5g}  radius {r:4g}  {validation_accuracy(lam, r):.3f}")
    print(f"  former defaults (0.01, 5): {validation_accuracy(0.01, 5.0):.3f}")


if __name__ == "__main__":
    main()
