"""A throw-away PostgreSQL database for a benchmark run (created on the server, dropped after)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import make_url

DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def unreachable(admin_url: str) -> str | None:
    """None when the PostgreSQL server answers, else why."""
    engine = sa.create_engine(admin_url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            return None
    except sa.exc.OperationalError as exc:
        return str(exc.orig)
    finally:
        engine.dispose()


@contextmanager
def fresh_postgres(admin_url: str, prefix: str) -> Iterator[str]:
    """A new empty database named ``dpfl_<prefix>_<pid>_<random>`` on the server of
    ``admin_url``, dropped afterwards."""
    name = f"dpfl_{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
