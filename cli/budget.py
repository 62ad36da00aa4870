"""``dpfl budget``: how much privacy budget each client has spent, asked of a running coordinator.

Thin: one or two GETs on the coordinator's REST API (``/api/v1/clients`` or
``/api/v1/clients/{id}/budget``), printed as tables (rich) or, with ``--json``, as the API's own
JSON document. The admin token lists every client; a client's own API token (issued at
enrolment) reads only that client. The token can come from ``DPFL_TOKEN`` instead of the command
line (where other users of the machine could see it in the process list). The coordinator is
reached over HTTPS, verified with ``--ca FILE`` (the federation's CA) or the system's CAs;
plaintext http needs ``--insecure``.

Each client's ε is printed twice: assuming the cohort the coordinator announced (what budgets
use), and with only the client's own noise share (what an agent that trusts no peer records;
``unknown`` where the ledger holds entries written before the coordinator recorded that share).
A figure the API flags ``approximate`` (it adds up ledger entries whose ε is not a proven bound:
discrete Gaussian noise charged as the continuous Gaussian) is marked ``≈`` and explained in a
footnote under its table.

Exit codes: 0 success; 2 bad arguments or an answer the API refused as invalid (422); 3 the
token was refused (401) or may not read this (403); 4 no such client (404); 5 the coordinator
could not be reached or failed (5xx, not JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dpfl.cmdline import Subparsers

TOKEN_ENV = "DPFL_TOKEN"
COORDINATOR_ENV = "DPFL_COORDINATOR_URL"
_EXIT = {401: 3, 403: 3, 404: 4, 422: 2}


class BudgetCommandError(Exception):
    """A failure to report, with the exit code it maps to."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def register(subparsers: Subparsers) -> None:
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
    p.add_argument(
        "--ca",
        type=Path,
        metavar="FILE",
        help="PEM CA certificate that signed the coordinator's HTTPS certificate (ca.pem of "
        "'dpfl-coordinator certs init'; default: the system's CAs, or $SSL_CERT_FILE)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a plaintext http:// coordinator (the token travels unencrypted: loopback "
        "and tests only)",
    )
    p.add_argument("--delta", type=float, help="δ to report ε at (default: each budget's δ)")
    p.add_argument("--tight", action="store_true", help="accepted; every figure is the tight one")
    p.add_argument("--events", action="store_true", help="list every ledger event (one client)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait (default 10)")
    p.add_argument("--json", action="store_true", help="print the API's JSON document")
    p.set_defaults(func=_budget)


def base_url(coordinator: str, *, insecure: bool = False) -> str:
    """``HOST:PORT`` or a URL, as the URL of the API root (no trailing slash); ``HOST:PORT`` is
    https, or http with ``insecure``."""
    url = coordinator.strip().rstrip("/")
    if "://" not in url:
        url = f"{'http' if insecure else 'https'}://{url}"
    return url


def transport_check(url: str, *, ca: Path | None, insecure: bool) -> ssl.SSLContext | bool:
    """What httpx verifies the coordinator with: the ``--ca`` file, or the default CAs.

    Raises:
        BudgetCommandError: plaintext without ``--insecure``, ``--insecure`` or ``--ca`` with
            the wrong scheme, or an unusable CA file (exit code 2).
    """
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise BudgetCommandError(f"--coordinator must be an http(s) URL, got {url!r}", 2)
    if scheme == "http":
        if ca is not None:
            raise BudgetCommandError("--ca needs an https:// coordinator", 2)
        if not insecure:
            raise BudgetCommandError(
                f"{url} is plaintext: the token would travel unencrypted; use https (with --ca "
                "FILE for the federation's CA), or pass --insecure (loopback and tests only)",
                2,
            )
        return False
    if insecure:
        raise BudgetCommandError("--insecure contradicts an https:// coordinator", 2)
    if ca is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise BudgetCommandError(f"cannot use the CA file {ca}: {reason}", 2) from None


def _port_hint(root: str) -> str | None:
    """After a failed request: whether ``root`` is the coordinator's gRPC port instead of its
    REST port (one probe of at most 2 s, :mod:`dpfl.cmdline.ports`)."""
    import asyncio
    from urllib.parse import urlsplit

    from dpfl.cmdline.ports import port_hint, probe_port

    parts = urlsplit(root)
    if parts.hostname is None or parts.port is None:
        return None
    probe = asyncio.run(probe_port(parts.hostname, parts.port, tls=parts.scheme == "https"))
    return port_hint(probe, wanted="rest", address=parts.netloc)


def fetch(
    coordinator: str,
    path: str,
    *,
    token: str,
    params: dict[str, Any] | None = None,
    timeout: float = 10.0,
    ca: Path | None = None,
    insecure: bool = False,
) -> Any:
    """GET ``/api/v1{path}`` and return its JSON.

    Raises:
        BudgetCommandError: refused transport settings (:func:`transport_check`), unreachable,
            refused, or an error answer (its ``detail`` quoted).
    """
    import httpx

    root = base_url(coordinator, insecure=insecure)
    verify = transport_check(root, ca=ca, insecure=insecure)
    url = f"{root}/api/v1{path}"
    try:
        response = httpx.get(
            url,
            params={k: v for k, v in (params or {}).items() if v is not None},
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            verify=verify,
        )
    except httpx.HTTPError as exc:
        hint = _port_hint(root)
        raise BudgetCommandError(
            f"cannot reach the coordinator at {url}{f': {hint}' if hint else ''} ({exc})", 5
        ) from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success and body is not None:
        return body
    detail = body.get("detail") if isinstance(body, dict) else None
    message = detail or f"HTTP {response.status_code} from {url}"
    raise BudgetCommandError(message, _EXIT.get(response.status_code, 5))


#: The marker of an approximate figure, and the footnote explaining it.
APPROXIMATE_MARK = "≈"
APPROXIMATE_NOTE = (
    f"{APPROXIMATE_MARK} approximate: includes ledger entries charged for discrete Gaussian noise "
    "as the continuous Gaussian (privacy.noise: gaussian); not a proven upper bound."
)


def _eps(value: Any, approximate: bool = False) -> str:
    if value is None:
        return "—"
    if value == "Infinity" or (isinstance(value, float) and value == float("inf")):
        shown = "∞"
    else:
        shown = f"{float(value):.4f}"
    return f"{shown} {APPROXIMATE_MARK}" if approximate else shown


def _note(console: Any, flagged: bool) -> None:
    if flagged:
        console.print(APPROXIMATE_NOTE, soft_wrap=True)


#: What the two figures of a client are (docs/accounting.md#what-the-agent-can-verify).
OWN_SHARE_NOTE = (
    "ε cohort: assumes the cohort the coordinator announced (budgets use it). ε own share: only "
    "the client's own noise share in each round, what an agent that trusts no peer records; "
    "unknown where a ledger entry predates the coordinator recording that share."
)


def _own_share(c: dict[str, Any], approximate: bool) -> str:
    """A client's own-share figure, or ``unknown`` (the API gives none: an older entry)."""
    if c.get("own_share_epsilon") is None:
        return "unknown"
    return _eps(c["own_share_epsilon"], approximate)


def _all_clients(clients: list[dict[str, Any]]) -> None:
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table

    deltas = {f"{c['delta']:g}" for c in clients}
    one_delta = len(deltas) == 1  # then δ goes in the title, not in a column
    headers = ["client", "id", "ε cohort", "ε own share", "δ", "budget ε", "remaining ε", "status"]
    rows = []
    for c in clients:
        budget = c.get("budget")
        approximate = bool(c.get("approximate"))
        rows.append(
            [
                str(c["name"]),
                str(c["id"]),
                _eps(c["epsilon"], approximate),
                _own_share(c, approximate),
                f"{c['delta']:g}",
                _eps(budget["epsilon"]) if budget else "none",
                _eps(c.get("remaining_epsilon"), approximate),
                "EXCEEDED" if c.get("exceeded") else str(c.get("status", "")),
            ]
        )
    if one_delta:
        del headers[4]
        for row in rows:
            del row[4]
    # Every cell but the name is printed whole, on one line: the id so that it can be copied
    # into `dpfl budget CLIENT_ID`. The name wraps to make room; a table that still does not
    # fit is printed wider than the terminal (whose lines then wrap), never cropped.
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    widths[0] = min(widths[0], 12)  # the name wraps beyond this
    title = "dpfl budget: every client" + (f" (ε at δ = {deltas.pop()})" if one_delta else "")
    table = Table(title=title, show_edge=False)
    for i, header in enumerate(headers):
        table.add_column(
            header,
            justify="right" if "ε" in header or header == "δ" else "left",
            no_wrap=i != 0,
            overflow="fold",
            min_width=widths[i],
        )
    for row in rows:
        table.add_row(*row)
    console = Console()
    needed = sum(widths) + 3 * (len(headers) - 1) + 2  # the padding and the rules between
    if console.width < needed:
        console = Console(width=needed)
    console.print(table)
    console.print(OWN_SHARE_NOTE, soft_wrap=True)
    _note(console, any(c.get("approximate") for c in clients))


def _own_share_line(report: dict[str, Any], approximate: bool) -> str:
    """The one-client view's own-share row: the figure with its method, or why it is unknown."""
    if report.get("own_share_epsilon") is None:
        return f"unknown: {report.get('own_share_unknown') or 'not reported'}"
    method = report.get("own_share_method") or report["method"]
    if approximate:
        method = f"{method}, approximate"
    shown = _eps(report["own_share_epsilon"], approximate)
    return f"{shown} at δ = {report['delta']:g} ({method}): what an agent trusting no peer records"


def _summary_rows(report: dict[str, Any], approximate: bool) -> list[tuple[str, str]]:
    """The one-client view's summary: both figures, the budget and what remains."""
    budget = report.get("budget_epsilon")
    method = f"{report['method']}, approximate" if approximate else report["method"]
    rows = [
        (
            "ε spent (announced cohort)",
            f"{_eps(report['epsilon'], approximate)} at δ = {report['delta']:g} ({method})",
        ),
        ("ε own share only", _own_share_line(report, approximate)),
        (
            "budget",
            "none (no limit)"
            if budget is None
            else f"ε {_eps(budget)} at δ = {report['budget_delta']:g}",
        ),
        ("remaining ε", _eps(report.get("remaining_epsilon"), approximate)),
        ("ledger events", str(len(report["events"]))),
    ]
    if report.get("exceeded"):
        rows.append(("status", "EXCEEDED"))
    if report.get("data_dependent_epsilon") is not None:
        rows.append(
            ("data-dependent ε", f"{_eps(report['data_dependent_epsilon'])} (not a guarantee)")
        )
    return rows


def _one_client(report: dict[str, Any], *, events: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(title=f"dpfl budget: {report['client_id']}", show_header=False)
    summary.add_column("quantity", style="bold")
    summary.add_column("value")
    approximate = bool(report.get("approximate"))
    for key, value in _summary_rows(report, approximate):
        summary.add_row(key, value)
    console.print(summary)
    flagged = approximate
    if report["by_job"]:
        jobs = Table(title="per job")
        for column in ("job", "ε", "method", "events"):
            jobs.add_column(column, justify="left" if column == "job" else "right")
        for job_id, j in report["by_job"].items():
            job_approximate = bool(j.get("approximate"))
            flagged = flagged or job_approximate
            job_method = str(j.get("method", "rdp"))
            jobs.add_row(
                job_id,
                _eps(j["epsilon"], job_approximate),
                f"{job_method}, approximate" if job_approximate else job_method,
                str(j["entries"]),
            )
        console.print(jobs)
    if events and report["events"]:
        table = Table(title="events")
        for column in ("round", "job", "mechanism", "unit", "ε alone"):
            table.add_column(column)
        for e in report["events"]:
            # a round redone after an aborted attempt is charged as that attempt
            attempt = f" (attempt {e['attempt']})" if e["attempt"] > 1 else ""
            flagged = flagged or bool(e.get("approximate"))
            table.add_row(
                f"{e['round_number']}{attempt}",
                e["job_id"],
                json.dumps(e["event"], separators=(",", ":")),
                e["unit"],
                _eps(e["epsilon"], bool(e.get("approximate"))),
            )
        console.print(table)
    _note(console, flagged)


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
        common = {
            "token": args.token,
            "timeout": args.timeout,
            "ca": args.ca,
            "insecure": args.insecure,
        }
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
