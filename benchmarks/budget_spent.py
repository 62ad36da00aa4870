"""Budget spent, RDP vs tight: what the ledger charges one client of each utility-benchmark row.

For every row of ``benchmarks/utility.py`` (the table's rows; ``--all`` adds the extra ones,
``--rows`` names some) the row's job is planned as the benchmark's coordinator plans it (the
algorithm's ``plan`` for the row's population, noise calibrated on the tight figure), without
training: the plan reads the data set's shape and, where its sensitivity or normaliser needs them,
the agents' data sizes of the row's split, and nothing else. The round charges the coordinator
commits are then taken from the bound plan, round after round, for a client that takes part in
every round (the most charged one), and composed as the ledger composes a client's job
(``dpfl.accounting.history.history_figure``). Prints ONE JSON line per row: the noise the
calibration chose and the one a calibration on RDP alone would choose, and the RDP and tight ε of
the client's whole charge with ``budget_wasted`` = RDP / tight − 1. ``--markdown FILE`` also
writes the table of docs/accounting.md ("Budget spent, RDP vs tight").

``--issue-rows`` prints instead the table of three hand-picked histories (issue 31) and the rounds
of the demo's charge a budget of ε = 4 allows under each figure.

    python benchmarks/budget_spent.py [--rows NAME,...] [--all] [--markdown FILE] [--data-dir DIR]
    python benchmarks/budget_spent.py --issue-rows
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import utility  # the benchmark's rows, beside this file

from dpfl.accounting import (
    DpEvent,
    EpsilonReport,
    GaussianEvent,
    PoissonSampledEvent,
    SkellamEvent,
    calibrate_noise_multiplier,
    epsilon_from_rdp,
    rdp_curve,
)
from dpfl.accounting.history import ONE_JOB, EventMultiset, canonical_event, history_figure
from dpfl.learning.algorithms.base import AnyAlgorithm, JobPlan
from dpfl.learning.algorithms.parts import common
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.jobs import JobSpec
from dpfl.server.ledger_charges import store_charge
from dpfl.simulation import resolve_job
from dpfl.simulation.data_location import locate_job_data, using_data_dir

# -- the utility benchmark's rows ------------------------------------------------------------------


@dataclass(frozen=True)
class Spent:
    """One row's JSON line.

    ``noise_multiplier`` is the plan's (z, or the voting σ), calibrated on the tight figure as
    the coordinator does; ``rdp_noise_multiplier`` the same plan calibrated on RDP alone, and
    ``noise_saved`` = 1 − z / z_RDP. ``calibrated_epsilon`` is the plan's figure of the whole job
    (``claimed_epsilon``: DP-FedSGD's sum-dominating claim the noise was calibrated for, which is
    not charged). ``rdp_epsilon``, ``tight_epsilon`` and ``method`` are the ledger's figures of
    the client's ``charges`` round charges, ``events`` their distinct events with counts.
    """

    row: str
    series: str
    algorithm: str
    unit: str
    agents: int
    delta: float
    rounds: int
    target_epsilon: float | None
    noise_multiplier: float
    rdp_noise_multiplier: float
    noise_saved: float
    calibrated_epsilon: float
    claimed_epsilon: float | None
    charges: int
    rdp_epsilon: float
    tight_epsilon: float
    method: str
    budget_wasted: float | None
    events: list[dict[str, Any]]
    wall_s: float


@contextlib.contextmanager
def rdp_calibration() -> Iterator[None]:
    """Plans made meanwhile calibrate their noise on the RDP bound alone.

    Every algorithm's plan calibrates through ``common.calibrate_or_check``, which asks
    ``calibrate_noise_multiplier`` for the tight figure; this passes ``tight=False`` instead, so
    the whole plan (scale bits and all) is the one a ledger of RDP sums would have calibrated.
    :func:`rdp_plan` checks that the calibration went through here.
    """

    def on_rdp(make: Callable[[float], DpEvent], **options: Any) -> tuple[float, EpsilonReport]:
        return calibrate_noise_multiplier(make, **{**options, "tight": False})

    with mock.patch.object(common, "calibrate_noise_multiplier", on_rdp):
        yield


def calibration_method(plan: JobPlan) -> str:
    """The method the plan's noise was calibrated on (the claim's, for a claim the noise was
    calibrated for)."""
    record = plan.calibration
    calibrated = record.get("claim", record)
    return str(calibrated["method"])


def rdp_plan(algorithm: AnyAlgorithm, spec: JobSpec, population: int) -> JobPlan:
    """``spec``'s plan for ``population`` clients with the noise calibrated on RDP alone.

    Raises:
        RuntimeError: the calibration did not go through :func:`rdp_calibration`.
    """
    with rdp_calibration():
        plan = algorithm.plan(spec, population=population)
    if calibration_method(plan) != "rdp":
        raise RuntimeError(
            f"{spec.name}: the plan calibrated on {calibration_method(plan)!r}, not on RDP alone: "
            "its calibration no longer goes through common.calibrate_noise_multiplier"
        )
    return plan


def client_history(algorithm: AnyAlgorithm, spec: JobSpec, plan: JobPlan) -> EventMultiset:
    """What the ledger holds for one client of the job after its last round, the client taking
    part in every round: each round's charge as the coordinator commits it
    (``round_charge(...).charges(participants)``, then ``store_charge``), under the one
    relation of a job's own figure."""
    side = algorithm.bind(spec, plan)
    population = [f"agent-{i:04d}" for i in range(plan.population)]
    client = population[0]
    history = EventMultiset()
    for number in range(1, spec.rounds + 1):
        round_charge = side.round_charge(round_number=number, population=population)
        charge = round_charge.charges([client])[client]
        history = history.plus(
            ONE_JOB, canonical_event(store_charge(client, charge, own_noise_fraction=None).event)
        )
    return history


def spent_row(row: utility.Row, data_dir: str | None) -> Spent:
    """Plan ``row`` twice (tight and RDP calibration) and compose one client's charges."""
    started = time.monotonic()
    spec = resolve_job(row.document())
    algorithm: AnyAlgorithm = get_algorithm(spec.algorithm)
    with using_data_dir(locate_job_data(spec, data_dir, given_as="--data-dir")):
        plan = algorithm.plan(spec, population=row.agents)
        rdp = rdp_plan(algorithm, spec, row.agents)
    history = client_history(algorithm, spec, plan)
    delta = spec.privacy.delta
    figure = history_figure(history, delta)
    record = plan.calibration
    claim = record.get("claim")
    return Spent(
        row=row.name,
        series=row.series,
        algorithm=spec.algorithm,
        unit=spec.privacy.unit,
        agents=row.agents,
        delta=delta,
        rounds=spec.rounds,
        target_epsilon=spec.privacy.target_epsilon,
        noise_multiplier=plan.noise_multiplier,
        rdp_noise_multiplier=rdp.noise_multiplier,
        noise_saved=1.0 - plan.noise_multiplier / rdp.noise_multiplier,
        calibrated_epsilon=float(record["epsilon"]),
        claimed_epsilon=None if claim is None else float(claim["epsilon"]),
        charges=history.entries,
        rdp_epsilon=figure.rdp_epsilon,
        tight_epsilon=figure.epsilon,
        method=figure.method,
        budget_wasted=figure.rdp_epsilon / figure.epsilon - 1.0 if figure.epsilon > 0 else None,
        events=[{"count": count, "event": json.loads(text)} for (_, text), count in history.groups],
        wall_s=round(time.monotonic() - started, 3),
    )


def markdown(lines: Sequence[Spent]) -> list[str]:
    """The table of docs/accounting.md, one line per row."""
    out = [
        "| row | algorithm | δ | rounds | noise (tight calibration) | noise (RDP calibration) "
        "| noise saved | RDP ε | tight ε | method | budget wasted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in lines:
        wasted = "—" if s.budget_wasted is None else f"{100 * s.budget_wasted:.1f} %"
        out.append(
            f"| {s.row} | {s.algorithm} | {s.delta:.3g} | {s.rounds} | {s.noise_multiplier:.4g} "
            f"| {s.rdp_noise_multiplier:.4g} | {100 * s.noise_saved:.1f} % | {s.rdp_epsilon:.4g} "
            f"| {s.tight_epsilon:.4g} | {s.method} | {wasted} |"
        )
    return out


def choose_rows(names: str | None, every_row: bool) -> list[utility.Row]:
    """The rows named (comma-separated), else the table's rows (every row with ``every_row``).

    Raises:
        ValueError: an unknown name, or none.
    """
    rows = utility.rows()
    if names is None:
        return rows if every_row else [r for r in rows if not r.extra]
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {r.name: r for r in rows}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise ValueError(f"unknown rows {unknown}" if unknown else "no rows named")
    return [known[n] for n in wanted]


# -- the issue's hand-picked histories ----------------------------------------------------------

#: The demo's DP-FedAvg sensitivities (digits logreg, d = 650, b = 10 bits).
DIMENSION, L1, L2 = 650, 26122.0, 1024.6


def skellam_round(rate: float, z: float) -> DpEvent:
    """One DP-FedAvg round: Poisson-sampled Skellam of variance (z·Δ₂)² (μ = (z·Δ₂)²/2)."""
    return PoissonSampledEvent(rate, SkellamEvent((z * L2) ** 2 / 2.0, L1, L2, DIMENSION))


@dataclass(frozen=True)
class IssueRow:
    label: str
    event: DpEvent
    rounds: int
    delta: float


ISSUE_ROWS = (
    IssueRow(
        "the demo, q = 0.3, z = 1.533, 10 rounds, δ = 1e-5", skellam_round(0.3, 1.533), 10, 1e-5
    ),
    IssueRow(
        "q = 1e-4, z = 0.8, 10⁵ steps, δ = 1e-6",
        PoissonSampledEvent(1e-4, GaussianEvent.from_multiplier(0.8)),
        100_000,
        1e-6,
    ),
    IssueRow(
        "subsampled Skellam, q = 0.001, z = 4, 100 rounds, δ = 1e-5",
        skellam_round(0.001, 4.0),
        100,
        1e-5,
    ),
)


def history(event: DpEvent, rounds: int) -> EventMultiset:
    """A DP-FedAvg client's history: ``rounds`` charges of ``event`` (agent add/remove)."""
    return EventMultiset().plus("agent/add_remove", canonical_event(event), rounds)


def spent(row: IssueRow) -> tuple[float, float, str]:
    """(RDP sum, the ledger's figure, its method) after the row's rounds."""
    rdp = epsilon_from_rdp(row.rounds * rdp_curve(row.event), delta=row.delta)[0]
    figure = history_figure(history(row.event, row.rounds), row.delta)
    return rdp, figure.epsilon, figure.method


def rounds_within(event: DpEvent, budget: float, delta: float, *, tight: bool) -> int:
    """How many rounds of ``event`` a budget of ``budget`` at ``delta`` allows."""
    n = 0
    while True:
        if tight:
            eps = history_figure(history(event, n + 1), delta).epsilon
        else:
            eps = epsilon_from_rdp((n + 1) * rdp_curve(event), delta=delta)[0]
        if eps > budget:
            return n
        n += 1


def issue_table() -> list[str]:
    """The markdown table of the issue's histories in docs/accounting.md."""
    lines = ["| events | ledger before (RDP sum) | ledger now (tight) | method | RDP / tight |"]
    lines.append("|---|---|---|---|---|")
    for row in ISSUE_ROWS:
        rdp, tight, method = spent(row)
        lines.append(f"| {row.label} | {rdp:.4g} | {tight:.4g} | {method} | {rdp / tight:.2f}× |")
    return lines


def issue_rows() -> None:
    for line in issue_table():
        print(line)
    demo = ISSUE_ROWS[0].event
    out = {
        "benchmark": "budget_spent",
        "demo_rounds_within_4_rdp": rounds_within(demo, 4.0, 1e-5, tight=False),
        "demo_rounds_within_4_tight": rounds_within(demo, 4.0, 1e-5, tight=True),
    }
    print(json.dumps(out), flush=True)


# -- the command -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default=None, help="comma-separated utility row names")
    parser.add_argument("--all", action="store_true", help="the extra utility rows too")
    parser.add_argument("--data-dir", default=None, help="default: $DPFL_DATA_DIR")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here too")
    parser.add_argument(
        "--issue-rows", action="store_true", help="the issue's three histories instead"
    )
    args = parser.parse_args(argv)
    if args.issue_rows:
        issue_rows()
        return 0
    try:
        chosen = choose_rows(args.rows, args.all)
    except ValueError as exc:
        parser.error(f"{exc} (see benchmarks/utility.py --list)")
    lines = []
    for row in chosen:
        line = spent_row(row, args.data_dir)
        lines.append(line)
        print(json.dumps(asdict(line), allow_nan=False), flush=True)
    if args.markdown is not None:
        args.markdown.write_text("\n".join(markdown(lines)) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
