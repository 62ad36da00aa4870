"""Alembic environment of the dpfl store.

The store runs migrations programmatically (``dpfl.server.store.engine.upgrade_to_head``) and
passes its open connection in ``config.attributes["connection"]``; the ``alembic`` command line
works too with ``-x url=...``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from dpfl.server.store.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite needs table rebuilds for most ALTERs
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from dpfl.server.store.engine import create_store_engine

    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise SystemExit("give the database with: alembic -x url=sqlite:///dpfl.db upgrade head")
    engine = create_store_engine(url)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run them online")
run()
