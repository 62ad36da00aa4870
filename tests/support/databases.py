"""Real databases for tests: a SQLite file per test, one fresh PostgreSQL database per session.

Mix ``SqliteBackend`` or ``PostgresBackend`` into a test class to get the
fixtures ``clock``, ``db_url`` and ``store`` for that implementation; import the plain fixtures
``clock``, ``sqlite_url`` and ``postgres_url`` into a test module; or call
``session_postgres_url(request)`` / ``fresh_postgres_url(request)`` from your own fixtures.

PostgreSQL: the server at ``DPFL_TEST_POSTGRES_URL`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``, trust auth). Each test session creates a
database named ``dpfl_test_<pid>_<random>`` through that connection and drops it at the end, so
parallel sessions never see each other; tests are skipped, with the reason, when the server is
unreachable.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from dpfl.server.store import Store

POSTGRES_URL_ENV = "DPFL_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


class FakeClock:
    """A clock tests move by hand (``clock.advance(seconds=5)``); starts at a fixed instant."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now = self.now + timedelta(**delta)
        return self.now


def postgres_admin_url() -> str:
    """The URL of the PostgreSQL database used to create and drop test databases."""
    url = make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def postgres_unreachable_reason(url: str) -> str | None:
    """None when a connection succeeds, else why (for ``pytest.skip``)."""
    engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"PostgreSQL unreachable at {make_url(url)!r} ({first}); set {POSTGRES_URL_ENV}"
    finally:
        engine.dispose()
    return None


@contextmanager
def temporary_postgres_database(admin_url: str) -> Iterator[str]:
    """Create a uniquely named database, yield its URL, drop it (even if connections linger)."""
    name = f"dpfl_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def run_counting_leftovers(
    argv: list[str], url: str, prefix: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run a benchmark that makes PostgreSQL databases named ``dpfl_<prefix>_<its pid>_<hex>``
    (benchmarks/harness/postgres.py) and return how it ended and the databases of that name
    left on the server afterwards: by its pid, so that other sessions on the same server (the
    suite's other workers, another checkout's tests) never count as its leftovers."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    done = subprocess.CompletedProcess(argv, process.returncode, out, err)
    return done, postgres_databases(url, f"dpfl_{prefix}_{process.pid}_")


def postgres_databases(url: str, prefix: str) -> set[str]:
    """The names of the server's databases that start with ``prefix`` (a benchmark's leftovers)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            names = c.execute(sa.text("SELECT datname FROM pg_database")).scalars()
            return {n for n in names if n.startswith(prefix)}
    finally:
        engine.dispose()


def clear_store_tables(url: str) -> None:
    """Delete every row the store wrote (not the schema version), children before parents."""
    from dpfl.server.store.models import Base

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(table.delete())
    finally:
        engine.dispose()


_POSTGRES_KEY = pytest.StashKey[tuple[str | None, str | None]]()


def session_postgres_url(request: pytest.FixtureRequest) -> str:
    """A PostgreSQL database private to this test session (created on first use, dropped when
    the session ends); skips the test with the reason when the server is unreachable."""
    config = request.config
    if _POSTGRES_KEY not in config.stash:
        admin = postgres_admin_url()
        reason = postgres_unreachable_reason(admin)
        url = None
        if reason is None:
            manager = temporary_postgres_database(admin)
            url = manager.__enter__()
            config.add_cleanup(lambda: manager.__exit__(None, None, None))
        config.stash[_POSTGRES_KEY] = (url, reason)
    url, reason = config.stash[_POSTGRES_KEY]
    if url is None:
        pytest.skip(reason or "PostgreSQL unavailable")
    return url


def fresh_postgres_url(request: pytest.FixtureRequest) -> str:
    """The session's PostgreSQL database, emptied of store rows (the schema stays migrated)."""
    url = session_postgres_url(request)
    engine = sa.create_engine(url)
    try:
        migrated = sa.inspect(engine).has_table("alembic_version")
    finally:
        engine.dispose()
    if migrated:
        clear_store_tables(url)
    return url


# ----------------------------------------------------------------------------------------------
# plain fixtures, for test modules that import them (``from support.databases import sqlite_url``)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file of its own per test."""
    return f"sqlite:///{tmp_path / 'dpfl.db'}"


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> str:
    """The session's PostgreSQL database, emptied of store rows (skips when unreachable)."""
    return fresh_postgres_url(request)


# ----------------------------------------------------------------------------------------------
# store backends: mix one of these into a contract test class (``class TestX(SqliteBackend,
# StoreContract)``) to run the contract against that implementation; each provides the fixtures
# ``clock``, ``db_url`` and ``store``


class _Backend:
    backend = ""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, clock: FakeClock, db_url: str) -> Iterator[Store]:
        from dpfl.server.store import open_store

        with open_store(db_url, clock=clock) as store:
            yield store


class SqliteBackend(_Backend):
    backend = "sqlite"

    @pytest.fixture
    def db_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'dpfl.db'}"


@pytest.mark.postgres
class PostgresBackend(_Backend):
    backend = "postgres"

    @pytest.fixture
    def db_url(self, request: pytest.FixtureRequest) -> str:
        return fresh_postgres_url(request)
