"""``dpfl-agent run``: enrol once, then take part in rounds until interrupted (thin over
:func:`dpfl.client.runtime.run_agent`).

SIGINT/SIGTERM stop it within a second or two, even mid-training: the round in flight is left
and a training step still running is abandoned (:class:`dpfl.client.runtime.TrainingExecutor`).

Exit codes: 0 stopped by SIGINT/SIGTERM; 1 any other agent error; 2 a bad ``--data`` spec or
device; 3 a corrupt, foreign or locked state directory (or its ledger); 4 enrolment impossible or
refused; 5 the coordinator unreachable at enrolment, TLS files unusable, or the credential refused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import threading
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler

from dpfl.client.errors import AgentError, EnrollmentError
from dpfl.client.progress import RichObserver
from dpfl.client.runtime import TRAINING_THREAD, AgentOptions, run_agent
from dpfl.cmdline import Subparsers, stop_on_signals

#: Where the enrolment token may come from instead of the command line.
TOKEN_ENV = "DPFL_ENROLLMENT_TOKEN"


class EnrollmentTokenError(EnrollmentError):
    """The enrolment token file cannot be used."""


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="enrol (once) and take part in training rounds",
        description="Connect to a coordinator, enrol with a one-time token on the first run "
        "(the credential is kept in --state-dir), and take part in rounds within the local "
        "policy until interrupted.",
    )
    parser.add_argument("--coordinator", required=True, metavar="HOST:PORT")
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument(
        "--enrollment-token-file",
        type=Path,
        metavar="FILE",
        help="read the one-time token of 'dpfl-coordinator enroll-token' from FILE (first run "
        f"only; or set ${TOKEN_ENV})",
    )
    tokens.add_argument(
        "--enrollment-token",
        metavar="TOKEN",
        help="the token itself (visible to other users in process listings: prefer "
        f"--enrollment-token-file or ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--data",
        required=True,
        metavar="SPEC",
        help="this silo's data: digits, mnist, npz:PATH, csv:PATH?label=COL ...; or a simulated "
        "share DATASET#index=I&agents=N[&partition=shards&classes_per_agent=K][&seed=S]"
        "[&public_fraction=F|&public_count=P][&public_seed=R] (see docs/agent.md)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="mnist, fashion-mnist, usps (or $DPFL_DATA_DIR)",
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
    _identity_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="show every protocol step")
    parser.set_defaults(func=_run)


def _identity_arguments(parser: argparse.ArgumentParser) -> None:
    """TLS towards the coordinator, and the peer identity among the agents."""
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a plaintext connection (loopback and tests; logs a warning)",
    )
    parser.add_argument("--ca", type=Path, metavar="FILE", help="CA certificate to trust (TLS)")
    parser.add_argument("--cert", type=Path, metavar="FILE", help="agent certificate (mutual TLS)")
    parser.add_argument("--key", type=Path, metavar="FILE", help="agent private key (mutual TLS)")
    parser.add_argument(
        "--peer-ca",
        type=Path,
        metavar="FILE",
        help="the federation CA whose peer certificates count as peers in malicious-secure rounds",
    )
    parser.add_argument(
        "--peer-cert",
        type=Path,
        metavar="FILE",
        help="this agent's peer certificate, issued by --peer-ca for --key",
    )


def _run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
        force=True,
    )
    try:
        token = enrollment_token(args.enrollment_token, args.enrollment_token_file)
    except AgentError as exc:
        console.print(f"[red]dpfl-agent: {exc}[/red]", highlight=False, soft_wrap=True)
        return exc.exit_code
    if args.enrollment_token:
        logging.getLogger("dpfl.agent").warning(
            "--enrollment-token shows the token in process listings; use "
            "--enrollment-token-file FILE or $%s",
            TOKEN_ENV,
        )
    options = AgentOptions(
        coordinator=args.coordinator,
        state_dir=args.state_dir,
        data=args.data,
        data_dir=args.data_dir,
        enrollment_token=token,
        policy=args.policy,
        name=args.name,
        device=args.device,
        insecure=args.insecure,
        ca=args.ca,
        cert=args.cert,
        key=args.key,
        peer_ca=args.peer_ca,
        peer_cert=args.peer_cert,
    )
    observer = RichObserver(console, verbose=args.verbose)
    code = 0
    try:
        asyncio.run(_main(options, observer))
    except AgentError as exc:
        console.print(f"[red]dpfl-agent: {exc}[/red]", highlight=False, soft_wrap=True)
        code = exc.exit_code
    _exit_if_training(code)
    return code


def enrollment_token(flag: str | None, file: Path | None) -> str | None:
    """The one-time token: ``--enrollment-token``, else the first line of
    ``--enrollment-token-file``, else ``$DPFL_ENROLLMENT_TOKEN``, else None (a stored credential
    is reused).

    Raises:
        EnrollmentTokenError: an unreadable or empty token file (exit code 4).
    """
    if flag:
        return flag
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise EnrollmentTokenError(
                f"cannot read the enrolment token file {file}: {reason}"
            ) from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise EnrollmentTokenError(f"the enrolment token file {file} is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _exit_if_training(code: int) -> None:
    """End the process now when a training thread is still running (``TrainingExecutor``).

    By here everything that must finish has: the round in flight was left, the local ledger's
    charges (asyncio's default pool, joined by ``asyncio.run``) are committed, and the state
    directory is unlocked. Finalizing the interpreter around a torch computation in a daemon
    thread takes seconds, so the logs are flushed and the process exits at once instead.
    """
    if not any(t.name == TRAINING_THREAD and t.is_alive() for t in threading.enumerate()):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


async def _main(options: AgentOptions, observer: RichObserver) -> None:
    stop = stop_on_signals()
    await run_agent(options, stop=stop, observer=observer)
