"""Choosing a store from a URL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from dpfl.server.errors import InvalidInput
from dpfl.server.store.base import Store

__all__ = ["DEFAULT_URL", "open_store"]

DEFAULT_URL = "sqlite:///./dpfl.db"


def open_store(url: str = DEFAULT_URL, *, clock: Callable[[], datetime] | None = None) -> Store:
    """Open the :class:`~dpfl.server.store.sql.SqlStore` at the SQLAlchemy URL ``url``
    (``sqlite:///path``, ``sqlite://`` for a throw-away store in memory,
    ``postgresql://user@host/db``), whose schema is migrated to the newest version first.

    Raises:
        InvalidInput: not a database URL (``memory://`` included: ``sqlite://`` is the store in
            memory).
        StoreUnavailable: the database cannot be reached or migrated.
    """
    if url.split(":", 1)[0].lower() == "memory":
        raise InvalidInput(
            f"{url!r} is not a database URL; use sqlite:// for a throw-away store in memory"
        )
    from dpfl.server.store.sql import SqlStore

    return SqlStore(url, clock=clock)
