"""Migration 0005: stored round records gain their version and read back as written.

A row written in the format of the records before 0005 (no ``version``) is migrated, then read
through ``RoundSetup``; the downgrade takes the version off again; a row the coordinator cannot
read is refused naming the round and the field. Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from support.databases import PostgresBackend, SqliteBackend

from dpfl.learning.jobs import parse_job
from dpfl.server.errors import LedgerIntegrityError
from dpfl.server.store import ROUND_SETUP_VERSION, JobStatus
from dpfl.server.store.engine import alembic_config
from dpfl.server.store.sql import SqlStore

SPEC = parse_job({"name": "j", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4}})
ROUNDS = sa.table("rounds", sa.column("id", sa.Integer()), sa.column("noise", sa.JSON()))

#: A round record as the coordinator stored it before 0005: every key it writes.
LEGACY: dict[str, Any] = {
    "plan": {
        "noise_multiplier": 0.9871,
        "calibration": {"target_epsilon": 4.0, "delta": 1e-05, "method": "rdp", "epsilon": 3.99},
        "population": 4,
        "details": {"clip": 1.0, "noise_total": 0.9871, "sampling_rate": 0.5},
    },
    "state": {"model_version": 2, "details": {"round": 1}, "blobs": {"opt": "AAECAw=="}},
    "population": 4,
    "excluded_over_budget": ["a3"],
    "sample": ["a0", "a1", "a2"],
    "sample_population": ["a0", "a1", "a2"],
    "sample_kept": True,
    "declined": {"a2": "local policy: over budget"},
    "encoding": {
        "clip": 1.0,
        "scale_bits": 12,
        "ring_bits": 40,
        "noise": {"kind": "skellam", "parameter": 17.25},
        "rounding_beta": 0.0,
    },
    "secagg": {
        "num_clients": 2,
        "degree": 1,
        "threshold": 2,
        "ring_bits": 40,
        "vector_length": 1990,
        "min_survivors": 2,
        "threat_model": "semi-honest",
    },
    "restored_noise_shares": 0,
}


def _started_round(store: SqlStore) -> int:
    ids = [store.create_agent(name=f"a{i}", agent_id=f"a{i}").id for i in range(4)]
    job = store.create_job(SPEC, job_id="job-1", members=ids)
    store.set_job_status(job.id, JobStatus.RUNNING)
    return store.start_round(job.id, 1).id


def _stored(conn: sa.Connection, round_id: int) -> object:
    return conn.execute(sa.select(ROUNDS.c.noise).where(ROUNDS.c.id == round_id)).scalar_one()


def _set(conn: sa.Connection, round_id: int, value: object) -> None:
    conn.execute(sa.update(ROUNDS).where(ROUNDS.c.id == round_id).values(noise=value))


def _migrate(store: SqlStore, revision: str, *, down: bool) -> None:
    config = alembic_config()
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(config, revision)


class RoundSetupMigration:
    """Abstract: a subclass provides ``store`` (see support.databases)."""

    def test_a_record_stored_before_0005_reads_back_identically(self, store: SqlStore) -> None:
        round_id = _started_round(store)
        with store.engine.connect() as conn:
            assert _stored(conn, round_id) == {"version": ROUND_SETUP_VERSION}
        _migrate(store, "0004", down=True)
        with store.engine.begin() as conn:
            assert _stored(conn, round_id) == {}  # the downgrade took the version off
            _set(conn, round_id, LEGACY)
        _migrate(store, "head", down=False)
        with store.engine.connect() as conn:
            assert _stored(conn, round_id) == {**LEGACY, "version": ROUND_SETUP_VERSION}
        setup = store.get_round(round_id).setup
        assert setup.document() == LEGACY
        assert setup.to_json() == {**LEGACY, "version": ROUND_SETUP_VERSION}
        assert setup.secagg is not None
        assert setup.secagg.threat_model == "semi-honest"
        assert setup.kept_sample() == (("a0", "a1", "a2"), ("a0", "a1", "a2"))
        # the store writes it back unchanged
        assert store.update_round(round_id, setup=setup).setup == setup
        with store.engine.connect() as conn:
            assert _stored(conn, round_id) == {**LEGACY, "version": ROUND_SETUP_VERSION}

    def test_the_migration_leaves_values_that_are_not_records_to_be_refused(
        self, store: SqlStore
    ) -> None:
        round_id = _started_round(store)
        _migrate(store, "0004", down=True)
        with store.engine.begin() as conn:
            _set(conn, round_id, ["not", "a", "record"])
        _migrate(store, "head", down=False)
        with pytest.raises(LedgerIntegrityError, match=f"round {round_id} .* not an object"):
            store.get_round(round_id)

    @pytest.mark.parametrize(
        ("stored", "field"),
        [
            (
                {"version": 1, "secagg": {"num_clients": "x", "ring_bits": 8}},
                "secagg.num_clients",
            ),
            ({"version": 1, "noise_multiplier": 1.1}, "noise_multiplier"),
            ({"version": 1, "state": {"details": {}, "blobs": {}}}, "state.model_version"),
        ],
    )
    def test_a_malformed_stored_record_is_refused_naming_round_and_field(
        self, store: SqlStore, stored: dict[str, object], field: str
    ) -> None:
        round_id = _started_round(store)
        with store.engine.begin() as conn:
            _set(conn, round_id, stored)
        with pytest.raises(LedgerIntegrityError) as exc:
            store.list_rounds("job-1")
        assert f"round {round_id} (job 'job-1', round 1, attempt 1)" in str(exc.value)
        assert f"malformed at {field!r}" in str(exc.value)

    def test_a_record_of_an_unknown_version_is_refused(self, store: SqlStore) -> None:
        round_id = _started_round(store)
        with store.engine.begin() as conn:
            _set(conn, round_id, {**LEGACY, "version": 2})
        with pytest.raises(LedgerIntegrityError, match="has version 2; this coordinator reads"):
            store.get_round(round_id)


class TestSqliteRoundSetupMigration(SqliteBackend, RoundSetupMigration):
    pass


class TestPostgresRoundSetupMigration(PostgresBackend, RoundSetupMigration):
    pass
