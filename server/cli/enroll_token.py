"""``dpfl-coordinator enroll-token``: one-time tokens that enrol agents.

Works on the database directly (``--database-url``, ``DPFL_DATABASE_URL`` or the ``--config``
file), so it needs no running coordinator. Each token enrols exactly one agent before it
expires; only its hash is stored, so it is printed once, one per line (``--json`` for scripts).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import timedelta

from dpfl.cmdline import Subparsers
from dpfl.server.cli.serve import add_store_arguments, run_on_store
from dpfl.server.errors import ServerError

__all__ = ["parse_duration", "register"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``24h``, ``7d`` as a positive duration.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive duration: {text!r} (e.g. 24h, 15m, 7d)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, got {text!r}")
    return key, value


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "enroll-token",
        help="issue one-time enrollment tokens for agents",
        description="Issue one-time tokens; an agent redeems one for a permanent agent id and "
        "credential: `dpfl-agent run --enrollment-token-file FILE` (the token on the file's "
        "first line) or $DPFL_ENROLLMENT_TOKEN, which keep it out of process listings. Written "
        "to the database directly.",
    )
    add_store_arguments(parser, json=False)
    parser.add_argument(
        "--ttl", type=parse_duration, default=timedelta(hours=24), help="validity (default 24h)"
    )
    parser.add_argument("--count", type=int, default=1, help="how many tokens (default 1)")
    parser.add_argument("--budget-epsilon", type=float, default=None, help="the agent's ε budget")
    parser.add_argument(
        "--budget-delta", type=float, default=None, help="δ of the budget (default 1e-5)"
    )
    parser.add_argument(
        "--label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the enrolled agent (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per token")
    parser.set_defaults(func=_issue)


def _issue(args: argparse.Namespace) -> int:
    from dpfl.server.store import Budget, Store

    if args.count < 1:
        print("dpfl-coordinator enroll-token: --count must be >= 1", file=sys.stderr)
        return 2
    if args.budget_delta is not None and args.budget_epsilon is None:
        print(
            "dpfl-coordinator enroll-token: --budget-delta needs --budget-epsilon", file=sys.stderr
        )
        return 2
    try:
        budget = (
            Budget(args.budget_epsilon, args.budget_delta if args.budget_delta else 1e-5)
            if args.budget_epsilon is not None
            else None
        )
    except ServerError as exc:
        print(f"dpfl-coordinator enroll-token: {exc}", file=sys.stderr)
        return 2

    def issue(store: Store) -> int:
        for _ in range(args.count):
            issued = store.create_enrollment_token(
                ttl=args.ttl, budget=budget, labels=dict(args.label)
            )
            if args.json:
                print(
                    json.dumps(
                        {
                            "token": issued.token,
                            "id": issued.info.id,
                            "expires_at": issued.info.expires_at.isoformat(),
                            "budget_epsilon": budget.epsilon if budget else None,
                            "budget_delta": budget.delta if budget else None,
                        }
                    )
                )
            else:
                print(issued.token)
        return 0

    return run_on_store(args, issue, "dpfl-coordinator enroll-token")
