"""``dpfl budget``: how much privacy budget each client has spent, asked of a running coordinator.

Thin: one or two GETs on the coordinator's REST API (``/api/v1/clients`` or
``/api/v1/clients/{id}/budget``), printed as tables (rich) or, with ``--json``, as the API's own
JSON document. The admin token lists every client; a client's own API token (issued at
enrolment) reads only that client. The token can come from ``DPFL_TOKEN`` instead of the command
line (where other users of the machine could see it in the process list).

Exit codes: 0 success; 2 bad arguments or an answer the API refused as invalid (422); 3 the
token was refused (401) or may not read this (403); 4 no such client (404); 5 the coordinator
could not be reached or failed (5xx, not JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any
from urllib.parse import quote

TOKEN_ENV = "DPFL_TOKEN"
COORDINATOR_ENV = "DPFL_COORDINATOR_URL"
_EXIT = {401: 3, 403: 3, 404: 4, 422: 2}


class BudgetCommandError(Exception):
    """A failure to report, with the exit code it maps to."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def register(subparsers: Any) -> None:
    """Add ``budget``."""
    p = subparsers.add_parser(
        "budget",
        help="privacy budget spent and remaining per client, from a running coordinator",
        description="ε spent (an upper bound at δ), per job and in total, and the remaining "
        "budget: of every client (admin token) or of one client (its own token suffices).",
    )
    p.add_argument("client_id", nargs="?", metavar="CLIENT_ID", help="one client (default: all)")
    p.add_argument(
        "--coordinator",
        default=os.environ.get(COORDINATOR_ENV),
        metavar="URL",
        help=f"the coordinator's REST API, e.g. http://127.0.0.1:8080 (or ${COORDINATOR_ENV})",
    )
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        metavar="T",
        help=f"admin token or the client's API token (or ${TOKEN_ENV})",
    )
    p.add_argument("--delta", type=float, help="δ to report ε at (default: each budget's δ)")
    p.add_argument("--tight", action="store_true", help="also try the tight (PLD) bound")
    p.add_argument("--events", action="store_true", help="list every ledger event (one client)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait (default 10)")
    p.add_argument("--json", action="store_true", help="print the API's JSON document")
    p.set_defaults(func=_budget)


def base_url(coordinator: str) -> str:
    """``HOST:PORT`` or a URL, as the URL of the API root (no trailing slash)."""
    url = coordinator.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url


def fetch(
    coordinator: str,
    path: str,
    *,
    token: str,
    params: dict[str, Any] | None = None,
    timeout: float = 10.0,
) -> Any:
    """GET ``/api/v1{path}`` and return its JSON.

    Raises:
        BudgetCommandError: unreachable, refused, or an error answer (its ``detail`` quoted).
    """
    import httpx

    url = f"{base_url(coordinator)}/api/v1{path}"
    try:
        response = httpx.get(
            url,
            params={k: v for k, v in (params or {}).items() if v is not None},
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        raise BudgetCommandError(f"cannot reach the coordinator at {url}: {exc}", 5) from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success and body is not None:
        return body
    detail = body.get("detail") if isinstance(body, dict) else None
    message = detail or f"HTTP {response.status_code} from {url}"
    raise BudgetCommandError(message, _EXIT.get(response.status_code, 5))


def _eps(value: Any) -> str:
    if value is None:
        return "—"
    if value == "Infinity" or (isinstance(value, float) and value == float("inf")):
        return "∞"
    return f"{float(value):.4f}"


def _all_clients(clients: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dpfl budget: every client")
    for column in ("client", "id", "ε spent", "δ", "budget ε", "remaining ε", "status"):
        table.add_column(column, justify="right" if "ε" in column or column == "δ" else "left")
    for c in clients:
        budget = c.get("budget")
        state = "EXCEEDED" if c.get("exceeded") else c.get("status", "")
        table.add_row(
            c["name"],
            c["id"],
            _eps(c["epsilon"]),
            f"{c['delta']:g}",
            _eps(budget["epsilon"]) if budget else "none",
            _eps(c.get("remaining_epsilon")),
            state,
        )
    Console().print(table)


def _one_client(report: dict[str, Any], *, events: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(title=f"dpfl budget: {report['client_id']}", show_header=False)
    summary.add_column("quantity", style="bold")
    summary.add_column("value")
    budget = report.get("budget_epsilon")
    rows = [
        ("ε spent", f"{_eps(report['epsilon'])} at δ = {report['delta']:g} ({report['method']})"),
        (
            "budget",
            "none (no limit)"
            if budget is None
            else f"ε {_eps(budget)} at δ = {report['budget_delta']:g}",
        ),
        ("remaining ε", _eps(report.get("remaining_epsilon"))),
        ("ledger events", str(len(report["events"]))),
    ]
    if report.get("exceeded"):
        rows.append(("status", "EXCEEDED"))
    if report.get("data_dependent_epsilon") is not None:
        rows.append(
            ("data-dependent ε", f"{_eps(report['data_dependent_epsilon'])} (not a guarantee)")
        )
    for key, value in rows:
        summary.add_row(key, value)
    console.print(summary)
    if report["by_job"]:
        jobs = Table(title="per job")
        for column in ("job", "ε", "bound", "events"):
            jobs.add_column(column, justify="left" if column == "job" else "right")
        for job_id, j in report["by_job"].items():
            jobs.add_row(job_id, _eps(j["epsilon"]), str(j.get("method", "rdp")), str(j["entries"]))
        console.print(jobs)
    if events and report["events"]:
        table = Table(title="events")
        for column in ("round", "job", "mechanism", "unit", "ε alone"):
            table.add_column(column)
        for e in report["events"]:
            attempt = f".{e['attempt']}" if e["attempt"] > 1 else ""
            table.add_row(
                f"{e['round_number']}{attempt}",
                e["job_id"],
                json.dumps(e["event"], separators=(",", ":")),
                e["unit"],
                _eps(e["epsilon"]),
            )
        console.print(table)


def _budget(args: argparse.Namespace) -> int:
    try:
        if not args.coordinator:
            raise BudgetCommandError(f"give --coordinator URL (or set ${COORDINATOR_ENV})", 2)
        if not args.token:
            raise BudgetCommandError(f"give --token T (or set ${TOKEN_ENV})", 2)
        if args.delta is not None and not 0 < args.delta < 1:
            raise BudgetCommandError(f"--delta must be in (0, 1), got {args.delta:g}", 2)
        if args.events and args.client_id is None:
            raise BudgetCommandError("--events needs a CLIENT_ID", 2)
        common = {"token": args.token, "timeout": args.timeout}
        if args.client_id is None:
            clients = fetch(args.coordinator, "/clients", params={"delta": args.delta}, **common)
            if args.json:
                print(json.dumps(clients))
            else:
                _all_clients(clients)
            return 0
        report = fetch(
            args.coordinator,
            f"/clients/{quote(args.client_id, safe='')}/budget",
            params={"delta": args.delta, "tight": "true" if args.tight else None},
            **common,
        )
        if args.json:
            print(json.dumps(report))
        else:
            _one_client(report, events=args.events)
        return 0
    except BudgetCommandError as exc:
        print(f"dpfl budget: error: {exc}", file=sys.stderr)
        return exc.exit_code
