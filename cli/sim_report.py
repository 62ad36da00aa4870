"""How ``dpfl simulate`` and ``dpfl demo`` show a simulation: a progress bar, then the summary.

The simulation itself is the library's (:mod:`dpfl.simulation`); this module only turns its
round reports and :class:`~dpfl.simulation.SimulationResult` into what the commands print, and
the run into their exit code.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING

from dpfl.simulation import Simulation, SimulationResult

if TYPE_CHECKING:
    from rich.console import Console

    from dpfl.server.orchestrator import RoundReport

__all__ = [
    "EPSILON_ROWS",
    "epsilon_rows",
    "invitations",
    "run_command",
    "run_with_progress",
    "summary",
]


def run_command(
    name: str, main: Coroutine[object, None, SimulationResult], *, json_line: bool
) -> int:
    """Run a simulation command (``dpfl simulate``, ``dpfl demo``) to its exit code: 0 when the
    job completed, 1 when it did not or on an error (named on stderr), 130 on Ctrl-C; with
    ``json_line`` the result's JSON line ends stdout."""
    try:
        result = asyncio.run(main)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if json_line:
        print(result.to_json(), flush=True)
    return 0 if result.status == "completed" else 1


async def run_with_progress(
    sim: Simulation, console: Console, *, description: str
) -> SimulationResult:
    """Run ``sim`` with a progress bar (one step a round) on ``console``, then print the
    summary; the caller closes ``sim`` (``dpfl simulate`` and ``dpfl demo``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
    ) as bar:
        task = bar.add_task(description, total=sim.job.rounds, status="")

        def progress(report: RoundReport) -> None:
            if report.completed:
                acc = report.metrics.get("accuracy")
                survivors = int(report.metrics.get("survivors", 0))
                summed = f"{survivors} agents summed" if survivors else "round completed"
                text = summed if acc is None else f"{summed}, accuracy {acc:.3f}"
                bar.update(task, advance=1, status=text)
            elif report.skipped:
                bar.update(task, advance=1, status="skipped (too few sampled)")
            else:
                bar.update(task, status=f"aborted: {report.reason[:60]}")

        result = await sim.run(progress=progress)
    summary(console, result)
    return result


#: At most this many rows in the summary's ε table (``--json`` lists every client).
EPSILON_ROWS = 20


def epsilon_rows(epsilon: Mapping[str, float]) -> list[tuple[str, str]]:
    """The summary's ε table: clients whose ε prints the same share one row (``100 clients
    (agent-0 … agent-99)``), largest ε first; past :data:`EPSILON_ROWS` distinct values the
    smallest are summed up in a last row."""
    groups: dict[str, list[str]] = {}
    order: dict[str, float] = {}
    for client, value in sorted(epsilon.items()):
        shown = f"{value:.3f}" if math.isfinite(value) else "inf"
        groups.setdefault(shown, []).append(client)
        order[shown] = value if math.isfinite(value) else math.inf
    ranked = sorted(groups, key=lambda shown: -order[shown])
    rows = []
    for shown in ranked[:EPSILON_ROWS]:
        clients = groups[shown]
        if len(clients) == 1:
            rows.append((clients[0], shown))
        else:
            span = (
                f"{clients[0]}, {clients[1]}"
                if len(clients) == 2
                else (f"{clients[0]} … {clients[-1]}")
            )
            rows.append((f"{len(clients)} clients ({span})", shown))
    rest = ranked[EPSILON_ROWS:]
    if rest:
        count = sum(len(groups[shown]) for shown in rest)
        low, high = rest[-1], rest[0]
        rows.append((f"{count} more clients (--json lists each)", f"{low} – {high}"))
    return rows


def summary(console: Console, result: SimulationResult) -> None:
    """Accuracy and a per-client ε table."""
    from rich.table import Table

    eps = sorted(result.epsilon.values())
    title = (
        f"{result.job} ({result.algorithm}): {result.status}, "
        f"{result.rounds_completed} rounds, {result.wall_s:.1f} s"
    )
    table = Table(title=title)
    table.add_column("client")
    table.add_column(f"ε at δ={result.delta:g}", justify="right")
    for clients, shown in epsilon_rows(result.epsilon):
        table.add_row(clients, shown)
    console.print(table)
    accuracy = "n/a" if result.accuracy is None else f"{result.accuracy:.4f}"
    z = "n/a" if result.noise_multiplier is None else f"{result.noise_multiplier:.4g}"
    console.print(
        f"test accuracy {accuracy}; ε per client: max {max(eps, default=0):.3f}, "
        f"min {min(eps, default=0):.3f}; noise multiplier {z}"
    )
    if result.claimed_epsilon is not None:
        console.print(
            f"claimed ε {result.claimed_epsilon:.3f} (not a bound, not charged: {result.claim})"
        )
    extra = {k: v for k, v in result.metrics.items() if k not in ("accuracy", "survivors")}
    if extra:
        console.print("last round: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(extra.items())))
    recipe(console, result)
    invitations(console, result)
    if result.stop is not None:
        hint = _STOP_HINTS.get(result.stop.kind, "")
        console.print(
            f"[red]stopped early ({result.stop.kind}) after {result.rounds_completed} of "
            f"{result.rounds_planned} rounds: {result.stop.message}{hint}"
        )
    elif result.error:
        console.print(f"[red]job error: {result.error}")


#: What to change when a job stops for a client budget (printed after the reason).
_STOP_HINTS = {
    "budget_exhausted": " (the clients' coordinator-side budget: --budget-epsilon)",
}

#: The flag that sets each rule of the agents' local policy, named next to its declines.
_RULE_FLAGS = {
    "max_epsilon_per_job": "--agent-max-epsilon-per-job",
    "max_epsilon_total": "--agent-max-epsilon-total",
}


def recipe(console: Console, result: SimulationResult) -> None:
    """What the job left to defaults, and what a recipe search chose (docs/utility.md#recipes)."""
    if result.recipe is None:
        return
    chosen = result.recipe.chosen
    if chosen is not None:
        best = next(t for t in chosen.trials if t.name == chosen.chosen)
        console.print(
            f"recipe chosen on {chosen.proxy}: {chosen.chosen} (validation accuracy "
            f"{best.validation_accuracy:.4f}"
            + (f", the mean of {len(best.runs)} runs" if len(best.runs) > 1 else "")
            + f"; {len(chosen.trials)} candidates; dpfl recipe)"
        )
    defaults = result.recipe.defaults_used()
    if defaults:
        console.print("defaults used: " + ", ".join(defaults) + " (their values: dpfl recipe JOB)")


def invitations(console: Console, result: SimulationResult) -> None:
    """Invitations sent, accepted, declined per rule of the agents' policy, unanswered, and
    members the coordinator left out for their budget."""
    inv = result.invitations
    if inv.sent == 0 and inv.excluded_over_budget == 0:
        return
    console.print(
        f"invitations: {inv.sent} sent, {inv.accepted} accepted, {inv.declined} declined, "
        f"{inv.no_answer} unanswered; {inv.excluded_over_budget} left out by the coordinator "
        "(client budget spent)"
    )
    for rule, count in inv.declined_by_rule.items():
        flag = _RULE_FLAGS.get(rule)
        where = f" (agents' local policy; {flag})" if flag else ""
        console.print(f"  declined {count}× by {rule}{where}: e.g. {inv.example.get(rule, '')!r}")
