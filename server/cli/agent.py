"""``dpfl-coordinator agent``: list, disable, enable and revoke agents; read the audit trail.

Like ``dpfl-coordinator job``, these commands work on the **database** (``--database-url``,
``DPFL_DATABASE_URL`` or the ``--config`` file): whoever may run them holds the database's
credentials, which is the administrator's authority here (the REST routes under
``/api/v1/agents`` need the admin token instead). A running coordinator applies a change within
about a second: it closes the agent's stream and drops it from every round
(``dpfl.server.agents_control``). Each change is recorded with the actor (``--actor``, default
the operating-system user and host), the time and the reason.

Exit codes: 0 done; 2 unknown agent, a refused change (a revoked agent stays revoked) or a bad
argument; 1 the database failed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from dpfl.cmdline import Subparsers
from dpfl.server.cli.serve import add_store_arguments, run_on_store

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported only by the command that runs
    from dpfl.server.store import Agent, Store

__all__ = ["register"]

_ACTIONS = {"disable": "disabled", "enable": "active", "revoke": "revoked"}


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="list, disable, enable or revoke agents, with an audit trail (on the database)",
        description="Manage agents in the coordinator's database; a running coordinator shuts a "
        "disabled or revoked agent out within a second.",
    )
    sub = parser.add_subparsers(dest="agent_command", metavar="ACTION", required=True)

    listing = sub.add_parser("list", help="list agents and their status")
    listing.add_argument("--status", choices=sorted({"active", "disabled", "revoked"}))
    add_store_arguments(listing)
    listing.set_defaults(func=_list)

    helps = {
        "disable": "shut an agent out now (it may be enabled again)",
        "enable": "let a disabled agent authenticate again",
        "revoke": "shut an agent out for good and revoke its secrets (its ledger stays)",
    }
    for action, text in helps.items():
        p = sub.add_parser(action, help=text)
        p.add_argument("agent_id")
        p.add_argument("--reason", default="", help="why (kept in the audit record)")
        p.add_argument(
            "--actor", default=None, help="who acts (default: the OS user and host name)"
        )
        add_store_arguments(p)
        p.set_defaults(func=_change, action=action)

    audit = sub.add_parser("audit", help="who disabled, enabled or revoked which agent, and when")
    audit.add_argument("--agent", default=None, metavar="ID", help="only this agent")
    audit.add_argument("--limit", type=int, default=200, help="the newest this many")
    add_store_arguments(audit)
    audit.set_defaults(func=_audit)


def _run(args: argparse.Namespace, action: Callable[[Store], int]) -> int:
    return run_on_store(args, action, "dpfl-coordinator agent")


def _agent_json(agent: Agent) -> dict[str, str | None]:
    return {
        "id": agent.id,
        "name": agent.name,
        "status": agent.status.value,
        "certificate_cn": agent.certificate_cn,
        "created_at": agent.created_at.isoformat(),
    }


def _list(args: argparse.Namespace) -> int:
    from dpfl.server.store import AgentStatus

    def action(store: Store) -> int:
        status = AgentStatus(args.status) if args.status else None
        agents = store.list_agents(status=status)
        if args.json:
            print(json.dumps([_agent_json(a) for a in agents]))
        else:
            for a in agents:
                print(f"{a.id}\t{a.name}\t{a.status.value}\t{a.certificate_cn or '-'}")
        return 0

    return _run(args, action)


def _default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name (a container without passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()} (CLI)"


def _change(args: argparse.Namespace) -> int:
    from dpfl.server.store import AgentStatus

    def action(store: Store) -> int:
        agent = store.set_agent_status(
            args.agent_id,
            AgentStatus(_ACTIONS[args.action]),
            actor=args.actor or _default_actor(),
            reason=args.reason,
        )
        print(json.dumps(_agent_json(agent)) if args.json else f"{agent.id}\t{agent.status.value}")
        return 0

    return _run(args, action)


def _audit(args: argparse.Namespace) -> int:
    def action(store: Store) -> int:
        records = store.audit_records(agent_id=args.agent, limit=args.limit)
        if args.json:
            print(
                json.dumps(
                    [
                        {
                            "id": r.id,
                            "at": r.at.isoformat(),
                            "actor": r.actor,
                            "action": r.action,
                            "agent_id": r.agent_id,
                            "detail": r.detail,
                        }
                        for r in records
                    ]
                )
            )
        else:
            for r in records:
                print(f"{r.at.isoformat()}\t{r.actor}\t{r.action}\t{r.agent_id}\t{r.detail}")
        return 0

    return _run(args, action)
