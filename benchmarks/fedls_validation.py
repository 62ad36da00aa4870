"""Validation accuracy of the DP-Fed-LS rows' recipes on MNIST, never reading the test split.

``--validation`` of MNIST's training records (stratified, drawn with ``--split-seed``) become the
test set of an ``npz:`` copy of the training split, and the other records are the 1000 agents'
data; each recipe then runs as the benchmark runs a row (``dpfl.simulate``, the row's budgets),
for every ε of ``--epsilons``, every sampling of ``--samplings`` and ``--seeds`` seeds. A recipe
is a JSON object of the row's ``params`` to override (``sigma_ls`` among them; 0 is DP-FedAvg's
update). Prints ONE JSON line per (recipe, sampling, ε). Results and the choice they led to:
docs/algorithms.md#measured-recipes-mnist.
Usage: ``python benchmarks/fedls_validation.py [--quick] [--recipes FILE.jsonl] [--workers W]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import utility  # the benchmark's rows, beside this file

from dpfl.learning.data import load_dataset
from dpfl.learning.data.split import stratified_split

#: The recipes of docs/algorithms.md#measured-recipes-mnist: local rate, server rate (FedAvgM,
#: momentum 0.9) and smoothing; a grid, then around its best.
RECIPES: tuple[dict[str, Any], ...] = tuple(
    {
        "learning_rate": rate,
        "server_optimizer": {"kind": "momentum", "learning_rate": server, "momentum": 0.9},
        "sigma_ls": sigma,
    }
    for rate, server, sigma in [
        *((r, e, s) for r in (0.01, 0.03) for e in (1.0, 2.0) for s in (0.0, 1.0, 2.0)),
        (0.03, 1.0, 3.0),
        (0.03, 1.0, 4.0),
        (0.03, 2.0, 3.0),
        (0.03, 2.0, 4.0),
        (0.03, 3.0, 2.0),
        (0.03, 3.0, 3.0),
        *((0.1, e, s) for e in (1.0, 2.0) for s in (0.0, 3.0)),
    ]
)
QUICK_RECIPES: tuple[dict[str, Any], ...] = ({"sigma_ls": 0.0}, {"sigma_ls": 1.0})


def write_split(
    dataset: str, path: Path, *, validation: float, seed: int, data_dir: str | None
) -> tuple[int, int]:
    """``path``: an npz of ``dataset``'s training split whose test arrays are ``validation`` of
    its records (stratified, drawn with ``seed``) and whose training arrays are the rest; the
    test split is never loaded into it. Returns (training, validation) sizes."""
    data = load_dataset(dataset, data_dir=data_dir)
    train, held = stratified_split(data.y_train, test_fraction=validation, seed=seed)
    np.savez(
        path,
        x=data.x_train[train],
        y=data.y_train[train],
        x_test=data.x_train[held],
        y_test=data.y_train[held],
    )
    return len(train), len(held)


def rows_for(
    recipe: dict[str, Any], index: int, *, npz: Path, samplings: list[str], epsilons: list[float]
) -> list[utility.Row]:
    """The benchmark's DP-Fed-LS row for each sampling and ε, on the validation split, with
    ``recipe`` merged into its params."""
    out = []
    for sampling in samplings:
        for epsilon in epsilons:
            job = utility._fedls("dp-fed-ls", epsilon, sampling)
            job["params"] = utility.merge(job["params"], recipe)
            job["data"] = {**job["data"], "dataset": f"npz:{npz}"}
            name = f"recipe{index}-{sampling}-eps{epsilon:g}"
            job["name"] = name
            out.append(
                utility.Row(
                    name=name,
                    series=sampling,
                    job=job,
                    agents=1000,
                    epsilon=epsilon,
                    delta=utility.FEDLS_DELTA,
                    budget_epsilon=1000.0,
                    agent_max_epsilon=1000.0,
                    quick={
                        "data": {"dataset": f"npz:{npz}"},
                        "params": {"sampling_rate": 0.5, "local_epochs": 1, "learning_rate": 0.5},
                    },
                    quick_agents=10,
                )
            )
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small digits smoke run")
    parser.add_argument("--recipes", type=Path, default=None, help="JSON lines of params")
    parser.add_argument("--samplings", default="poisson,uniform")
    parser.add_argument("--epsilons", default="7", help="comma-separated ε (default 7)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--validation", type=float, default=0.1, help="fraction held out")
    parser.add_argument("--split-seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--data-dir", default=None, help="default: $DPFL_DATA_DIR")
    args = parser.parse_args(argv)
    recipes = list(QUICK_RECIPES if args.quick else RECIPES)
    if args.recipes is not None:
        lines = args.recipes.read_text(encoding="utf-8").splitlines()
        recipes = [json.loads(line) for line in lines if line.strip()]
    samplings = [s.strip() for s in args.samplings.split(",") if s.strip()]
    epsilons = [float(e) for e in args.epsilons.split(",") if e.strip()]
    if args.seeds < 1 or args.workers < 1 or not samplings or not epsilons:
        parser.error("--seeds and --workers must be >= 1, with a sampling and an ε")
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dpfl-fedls-validation-") as folder:
        npz = Path(folder) / "split.npz"
        sizes = write_split(
            "digits" if args.quick else "mnist",
            npz,
            validation=args.validation,
            seed=args.split_seed,
            data_dir=args.data_dir,
        )
        chosen = [
            (recipe, row)
            for i, recipe in enumerate(recipes)
            for row in rows_for(recipe, i, npz=npz, samplings=samplings, epsilons=epsilons)
        ]
        results = utility.run_rows(
            [row for _, row in chosen],
            list(range(1, args.seeds + 1)),
            quick=args.quick,
            data_dir=args.data_dir,
            workers=args.workers,
        )
        for (recipe, row), result in zip(chosen, results, strict=True):
            line = {
                "recipe": recipe,
                "sampling": row.series,
                "epsilon_target": row.epsilon,
                "epsilon": result.epsilon,
                "seeds": result.seeds,
                "validation_accuracies": result.accuracies,
                "mean": result.mean,
                "std": result.std,
                "declined": result.declined,
                "stop_reasons": result.stop_reasons,
                "training_records": sizes[0],
                "validation_records": sizes[1],
                "quick": args.quick,
                "wall_s": result.wall_s,
            }
            print(json.dumps(line), flush=True)
            out.append(line)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
