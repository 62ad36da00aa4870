"""White-box one-run audit of DP-FedSGD (one local step, record level, Skellam): ε_lower against
the ledger's ε_upper. Prints ONE JSON line per point.

Usage: ``python benchmarks/audit.py [--canaries M] [--seeds K] [--plot audit.png]``.
Method, target and results: docs/audit.md#benchmark-benchmarksauditpy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from dpfl.learning.audit import run_audit
from dpfl.learning.audit.synthetic import synthetic_federation
from dpfl.learning.jobs import parse_job

EPSILONS = (1.0, 2.0, 4.0, 8.0)
TARGET_RATIO = 0.5
AGENTS, RECORDS = 4, 50


def job(epsilon: float) -> Any:
    return parse_job(
        {
            "name": f"audit-fedsgd-eps{epsilon:g}",
            "algorithm": "dp-fedsgd",
            "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
            "model": "logreg",
            "rounds": 1,
            "privacy": {
                "unit": "record",
                "target_epsilon": epsilon,
                "delta": 1e-5,
                "noise": "skellam",
            },
            "params": {
                "clip": 1.0,
                "local_steps": 1,
                "batch_sampling_rate": 1.0,
                "learning_rate": 0.5,
                "expected_batch_size": RECORDS,
                "max_local_size": RECORDS,
            },
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, default=3, help="runs per point (median reported)")
    parser.add_argument("--plot", help="write a PNG of ε_lower against ε_upper")
    args = parser.parse_args(argv)
    silent = (args.canaries + 1) // 2  # two classes: two weights per silent feature
    fed = synthetic_federation(
        agents=AGENTS, records_per_agent=RECORDS, informative=8, silent=silent, classes=2
    )
    points = []
    for epsilon in EPSILONS:
        started = time.perf_counter()
        reports = [
            run_audit(
                job(epsilon),
                agents=AGENTS,
                canaries=args.canaries,
                seed=f"dpfl-audit-benchmark-{epsilon:g}-{k}".encode(),
                coordinates=fed.silent_coordinates,
                data=(fed.coordinator, fed.agents),
                catch_all=False,
            )
            for k in range(args.seeds)
        ]
        # the CLI's default (the plan's count and r = m, union bound), same seeds: reported apart
        hedged = [
            run_audit(
                job(epsilon),
                agents=AGENTS,
                canaries=args.canaries,
                seed=f"dpfl-audit-benchmark-{epsilon:g}-{k}".encode(),
                coordinates=fed.silent_coordinates,
                data=(fed.coordinator, fed.agents),
            )
            for k in range(args.seeds)
        ]
        lower = statistics.median(r.epsilon_lower for r in reports)
        lower_gdp = statistics.median(r.epsilon_lower_gdp for r in reports)
        upper = reports[0].epsilon_upper
        point = {
            "benchmark": "audit",
            "algorithm": "dp-fedsgd",
            "mode": "white-box",
            "canaries": args.canaries,
            "confidence": reports[0].confidence,
            "delta": reports[0].delta,
            "epsilon_upper": upper,
            "epsilon_lower": lower,
            "epsilon_lower_runs": [r.epsilon_lower for r in reports],
            "guesses": [r.guesses for r in reports],
            "correct": [r.correct for r in reports],
            "ratio": lower / upper,
            "epsilon_lower_gdp": lower_gdp,
            "epsilon_lower_gdp_runs": [r.epsilon_lower_gdp for r in reports],
            "mu_lower_runs": [r.mu_lower for r in reports],
            "gdp_guesses": [r.gdp_guesses for r in reports],
            "gdp_correct": [r.gdp_correct for r in reports],
            "ratio_gdp": lower_gdp / upper,
            "cli_default_epsilon_lower": statistics.median(r.epsilon_lower for r in hedged),
            "cli_default_epsilon_lower_gdp": statistics.median(r.epsilon_lower_gdp for r in hedged),
            "target": TARGET_RATIO if epsilon <= 4 else None,
            "meets_target": (lower >= TARGET_RATIO * upper) if epsilon <= 4 else None,
            "meets_target_gdp": (lower_gdp >= TARGET_RATIO * upper) if epsilon <= 4 else None,
            "seconds_per_run": (time.perf_counter() - started) / (2 * args.seeds),
        }
        points.append(point)
        print(json.dumps(point), flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 4))
        uppers = [p["epsilon_upper"] for p in points]
        ax.plot(uppers, [p["epsilon_lower"] for p in points], "o-", label="ε_lower, (ε, δ) claim")
        ax.plot(
            uppers,
            [p["epsilon_lower_gdp"] for p in points],
            "s-",
            label="ε_lower, μ-GDP claim",
        )
        ax.plot(uppers, uppers, "k--", label="ε_upper (ledger)")
        ax.plot(uppers, [TARGET_RATIO * u for u in uppers], ":", label="0.5·ε_upper")
        ax.set_xlabel("ε_upper")
        ax.set_ylabel("ε")
        ax.set_title(f"DP-FedSGD white-box audit, m = {args.canaries}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
