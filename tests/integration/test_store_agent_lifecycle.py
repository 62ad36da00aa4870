"""The store's agent life cycle on every backend (SQLite, PostgreSQL).

- one client certificate, one agent: a fresh token redeemed with a certificate name already
  bound (to an active, disabled or revoked agent) is refused and stays unused, so a silo cannot
  hold two agent ids and two budgets; the database's unique index refuses it too, and the loser
  of two concurrent enrolments with one name is told which agent holds it (issue 29, item 6: it
  was told that its own agent id, never created, "already exists");
- disable / enable / revoke write an audit record (actor, time, action, reason) in the same
  transaction; a revocation is final and revokes the agent's secrets; its ledger stays;
- migration 0003 upgrades a database at 0002 (and refuses one where two agents share a name).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import sqlalchemy as sa
from alembic import command
from support.databases import PostgresBackend, SqliteBackend

from dpfl.server.errors import AlreadyExists, InvalidCredential, InvalidTransition, NotFound
from dpfl.server.store import Agent, AgentStatus, Enrollment, Store, open_store
from dpfl.server.store.engine import alembic_config, create_store_engine
from dpfl.server.store.sql import _SqlTx


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

    def test_the_loser_of_an_enrolment_race_is_told_which_agent_exists(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        winner = store.redeem_enrollment_token(_token(store), name="A", certificate_cn="silo-1")
        token = _token(store)
        real = _SqlTx.agent_by_certificate_cn
        reads: list[str] = []

        def before_the_winner_committed(tx: _SqlTx, certificate_cn: str) -> Agent | None:
            # the loser's check read the names before the winner's transaction committed
            reads.append(certificate_cn)
            return None if len(reads) == 1 else real(tx, certificate_cn)

        monkeypatch.setattr(_SqlTx, "agent_by_certificate_cn", before_the_winner_committed)
        with pytest.raises(AlreadyExists) as info:
            store.redeem_enrollment_token(token, name="A-bis", certificate_cn="silo-1")
        message = str(info.value)
        assert f"'silo-1' is already bound to agent {winner.agent.id!r} (active)" in message
        assert re.findall(r"agent-[0-9a-f]+", message) == [winner.agent.id]
        assert [a.id for a in store.list_agents()] == [winner.agent.id]
        assert [t.used_at for t in store.list_enrollment_tokens() if t.agent_id is None] == [None]

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


class TestSqlite(SqliteBackend, LifecycleContract):
    pass


class TestPostgres(PostgresBackend, LifecycleContract):
    def test_two_concurrent_enrolments_with_one_certificate_name(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The race itself: both transactions check the name before either inserts (PostgreSQL
        runs them at once; SQLite serialises writers, so its race is the test above)."""
        both_checked = threading.Barrier(2, timeout=30)
        real = _SqlTx.agent_by_certificate_cn
        lock = threading.Lock()
        reads: list[str] = []

        def check_together(tx: _SqlTx, certificate_cn: str) -> Agent | None:
            found = real(tx, certificate_cn)
            with lock:
                reads.append(certificate_cn)
                first_two = len(reads) <= 2
            if first_two:
                both_checked.wait()
            return found

        monkeypatch.setattr(_SqlTx, "agent_by_certificate_cn", check_together)
        tokens = [_token(store), _token(store)]

        def enrol(i: int) -> Enrollment | AlreadyExists:
            try:
                return store.redeem_enrollment_token(
                    tokens[i], name=f"A{i}", certificate_cn="silo-race"
                )
            except AlreadyExists as exc:
                return exc

        with ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(enrol, range(2)))
        winners = [o for o in outcomes if isinstance(o, Enrollment)]
        losers = [o for o in outcomes if isinstance(o, AlreadyExists)]
        assert len(winners) == len(losers) == 1, outcomes
        winner = winners[0].agent.id
        assert f"already bound to agent {winner!r}" in str(losers[0])
        assert re.findall(r"agent-[0-9a-f]+", str(losers[0])) == [winner]
        assert [a.id for a in store.list_agents()] == [winner]


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
