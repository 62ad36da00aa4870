"""Values a database cannot hold, on SQLite and PostgreSQL alike (issue 29, item 2).

PostgreSQL refuses what SQLite stores (NUL in text) and SQLite's driver refuses what PostgreSQL's
columns cannot hold either way (integers past 64 bits); an unpaired surrogate is text to neither.
The same inputs on both backends:

- every string the store persists (names, labels, token labels, certificate names, actors,
  reasons) is refused before the database sees it, with an ``InvalidInput`` naming the field and
  the code point, and nothing is written (no agent, no used token, no audit record);
- every integer that reaches an ``INTEGER`` column or a query on one (model versions, round
  numbers and ids, limits) is bounded by 2**31 - 1, the bound the REST API states;
- what the coordinator writes itself (why a round was aborted, why a job failed) may quote an
  agent or a document: it is made storable (U+FFFD), never refused;
- a value that still reaches the database and is refused there becomes ``InvalidInput`` (the
  one mapping of ``dpfl.server.store.engine.database_error``), logged, never an internal error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.databases import PostgresBackend, SqliteBackend

from dpfl.learning.jobs import parse_job
from dpfl.server.errors import InvalidInput, NotFound
from dpfl.server.store import AgentStatus, JobStatus, Store
from dpfl.server.store.sql import SqlStore

SPEC = parse_job({"name": "demo", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}})
BIG = (2**31, 2**63, 2**64)


def _token(store: Store) -> str:
    return store.create_enrollment_token(ttl=timedelta(hours=1)).token


def _refused(call: Callable[[], Any], field: str, code: str) -> None:
    with pytest.raises(InvalidInput, match=f"^{re.escape(field)}: character U\\+{code}") as info:
        call()
    assert "the database" not in str(info.value)  # refused by the store's check, before it


class RefusedValuesContract:
    def test_text_no_database_can_hold_is_refused_before_it(self, store: Store) -> None:
        agent = store.create_agent(name="ok")
        token = _token(store)
        tokens_before = store.list_enrollment_tokens()
        for bad, code in (("a\x00b", "0000"), ("a\ud800b", "D800")):
            _refused(lambda b=bad: store.create_agent(name=b), "name", code)
            _refused(lambda b=bad: store.create_agent(name="x", labels={"k": b}), "label 'k'", code)
            _refused(
                lambda b=bad: store.create_enrollment_token(
                    ttl=timedelta(hours=1), labels={"site": b}
                ),
                "token label 'site'",
                code,
            )
            _refused(lambda b=bad: store.redeem_enrollment_token(token, name=b), "name", code)
            _refused(
                lambda b=bad: store.redeem_enrollment_token(token, name="x", labels={"k": b}),
                "label 'k'",
                code,
            )
            _refused(
                lambda b=bad: store.redeem_enrollment_token(token, name="x", certificate_cn=b),
                "certificate common name",
                code,
            )
            _refused(
                lambda b=bad: store.set_agent_status(
                    agent.id, AgentStatus.DISABLED, actor="admin", reason=b
                ),
                "reason",
                code,
            )
            _refused(
                lambda b=bad: store.set_agent_status(agent.id, AgentStatus.DISABLED, actor=b),
                "actor",
                code,
            )
        # nothing was written: no agent, no token used or added, no status change, no audit
        assert [a.id for a in store.list_agents()] == [agent.id]
        assert store.get_agent(agent.id).status == AgentStatus.ACTIVE
        assert store.list_enrollment_tokens() == tokens_before
        assert store.audit_records() == []
        # the token still enrols
        assert store.redeem_enrollment_token(token, name="fine").agent.name == "fine"

    def test_integers_beyond_the_integer_columns_are_refused(self, store: Store) -> None:
        job = store.create_job(SPEC)
        store.set_job_status(job.id, JobStatus.RUNNING)
        store.add_model_version(job.id, b"model")
        for big in BIG:
            with pytest.raises(InvalidInput, match=f"^version must be an integer .*got {big}"):
                store.get_model_version(job.id, big)
            with pytest.raises(InvalidInput, match=r"^round number must be an integer"):
                store.list_rounds(job.id, number=big)
            with pytest.raises(InvalidInput, match=r"^round number must be an integer"):
                store.start_round(job.id, big)
            with pytest.raises(InvalidInput, match=r"^round id must be an integer"):
                store.get_round(big)
            with pytest.raises(InvalidInput, match=r"^round id must be an integer"):
                store.abort_round(big, reason="x")
            with pytest.raises(InvalidInput, match=r"^limit must be an integer"):
                store.audit_records(limit=big)
        # the bound itself is a value like any other
        with pytest.raises(NotFound):
            store.get_model_version(job.id, 2**31 - 1)
        with pytest.raises(NotFound):
            store.get_round(2**31 - 1)
        assert store.list_rounds(job.id, number=2**31 - 1) == []
        assert store.audit_records(limit=2**31 - 1) == []
        assert store.list_rounds(job.id) == []

    def test_text_the_coordinator_writes_is_made_storable(self, store: Store) -> None:
        job = store.create_job(SPEC)
        store.set_job_status(job.id, JobStatus.RUNNING)
        rnd = store.start_round(job.id, 1)
        aborted = store.abort_round(rnd.id, reason="agent said: a\x00b\ud800")
        assert aborted.abort_reason == "agent said: a\ufffdb\ufffd"
        assert store.get_round(rnd.id).abort_reason == "agent said: a\ufffdb\ufffd"
        failed = store.set_job_status(job.id, JobStatus.FAILED, error="cannot read 'x\x00'")
        assert failed.error == store.get_job(job.id).error == "cannot read 'x\ufffd'"

    def test_what_the_database_still_refuses_is_invalid_input_and_logged(
        self, store: Store, caplog: pytest.LogCaptureFixture
    ) -> None:
        agent = store.create_agent(name="ok")
        at = datetime(2030, 1, 1, tzinfo=UTC)
        # straight to the storage primitives, past the store's checks: what a check would miss
        attempts: list[Callable[[Any], object]] = [
            lambda tx: tx.get_model("job-x", 2**64, with_data=False),
            lambda tx: tx.get_agent("a\ud800"),
            lambda tx: tx.insert_audit(
                at=at, actor="admin", action="agent.disable", agent_id=agent.id, detail="\ud800"
            ),
        ]
        assert isinstance(store, SqlStore)
        if store.engine.dialect.name == "postgresql":
            attempts += [
                lambda tx: tx.get_model("job-x", 2**31, with_data=False),
                lambda tx: tx.get_agent("a\x00"),
                lambda tx: tx.insert_audit(
                    at=at, actor="admin", action="agent.disable", agent_id=agent.id, detail="\x00"
                ),
            ]
        for attempt in attempts:
            caplog.clear()
            with (
                caplog.at_level(logging.WARNING, logger="dpfl.server.store"),
                pytest.raises(InvalidInput, match=r"^the database refused a value"),
                store._transaction(write=True) as tx,
            ):
                attempt(tx)
            assert any("the database refused a value" in r.getMessage() for r in caplog.records)
        assert store.audit_records() == []  # the transactions were rolled back
        assert store.get_agent(agent.id).name == "ok"  # and the store still works


class TestSqlite(SqliteBackend, RefusedValuesContract):
    pass


class TestPostgres(PostgresBackend, RefusedValuesContract):
    pass
