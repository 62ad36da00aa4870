"""``dpfl-agent run``: enrol once, then take part in rounds until interrupted (thin over
:func:`dpfl.client.runtime.run_agent`).

Exit codes: 0 stopped by SIGINT/SIGTERM; 1 any other agent error; 2 a bad ``--data`` spec or
device; 3 a corrupt, foreign or locked state directory (or its ledger); 4 enrolment impossible or
refused; 5 the coordinator unreachable at enrolment, TLS files unusable, or the credential refused.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler

from dpfl.client.errors import AgentError
from dpfl.client.progress import RichObserver
from dpfl.client.runtime import AgentOptions, run_agent
from dpfl.cmdline import stop_on_signals


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="enrol (once) and take part in training rounds",
        description="Connect to a coordinator, enrol with a one-time token on the first run "
        "(the credential is kept in --state-dir), and take part in rounds within the local "
        "policy until interrupted.",
    )
    parser.add_argument("--coordinator", required=True, metavar="HOST:PORT")
    parser.add_argument(
        "--enrollment-token",
        metavar="TOKEN",
        help="one-time token from 'dpfl-coordinator enroll-token' (first run only)",
    )
    parser.add_argument(
        "--data",
        required=True,
        metavar="SPEC",
        help="this silo's data: digits, mnist, npz:PATH, csv:PATH?label=COL ...; or a simulated "
        "share DATASET#index=I&agents=N[&partition=shards&classes_per_agent=K][&seed=S]"
        "[&public_fraction=F] (see dpfl.client.data)",
    )
    parser.add_argument(
        "--state-dir",
        required=True,
        type=Path,
        metavar="DIR",
        help="holds the credential (agent.json) and the local ledger",
    )
    parser.add_argument("--policy", type=Path, metavar="FILE", help="local policy (YAML)")
    parser.add_argument("--name", help="silo name shown by the coordinator (default: host name)")
    parser.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a plaintext connection (loopback and tests; logs a warning)",
    )
    parser.add_argument("--ca", type=Path, metavar="FILE", help="CA certificate to trust (TLS)")
    parser.add_argument("--cert", type=Path, metavar="FILE", help="agent certificate (mutual TLS)")
    parser.add_argument("--key", type=Path, metavar="FILE", help="agent private key (mutual TLS)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every protocol step")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
        force=True,
    )
    options = AgentOptions(
        coordinator=args.coordinator,
        state_dir=args.state_dir,
        data=args.data,
        enrollment_token=args.enrollment_token,
        policy=args.policy,
        name=args.name,
        device=args.device,
        insecure=args.insecure,
        ca=args.ca,
        cert=args.cert,
        key=args.key,
    )
    observer = RichObserver(console, verbose=args.verbose)
    try:
        asyncio.run(_main(options, observer))
    except AgentError as exc:
        console.print(f"[red]dpfl-agent: {exc}[/red]", highlight=False)
        return exc.exit_code
    return 0


async def _main(options: AgentOptions, observer: RichObserver) -> None:
    stop = stop_on_signals()
    await run_agent(options, stop=stop, observer=observer)
