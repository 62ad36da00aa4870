"""Engines for the SQL store and the Alembic upgrade that runs when a store opens.

SQLite is made safe for a concurrently used ledger: foreign keys on, WAL journal (readers never
block the writer), a busy timeout, and write transactions that start with ``BEGIN IMMEDIATE`` so
that a read-modify-write of the running sums can never interleave with another writer's.
PostgreSQL URLs without a driver get psycopg 3 (``postgresql+psycopg``).

:func:`database_error` is the one place where what a database refuses becomes a store error, for
both backends: a value it cannot hold (PostgreSQL's ``DataError``: NUL in text, an integer out of
range, a string too long; SQLite's driver: an integer beyond 64 bits; either: an unpaired
surrogate) is :class:`~dpfl.server.errors.InvalidInput` (INVALID_ARGUMENT, 422) naming the
problem, and logged, never an internal error. The store's own checks refuse such values before
any statement runs (``dpfl.server.store.core``); this catches what they miss.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import URL, Engine, ExceptionContext, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import StaticPool

from dpfl.server.errors import Conflict, InvalidInput, StoreError, StoreUnavailable

__all__ = [
    "MIGRATIONS",
    "WRITE_OPTION",
    "alembic_config",
    "create_store_engine",
    "database_error",
    "is_memory_sqlite",
    "normalize_url",
    "upgrade_to_head",
]

#: The Alembic script folder shipped inside the package.
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: Execution option marking a connection whose transaction writes (SQLite: BEGIN IMMEDIATE).
WRITE_OPTION = "dpfl_write"
_SQLITE_BUSY_MS = 30_000
_log = logging.getLogger("dpfl.server.store")
#: The table a statement works on, for error messages (never its parameters: they are data).
_TARGET = re.compile(r"\b(INSERT INTO|UPDATE|DELETE FROM|FROM)\s+\"?(\w+)", re.IGNORECASE)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _refused_value(problem: str, statement: str | None) -> InvalidInput:
    match = _TARGET.search(statement or "")
    where = f" (table {match.group(2)})" if match else ""
    _log.warning("the database refused a value%s: %s", where, problem)
    return InvalidInput(f"the database refused a value{where}: {problem}")


def database_error(exc: BaseException, statement: str | None = None) -> StoreError | None:
    """The store error a database exception stands for, or None when it is not the database's
    (the caller re-raises it as it is).

    - a value the database cannot hold: :class:`InvalidInput` naming the problem (and logged);
      ``OverflowError`` and ``UnicodeError`` count only when a statement's execution raised them
      (the engines' ``handle_error`` hook passes them here), not the store's own arithmetic;
    - a broken constraint: :class:`Conflict`;
    - no free connection, a lost or refused connection: :class:`StoreUnavailable`.
    """
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, DataError):
        return _refused_value(_first_line(exc.orig or exc), exc.statement)
    if isinstance(exc, OverflowError | UnicodeError):
        return _refused_value(f"{type(exc).__name__}: {_first_line(exc)}", statement)
    if isinstance(exc, IntegrityError):
        return Conflict(f"the database refused the change: {exc.orig}")
    if isinstance(exc, PoolTimeout):
        # every pooled connection is busy: the database is overloaded, not the request wrong
        return StoreUnavailable(f"no database connection free: {exc}")
    if isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return StoreUnavailable(f"database error: {exc.orig}")
    return None


def _on_error(context: ExceptionContext) -> None:
    # a value error a driver raises while binding parameters reaches SQLAlchemy unwrapped
    # (sqlite3: OverflowError beyond 64 bits; both: UnicodeEncodeError for a lone surrogate);
    # a DataError is mapped where the transaction ends (``database_error``)
    original = context.original_exception
    if context.sqlalchemy_exception is None and isinstance(original, OverflowError | UnicodeError):
        mapped = database_error(original, context.statement)
        if mapped is not None:
            raise mapped from original


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL, choosing psycopg 3 for PostgreSQL.

    Raises:
        InvalidInput: not a URL SQLAlchemy understands.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InvalidInput(f"not a database URL: {exc}") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def is_memory_sqlite(url: URL) -> bool:
    """Whether ``url`` is an in-memory SQLite database (one connection, shared)."""
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_store_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for the store at ``url`` (see the module docstring for what is configured)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = sa.create_engine(parsed, pool_pre_ping=True, **kwargs)
        sa.event.listen(engine, "handle_error", _on_error)
        return engine

    memory = is_memory_sqlite(parsed)
    engine = sa.create_engine(
        parsed,
        connect_args={"check_same_thread": False},
        poolclass=StaticPool if memory else None,
        **kwargs,
    )
    sa.event.listen(engine, "handle_error", _on_error)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # take over transaction control from the sqlite3 module (it would BEGIN lazily)
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_MS}")
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def alembic_config() -> Config:
    """An Alembic configuration pointing at the packaged migrations (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade_to_head(engine: Engine) -> None:
    """Bring the schema to the newest migration, in one transaction.

    Raises:
        StoreUnavailable: the database cannot be reached or the migration fails.
    """
    config = alembic_config()
    try:
        with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    except SQLAlchemyError as exc:
        raise StoreUnavailable(
            f"cannot migrate the database: {exc.__class__.__name__}: {exc}"
        ) from exc
