"""``dpfl-agent status``: the agent's identity and the ε its data has spent (local ledger)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dpfl.client.errors import AgentError
from dpfl.client.policy import Policy
from dpfl.client.status import agent_status
from dpfl.cmdline import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show the agent's enrolment and the ε spent per job and in total",
        description="Read the state directory: enrolment, and the local ledger's ε per job and "
        "in total at the policy's δ, against the policy's budgets.",
    )
    parser.add_argument("--state-dir", required=True, type=Path, metavar="DIR")
    parser.add_argument("--policy", type=Path, metavar="FILE", help="the policy the agent runs")
    parser.add_argument("--delta", type=float, help="report ε at this δ (default: the policy's)")
    parser.add_argument("--json", action="store_true", help="one JSON object on standard output")
    parser.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    console = Console()
    try:
        status = agent_status(
            state_dir=args.state_dir, policy=Policy.load(args.policy), delta=args.delta
        )
    except AgentError as exc:
        Console(stderr=True).print(f"[red]dpfl-agent: {exc}[/red]", highlight=False)
        return exc.exit_code
    data = status.to_json()
    if args.json:
        print(json.dumps(data, sort_keys=True))
        return 0
    if data["agent_id"] is None:
        console.print(f"{data['state_dir']}: not enrolled yet")
    else:
        console.print(
            f"agent [bold]{data['agent_id']}[/bold] ({data['name']}) enrolled at "
            f"{data['coordinator']} on {data['enrolled_at']}",
            highlight=False,
        )
    table = Table(title=f"ε spent at δ = {status.delta:g}")
    for column in ("job", "rounds", "ε", "budget", "remaining"):
        table.add_column(column, justify="left" if column == "job" else "right")
    for job, row in data["jobs"].items():
        table.add_row(
            job,
            str(row["rounds"]),
            _num(row["epsilon"]),
            _num(data["max_epsilon_per_job"]),
            _num(row["remaining_epsilon"]),
        )
    table.add_row(
        "[bold]total[/bold]",
        str(sum(r["rounds"] for r in data["jobs"].values())),
        _num(data["epsilon_total"]),
        _num(data["max_epsilon_total"]),
        _num(data["remaining_epsilon_total"]),
    )
    console.print(table)
    return 0


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float | int) else str(value)
