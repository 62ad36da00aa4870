"""The store's agent life cycle on every backend (memory, SQLite, PostgreSQL).

- one client certificate, one agent: a fresh token redeemed with a certificate name already
  bound (to an active, disabled or revoked agent) is refused and stays unused, so a silo cannot
  hold two agent ids and two budgets; the database's unique index refuses it too;
- disable / enable / revoke write an audit record (actor, time, action, reason) in the same
  transaction; a revocation is final and revokes the agent's secrets; its ledger stays;
- migration 0003 upgrades a database at 0002 (and refuses one where two agents share a name).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from alembic import command
from support.databases import MemoryBackend, PostgresBackend, SqliteBackend

from dpfl.server.errors import AlreadyExists, InvalidCredential, InvalidTransition, NotFound
from dpfl.server.store import AgentStatus, Store, open_store
from dpfl.server.store.engine import alembic_config, create_store_engine


def _token(store: Store) -> str:
    return store.create_enrollment_token(ttl=timedelta(hours=1)).token


class LifecycleContract:
    def test_a_bound_certificate_cannot_enrol_a_second_agent(self, store: Store) -> None:
        first = store.redeem_enrollment_token(_token(store), name="A", certificate_cn="silo-1")
        with pytest.raises(AlreadyExists, match="already bound to agent"):
            store.redeem_enrollment_token(_token(store), name="A-bis", certificate_cn="silo-1")
        for status in (AgentStatus.DISABLED, AgentStatus.REVOKED):
            store.set_agent_status(first.agent.id, status, actor="admin")
            second = _token(store)
            with pytest.raises(AlreadyExists, match="already bound to agent"):
                store.redeem_enrollment_token(second, name="A-bis", certificate_cn="silo-1")
            assert [a.id for a in store.list_agents()] == [first.agent.id]
        assert all(t.used_at is None for t in store.list_enrollment_tokens() if t.agent_id is None)
        # another certificate, or none, still enrols
        store.redeem_enrollment_token(_token(store), name="B", certificate_cn="silo-2")
        store.redeem_enrollment_token(_token(store), name="C")
        store.redeem_enrollment_token(_token(store), name="D")
        assert len(store.list_agents()) == 4

    def test_status_changes_are_audited_and_revocation_is_final(self, store: Store) -> None:
        enrolled = store.redeem_enrollment_token(_token(store), name="A")
        agent_id = enrolled.agent.id
        store.set_agent_status(agent_id, AgentStatus.DISABLED, actor="alice", reason="leak")
        with pytest.raises(InvalidCredential):
            store.authenticate_agent(agent_id, enrolled.credential)
        store.set_agent_status(agent_id, AgentStatus.ACTIVE, actor="alice")
        assert store.authenticate_agent(agent_id, enrolled.credential).id == agent_id
        store.set_agent_status(agent_id, AgentStatus.REVOKED, actor="bob", reason="stolen")
        with pytest.raises(InvalidTransition, match="revoked"):
            store.set_agent_status(agent_id, AgentStatus.ACTIVE, actor="alice")
        with pytest.raises(InvalidCredential):
            store.authenticate_agent(agent_id, enrolled.credential)
        with pytest.raises(InvalidCredential):
            store.authenticate_api_token(enrolled.api_token)
        records = store.audit_records(agent_id=agent_id)
        assert [(r.actor, r.action) for r in records] == [
            ("alice", "agent.disable"),
            ("alice", "agent.enable"),
            ("bob", "agent.revoke"),
        ]
        assert "reason: leak" in records[0].detail
        assert "secrets revoked" in records[2].detail
        assert records[0].at <= records[1].at <= records[2].at
        assert [r.id for r in store.audit_records(limit=1)] == [records[-1].id]
        with pytest.raises(NotFound):
            store.set_agent_status("agent-none", AgentStatus.DISABLED, actor="alice")
        with pytest.raises(NotFound):
            store.audit_records(agent_id="agent-none")
        # the refused change wrote no audit record
        assert len(store.audit_records()) == 3


class TestMemory(MemoryBackend, LifecycleContract):
    pass


class TestSqlite(SqliteBackend, LifecycleContract):
    pass


class TestPostgres(PostgresBackend, LifecycleContract):
    pass


def test_migration_0003_upgrades_and_refuses_shared_certificate_names(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/m.db"  # type: ignore[str-bytes-safe]
    config = alembic_config()
    engine = create_store_engine(url)
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0002")
            for i in (1, 2):
                conn.execute(
                    sa.text(
                        "INSERT INTO agents (id, name, labels, status, created_at, "
                        "certificate_cn) VALUES (:id, 'n', '{}', 'active', "
                        "'2026-01-01 00:00:00', 'silo-1')"
                    ),
                    {"id": f"agent-{i}"},
                )

        def upgrade() -> None:
            with engine.begin() as conn:
                config.attributes["connection"] = conn
                command.upgrade(config, "0003")

        with pytest.raises(RuntimeError, match="'silo-1' \\(2 agents\\)"):
            upgrade()
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE agents SET certificate_cn = NULL WHERE id = 'agent-2'"))
            config.attributes["connection"] = conn
            command.upgrade(config, "0003")
    finally:
        engine.dispose()
    with open_store(url) as store:
        assert {a.id: a.certificate_cn for a in store.list_agents()} == {
            "agent-1": "silo-1",
            "agent-2": None,
        }
        with pytest.raises(AlreadyExists):
            store.redeem_enrollment_token(_token(store), name="x", certificate_cn="silo-1")
