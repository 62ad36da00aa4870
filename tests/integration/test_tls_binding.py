"""Binding agents to their mutual-TLS certificate: the store field, its migration, the handlers.

- every store (SQLite, PostgreSQL) records the certificate CN given at enrolment, keeps
  it across updates, and refuses a malformed one without writing anything;
- migration 0002 adds the column to a database at 0001 holding an enrolled agent (its credential
  keeps working, its CN is NULL) and is reversible;
- ``agent_protocol.authenticate``: the bound CN passes, another CN or a certificate without CN is
  refused (after the credential check, with a message naming the presented CN), and no
  certificate (a coordinator without mutual TLS) or an unbound agent falls back to the
  credential alone; ``agent_protocol.enroll`` refuses a certificate without a CN.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic import command
from support.databases import PostgresBackend, SqliteBackend

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server import agent_protocol
from dpfl.server.errors import InvalidCredential, InvalidInput
from dpfl.server.settings import Settings
from dpfl.server.store import AgentStatus, Store, open_store
from dpfl.server.store.engine import alembic_config, create_store_engine


def _metadata(agent_id: str, credential: str) -> list[tuple[str, str]]:
    return [("x-dpfl-agent-id", agent_id), ("authorization", f"Bearer {credential}")]


class BindingContract:
    """Abstract: a subclass provides the ``store`` fixture (see support.databases)."""

    def test_enrolment_records_the_certificate_cn(self, store: Store) -> None:
        bound = store.redeem_enrollment_token(
            store.create_enrollment_token(ttl=timedelta(hours=1)).token,
            name="Hospital A",
            certificate_cn="silo-1",
        )
        plain = store.redeem_enrollment_token(
            store.create_enrollment_token(ttl=timedelta(hours=1)).token, name="Bank B"
        )
        assert store.get_agent(bound.agent.id).certificate_cn == "silo-1"
        assert plain.agent.certificate_cn is None
        store.set_agent_status(bound.agent.id, AgentStatus.DISABLED)
        store.set_agent_status(bound.agent.id, AgentStatus.ACTIVE)
        assert store.get_agent(bound.agent.id).certificate_cn == "silo-1"  # updates keep it

    @pytest.mark.parametrize("cn", ["", "   ", "x" * 201])
    def test_a_malformed_cn_is_refused_and_nothing_is_written(self, store: Store, cn: str) -> None:
        issued = store.create_enrollment_token(ttl=timedelta(hours=1))
        with pytest.raises(InvalidInput, match="certificate common name"):
            store.redeem_enrollment_token(issued.token, name="A", certificate_cn=cn)
        assert store.list_agents() == []
        assert store.list_enrollment_tokens()[0].used_at is None

    def test_authenticate_checks_the_binding(self, store: Store) -> None:
        settings = Settings(admin_token=secrets.token_urlsafe(32), database_url="sqlite://")
        request = pb.EnrollRequest(
            enrollment_token=store.create_enrollment_token(ttl=timedelta(hours=1)).token,
            name="A",
        )
        enrolled = agent_protocol.enroll(
            store, settings, request, coordinator_id="c", certificate_cn="silo-1"
        )
        metadata = _metadata(enrolled.agent_id, enrolled.credential)
        assert agent_protocol.authenticate(store, metadata, certificate_cn="silo-1").id == (
            enrolled.agent_id
        )
        # a coordinator without mutual TLS: no certificate, the credential alone authenticates
        assert agent_protocol.authenticate(store, metadata).id == enrolled.agent_id
        for presented in ("silo-2", "", "silo-1 "):
            with pytest.raises(InvalidCredential, match="not the one agent") as refused:
                agent_protocol.authenticate(store, metadata, certificate_cn=presented)
            assert f"CN {presented!r}" in str(refused.value)
        # the credential is checked first: a wrong one says nothing about the binding
        with pytest.raises(InvalidCredential, match="unknown agent or invalid credential"):
            agent_protocol.authenticate(
                store, _metadata(enrolled.agent_id, "dpfl_cred_x"), certificate_cn="silo-2"
            )
        # an agent enrolled without a certificate is not bound to any
        unbound = agent_protocol.enroll(
            store,
            settings,
            pb.EnrollRequest(
                enrollment_token=store.create_enrollment_token(ttl=timedelta(hours=1)).token,
                name="B",
            ),
            coordinator_id="c",
        )
        meta_b = _metadata(unbound.agent_id, unbound.credential)
        assert agent_protocol.authenticate(store, meta_b, certificate_cn="anyone").id == (
            unbound.agent_id
        )

    def test_enrol_refuses_a_certificate_without_cn(self, store: Store) -> None:
        settings = Settings(admin_token=secrets.token_urlsafe(32), database_url="sqlite://")
        request = pb.EnrollRequest(
            enrollment_token=store.create_enrollment_token(ttl=timedelta(hours=1)).token,
            name="A",
        )
        with pytest.raises(InvalidCredential, match="no common name"):
            agent_protocol.enroll(store, settings, request, coordinator_id="c", certificate_cn="")
        assert store.list_agents() == []


class TestSqlite(SqliteBackend, BindingContract):
    pass


class TestPostgres(PostgresBackend, BindingContract):
    pass


def _migrate(url: str, *, downgrade: str | None = None, upgrade: str | None = None) -> None:
    engine = create_store_engine(url)
    config = alembic_config()
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            if downgrade is not None:
                command.downgrade(config, downgrade)
            if upgrade is not None:
                command.upgrade(config, upgrade)
    finally:
        engine.dispose()


def test_migration_0002_keeps_enrolled_agents_and_is_reversible(coordinator_db: str) -> None:
    url = coordinator_db
    _migrate(url, downgrade="base", upgrade="0001")  # PostgreSQL: the session's database
    engine = create_store_engine(url)
    with engine.begin() as conn:
        assert "certificate_cn" not in {c["name"] for c in sa.inspect(conn).get_columns("agents")}
        agents = sa.table(
            "agents",
            sa.column("id"),
            sa.column("name"),
            sa.column("labels", sa.JSON()),
            sa.column("status"),
            sa.column("created_at", sa.DateTime(timezone=True)),
        )
        conn.execute(
            agents.insert().values(
                id="agent-old",
                name="Old",
                labels={},
                status="active",
                created_at=datetime(2030, 1, 1, tzinfo=UTC),
            )
        )
    engine.dispose()
    with open_store(url) as store:  # opening migrates to head
        old = store.get_agent("agent-old")
        assert old.certificate_cn is None
        assert old.name == "Old"
        credential = store.issue_credential("agent-old")
        assert store.authenticate_agent("agent-old", credential).id == "agent-old"
    _migrate(url, downgrade="0001")
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("agents")}
            assert "certificate_cn" not in columns
            assert conn.execute(sa.text("SELECT name FROM agents")).scalar_one() == "Old"
    finally:
        engine.dispose()
    _migrate(url, upgrade="head")
