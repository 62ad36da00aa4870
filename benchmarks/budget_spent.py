"""Budget spent, RDP vs tight: the ledger's figure for the issue-31 rows, and rounds under a budget.

Each row is one client's history charged round by round; the ledger's figure
(``dpfl.accounting.history.history_figure``, what budgets are enforced on) is printed beside the
RDP sum of the same events. The last line counts the rounds of the demo job's charge at its
current noise (z = 1.533) that a budget of ε = 4 allows under each figure. Prints the markdown
table of docs/accounting.md ("Budget spent, RDP vs tight"), then one JSON line.

    python benchmarks/budget_spent.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from dpfl.accounting import (
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SkellamEvent,
    epsilon_from_rdp,
    rdp_curve,
)
from dpfl.accounting.history import EventMultiset, canonical_event, history_figure

#: The demo's DP-FedAvg sensitivities (digits logreg, d = 650, b = 10 bits).
DIMENSION, L1, L2 = 650, 26122.0, 1024.6


def skellam_round(rate: float, z: float) -> DpEvent:
    """One DP-FedAvg round: Poisson-sampled Skellam of variance (z·Δ₂)² (μ = (z·Δ₂)²/2)."""
    return PoissonSampledEvent(rate, SkellamEvent((z * L2) ** 2 / 2.0, L1, L2, DIMENSION))


@dataclass(frozen=True)
class Row:
    label: str
    event: DpEvent
    rounds: int
    delta: float


ROWS = (
    Row("the demo, q = 0.3, z = 1.533, 10 rounds, δ = 1e-5", skellam_round(0.3, 1.533), 10, 1e-5),
    Row(
        "q = 1e-4, z = 0.8, 10⁵ steps, δ = 1e-6",
        PoissonSampledEvent(1e-4, GaussianEvent.from_multiplier(0.8)),
        100_000,
        1e-6,
    ),
    Row(
        "subsampled Skellam, q = 0.001, z = 4, 100 rounds, δ = 1e-5",
        skellam_round(0.001, 4.0),
        100,
        1e-5,
    ),
)


def history(event: DpEvent, rounds: int) -> EventMultiset:
    """A DP-FedAvg client's history: ``rounds`` charges of ``event`` (agent add/remove)."""
    return EventMultiset().plus("agent/add_remove", canonical_event(event), rounds)


def spent(row: Row) -> tuple[float, float, str]:
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


def table() -> list[str]:
    """The markdown table of docs/accounting.md."""
    lines = ["| events | ledger before (RDP sum) | ledger now (tight) | method | RDP / tight |"]
    lines.append("|---|---|---|---|---|")
    for row in ROWS:
        rdp, tight, method = spent(row)
        lines.append(f"| {row.label} | {rdp:.4g} | {tight:.4g} | {method} | {rdp / tight:.2f}× |")
    return lines


def main() -> int:
    for line in table():
        print(line)
    demo = ROWS[0].event
    out = {
        "benchmark": "budget_spent",
        "demo_rounds_within_4_rdp": rounds_within(demo, 4.0, 1e-5, tight=False),
        "demo_rounds_within_4_tight": rounds_within(demo, 4.0, 1e-5, tight=True),
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
