"""``dpfl-coordinator agent list|disable|enable|revoke|audit`` on SQLite and PostgreSQL.

The command's authority is access to the database (as for ``dpfl-coordinator job``): it needs
no token, and it refuses what the store refuses, with exit code 2 and nothing written.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from dpfl.server.cli.main import main
from dpfl.server.store import AgentStatus, open_store


def test_agent_commands(coordinator_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    with open_store(coordinator_db) as store:
        a = store.redeem_enrollment_token(
            store.create_enrollment_token(ttl=timedelta(hours=1)).token,
            name="A",
            certificate_cn="silo-a",
        )
        b = store.redeem_enrollment_token(
            store.create_enrollment_token(ttl=timedelta(hours=1)).token, name="B"
        )
    db = ["--database-url", coordinator_db]

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["agent", *args, *db])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = run("list", "--json")
    assert code == 0
    assert [(x["id"], x["status"], x["certificate_cn"]) for x in json.loads(out)] == [
        (a.agent.id, "active", "silo-a"),
        (b.agent.id, "active", None),
    ]
    assert run("disable", a.agent.id, "--reason", "leaked key", "--actor", "carol")[0] == 0
    code, out, _ = run("list", "--status", "disabled")
    assert out.split("\t")[:3] == [a.agent.id, "A", "disabled"]
    assert run("enable", a.agent.id)[0] == 0
    assert run("revoke", a.agent.id, "--json")[1].find('"revoked"') > 0
    code, _, err = run("enable", a.agent.id)
    assert code == 2
    assert "revoked, which is final" in err
    code, _, err = run("disable", "agent-none")
    assert code == 2
    assert "agent-none" in err
    code, out, _ = run("audit", "--json", "--agent", a.agent.id)
    records = json.loads(out)
    assert [(r["actor"].endswith("(CLI)") or r["actor"], r["action"]) for r in records] == [
        ("carol", "agent.disable"),
        (True, "agent.enable"),
        (True, "agent.revoke"),
    ]
    assert "reason: leaked key" in records[0]["detail"]
    with open_store(coordinator_db) as store:
        assert store.get_agent(a.agent.id).status == AgentStatus.REVOKED
        assert store.get_agent(b.agent.id).status == AgentStatus.ACTIVE
        assert len(store.audit_records()) == 3  # the refused commands wrote nothing
