"""Fixtures of the coordinator's integration tests (helpers: ``support.coordination``).

Every test here runs real components: the coordinator (store on SQLite or PostgreSQL, round
engine, gRPC server on loopback) and real agents (``dpfl.client``) built by
``dpfl.simulation.Simulation``.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.databases import fresh_postgres_url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def coordinator_db(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """The coordinator's database URL: a SQLite file, or the session's PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'coordinator.db'}"
    return fresh_postgres_url(request)
