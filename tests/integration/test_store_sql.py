"""What only the SQL store has: migrations, persistence, database-level failures, tampering.

Run on SQLite and PostgreSQL. Failures are injected inside the database transaction (a real
unique-key violation on the last ledger row, an error raised by the driver on the last
statement) and must leave the ledger exactly as before.
"""

from __future__ import annotations

import tomllib
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from support.databases import FakeClock, PostgresBackend, SqliteBackend
from support.paths import ROOT

from dpfl.accounting import GaussianEvent, PoissonSampledEvent, event_to_json
from dpfl.learning.jobs import parse_job
from dpfl.server.errors import AlreadyExists, InvalidInput, StoreUnavailable
from dpfl.server.store import Budget, Charge, JobStatus, ProtectedUnit, RoundStatus, open_store
from dpfl.server.store.engine import MIGRATIONS, alembic_config, normalize_url
from dpfl.server.store.ledger import encode_curve
from dpfl.server.store.models import Base
from dpfl.server.store.reports import ORDERS_META_KEY
from dpfl.server.store.sql import SqlStore

SPEC = parse_job({"name": "j", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4}})
EVENT = PoissonSampledEvent(0.3, GaussianEvent(sigma=1.1))


def setup_round(store: SqlStore, n: int = 4) -> tuple[list[str], int]:
    ids = [store.create_agent(name=f"a{i}", agent_id=f"a{i}").id for i in range(n)]
    job = store.create_job(SPEC, job_id="job-1", members=ids)
    store.set_job_status(job.id, JobStatus.RUNNING)
    return ids, store.start_round(job.id, 1).id


def row_counts(store: SqlStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in Base.metadata.sorted_tables
        }


class SqlContract:
    """Abstract: a subclass provides ``store`` and ``db_url`` (see support.databases)."""

    def test_the_migrated_schema_equals_the_models(self, store: SqlStore) -> None:
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []

    def test_one_migration_head_and_downgrade_round_trip(self, store: SqlStore) -> None:
        config = alembic_config()
        assert len(ScriptDirectory.from_config(config).get_heads()) == 1
        with store.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "base")
        with store.engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) <= {"alembic_version"}
        store.close()
        with open_store(str(store.engine.url.render_as_string(hide_password=False))) as again:
            assert isinstance(again, SqlStore)
            again.create_agent(name="after re-migration")

    def test_data_survives_reopening(self, store: SqlStore, db_url: str, clock: FakeClock) -> None:
        ids, round_id = setup_round(store)
        store.commit_round(round_id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in ids])
        before = store.client_budget(ids[0], delta=1e-5)
        store.close()
        with open_store(db_url, clock=clock) as reopened:
            assert reopened.client_budget(ids[0], delta=1e-5) == before
            assert reopened.get_round(round_id).status == RoundStatus.COMMITTED
            assert reopened.verify_ledger().ok

    def test_only_hashes_of_secrets_are_stored(self, store: SqlStore) -> None:
        issued = store.create_enrollment_token(ttl=timedelta(hours=1))
        enrolled = store.redeem_enrollment_token(issued.token, name="silo")
        secrets = [issued.token, enrolled.credential, enrolled.api_token]
        dump = []
        with store.engine.connect() as conn:
            for table in Base.metadata.sorted_tables:
                for row in conn.execute(sa.select(table)):
                    dump.append(repr(tuple(row)))
        text = "\n".join(dump)
        import hashlib

        from dpfl.server.store.tokens import API_PREFIX, CREDENTIAL_PREFIX, ENROLLMENT_PREFIX

        prefixes = (ENROLLMENT_PREFIX, CREDENTIAL_PREFIX, API_PREFIX)
        for secret, prefix in zip(secrets, prefixes, strict=True):
            assert secret.startswith(prefix)
            assert secret not in text
            # the random part alone (URL-safe base64 may itself hold "_")
            assert secret.removeprefix(prefix) not in text
            assert hashlib.sha256(secret.encode()).hexdigest() in text

    def test_a_constraint_violation_on_the_last_row_writes_nothing(self, store: SqlStore) -> None:
        ids, round_id = setup_round(store)
        # a stray entry for the last client makes the database refuse the last insert
        with store.engine.begin() as conn:
            conn.execute(
                sa.insert(Base.metadata.tables["ledger_entries"]).values(
                    agent_id=ids[-1],
                    job_id="job-1",
                    round_id=round_id,
                    round_number=1,
                    attempt=1,
                    algorithm="dp-fedavg",
                    unit="agent",
                    event=event_to_json(EVENT),
                    curve=encode_curve(__import__("numpy").zeros(len(store_orders()))),
                    approximate=False,
                    secure_aggregation=True,
                    honest_fraction=1.0,
                    created_at=FakeClock().now,
                )
            )
        before = row_counts(store)
        with pytest.raises(AlreadyExists):
            store.commit_round(round_id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in ids])
        assert row_counts(store) == before
        assert store.get_round(round_id).status == RoundStatus.RUNNING
        assert store.client_budget(ids[0]).epsilon == 0.0

    def test_a_driver_error_on_the_last_statement_writes_nothing(self, store: SqlStore) -> None:
        ids, round_id = setup_round(store)
        before = row_counts(store)

        class InjectedError(RuntimeError):
            pass

        def fail_on_round_update(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
            if statement.lstrip().upper().startswith("UPDATE ROUNDS"):
                raise InjectedError("disk full")

        sa.event.listen(store.engine, "before_cursor_execute", fail_on_round_update)
        try:
            with pytest.raises(InjectedError):
                store.commit_round(round_id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in ids])
        finally:
            sa.event.remove(store.engine, "before_cursor_execute", fail_on_round_update)
        assert row_counts(store) == before  # the entries and sums inserted before are gone
        result = store.commit_round(round_id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in ids])
        assert not result.replayed
        assert len(result.entries) == len(ids)

    def test_verify_finds_tampering_and_rebuild_repairs_the_cache(self, store: SqlStore) -> None:
        ids, round_id = setup_round(store, n=2)
        store.commit_round(round_id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in ids])
        entries = Base.metadata.tables["ledger_entries"]
        sums = Base.metadata.tables["curve_sums"]
        import numpy as np

        with store.engine.begin() as conn:
            conn.execute(
                sa.update(entries)
                .where(entries.c.agent_id == ids[0])
                .values(curve=encode_curve(np.zeros(len(store_orders()))))
            )
            conn.execute(
                sa.update(sums)
                .where(sums.c.agent_id == ids[1])
                .values(curve=encode_curve(np.ones(len(store_orders()))))
            )
        report = store.verify_ledger()
        kinds = {(m.kind, m.agent_id) for m in report.mismatches}
        assert ("curve", ids[0]) in kinds
        assert ("running_sum", ids[1]) in kinds
        assert store.rebuild_curve_cache() == 2
        assert store.verify_ledger().ok
        # a stored event that no longer parses is reported, never silently skipped
        with store.engine.begin() as conn:
            conn.execute(
                sa.update(entries).where(entries.c.agent_id == ids[0]).values(event={"kind": "?"})
            )
        problems = store.verify_ledger().mismatches
        assert ("event", ids[0]) in {(m.kind, m.agent_id) for m in problems}

    def test_a_changed_order_grid_is_rebuilt_on_open(self, store: SqlStore, db_url: str) -> None:
        ids, round_id = setup_round(store, n=2)
        store.commit_round(round_id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in ids])
        meta = Base.metadata.tables["store_meta"]
        with store.engine.begin() as conn:
            conn.execute(sa.update(meta).where(meta.c.key == ORDERS_META_KEY).values(value="old"))
        assert not store.verify_ledger().ok
        store.close()
        with open_store(db_url) as reopened:
            assert reopened.verify_ledger().ok


def store_orders() -> tuple[float, ...]:
    from dpfl.accounting import ORDERS

    return ORDERS


class TestSqliteSql(SqliteBackend, SqlContract):
    pass


class TestPostgresSql(PostgresBackend, SqlContract):
    pass


def test_unreachable_database_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match="cannot migrate"):
        SqlStore("postgresql://postgres@127.0.0.1:1/nothing")


def test_an_exhausted_connection_pool_is_store_unavailable(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'pool.db'}")
    store.engine.dispose()
    store.engine = sa.create_engine(
        f"sqlite:///{tmp_path / 'pool.db'}",
        poolclass=sa.pool.QueuePool,
        pool_size=1,
        max_overflow=0,
        pool_timeout=0.05,
    )
    store._writer = store._reader = store.engine
    try:
        # the pool's only connection is taken
        with (
            store.engine.connect(),
            pytest.raises(StoreUnavailable, match="no database connection free"),
        ):
            store.list_jobs()
        assert store.list_jobs() == []  # released: the store works again
    finally:
        store.close()


def test_urls_are_normalised() -> None:
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("sqlite:///x.db").drivername == "sqlite"
    with pytest.raises(InvalidInput, match="not a database URL"):
        normalize_url("::nonsense::")


def test_in_memory_sqlite_works() -> None:
    with open_store("sqlite://") as store:
        store.create_agent(name="x", budget=Budget(1, 1e-5))
        assert len(store.list_agents()) == 1


@pytest.mark.parametrize("url", ["memory://", "MEMORY:", "memory:/"])
def test_a_memory_url_is_refused_naming_sqlite_in_memory(url: str) -> None:
    with pytest.raises(InvalidInput, match=r"not a database URL; use sqlite:// "):
        open_store(url)


def test_the_migrations_are_shipped_as_package_data() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["dpfl.server.store"]
    shipped = {p for g in globs for p in (ROOT / "server" / "store").glob(g)}
    on_disk = {
        p
        for p in MIGRATIONS.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".mako")
    }
    assert on_disk
    assert on_disk <= shipped
    assert Path(MIGRATIONS / "versions" / "0001_initial.py") in shipped


def test_in_memory_sqlite_serialises_threads() -> None:
    import threading

    with open_store("sqlite://") as store:
        assert isinstance(store, SqlStore)
        ids, _ = setup_round(store, n=3)
        errors: list[BaseException] = []

        def run(first: int) -> None:
            try:
                for number in range(first, first + 4):
                    rnd = store.start_round("job-1", number)
                    store.commit_round(rnd.id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in ids])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(2 + 4 * i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.verify_ledger().ok
        assert store.client_budget(ids[0], delta=1e-5).by_job["job-1"].entries == 12
