"""``dpfl audit``: run a job in simulation with canaries and print ε_lower beside the ledger's ε.

The job runs with N simulated agents through the algorithm's own coordinator and agent functions
(:mod:`dpfl.learning.audit.run`); two one-run bounds turn the canary guesses into ε_lower (the
(ε, δ) claim) and μ_lower with its ε at δ (the μ-GDP claim). ``--database-url`` stores the run
and attaches the audit to it. The ``--json`` line and the exit codes:
docs/audit.md#output---json-and-exit-codes.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dpfl.cmdline import Subparsers

__all__ = ["register", "run_command"]


def register(subparsers: Subparsers) -> None:
    """Add ``audit``."""
    p = subparsers.add_parser(
        "audit",
        help="empirical privacy audit: a lower bound on ε from one simulated run with canaries",
        description="Run JOB in simulation with canaries at its protected unit and print a "
        "high-confidence lower bound on ε (one-run auditing) next to the ledger's ε.",
    )
    p.add_argument("job", metavar="JOB", help="job file (YAML)")
    p.add_argument("--agents", type=int, required=True, metavar="N", help="simulated agents")
    p.add_argument(
        "--canaries",
        type=int,
        metavar="M",
        help="canaries (default: 1000, or one per coordinate of the job's released vector when "
        "it has fewer)",
    )
    p.add_argument(
        "--mode",
        choices=("white-box", "black-box"),
        default="white-box",
        help="score from every aggregate the coordinator sees, or from the final model only",
    )
    p.add_argument("--confidence", type=float, default=0.95, help="of the bound (0.95)")
    p.add_argument(
        "--guesses", type=int, metavar="R", help="number of guesses (default: from the plan)"
    )
    p.add_argument("--seed", default="dpfl-audit-default-seed", help="seed of the run (≥16 bytes)")
    p.add_argument("--device", default="cpu", help="where agents compute (cpu)")
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the folder holding mnist/, fashion-mnist/ and usps/, for jobs that read them "
        "(default: $DPFL_DATA_DIR)",
    )
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="store the audited run as a job with its ledger, and the audit with it "
        "(sqlite:///path or postgresql://...)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from dpfl.accounting import AccountingError
    from dpfl.learning.audit import TooManyCanariesError, run_audit
    from dpfl.learning.errors import LearningError
    from dpfl.learning.jobs import load_job
    from dpfl.server.errors import StoreError

    if not 0.0 < args.confidence < 1.0:
        return _fail(f"--confidence must lie in (0, 1), got {args.confidence}")
    if args.canaries is not None and args.canaries < 2:
        return _fail(f"--canaries must be at least 2, got {args.canaries}")
    if len(args.seed.encode()) < 16:
        return _fail("--seed needs at least 16 bytes")
    from dpfl.simulation.data_location import locate_job_data, using_data_dir

    try:
        job = load_job(args.job)
        data_folder = locate_job_data(job, args.data_dir, given_as="--data-dir")
    except (LearningError, ValueError, OSError) as exc:
        return _fail(str(exc))
    try:
        with using_data_dir(data_folder):
            report = run_audit(
                job,
                agents=args.agents,
                canaries=args.canaries,
                mode=args.mode,
                confidence=args.confidence,
                seed=args.seed.encode(),
                guesses=args.guesses,
                device=args.device,
            )
    except TooManyCanariesError as exc:
        return _fail(
            f"{exc.count} canaries need {exc.count} distinct coordinates of the job's "
            f"released vector, which has {exc.available}: pass --canaries {exc.available} or "
            "fewer (or leave --canaries out: the default fits the job)"
        )
    except (LearningError, AccountingError, ValueError, OSError) as exc:
        return _fail(str(exc))
    stored: dict[str, Any] | None = None
    if args.database_url is not None:
        try:
            stored = _store(args.database_url, job, report)
        except (StoreError, ValueError) as exc:
            return _fail(f"could not store the audit: {exc}")
    if args.json:
        print(json.dumps({**report.to_json(), "stored": stored}, sort_keys=True))
    else:
        _print_report(report, stored)
    return 0


def _fail(message: str) -> int:
    """Exit status 2 for a refused argument or a run that could not be audited."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def _print_report(report: Any, stored: dict[str, Any] | None) -> None:
    print(
        f"{report.job} ({report.algorithm}, {report.unit} level, {report.relation}), "
        f"{report.mode} audit with {report.canaries} canaries ({report.included} included), "
        f"{report.rounds} rounds"
    )
    print(f"  canaries:   {report.design}")
    print(f"  guesses:    {report.correct} correct of {report.guesses}")
    print(
        f"  ε_lower = {report.epsilon_lower:.4f}  (confidence {report.confidence}, "
        f"δ = {report.delta:g})"
    )
    print(
        f"  ε_lower = {report.epsilon_lower_gdp:.4f}  (μ-GDP claim: μ_lower = "
        f"{report.mu_lower:.4f}, {report.gdp_correct} correct of {report.gdp_guesses})"
    )
    print(f"  ε_upper = {report.epsilon_upper:.4f}  (the ledger's charge for a canary's unit)")
    if stored is not None:
        print(
            f"  stored:     job {stored['job_id']}, audit {stored['audit_id']}; the ledger's "
            f"ε_upper = {stored['epsilon_upper_ledger']:.4f}"
        )
    if report.epsilon_lower > report.epsilon_upper:
        print("  VIOLATION: the measured lower bound exceeds the charged ε")


def _store(url: str, job: Any, report: Any) -> dict[str, Any]:
    """Record the run and its audit in the store at ``url`` (:mod:`dpfl.server.audit_run`)."""
    from dpfl.server.audit_run import record_audited_run
    from dpfl.server.store import open_store

    with open_store(url) as store:
        recorded = record_audited_run(store, job, report)
    return {
        "job_id": recorded.job.id,
        "audit_id": recorded.audit.id,
        "epsilon_upper_ledger": recorded.audit.figures.epsilon_upper,
    }
