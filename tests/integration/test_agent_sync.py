"""The coordinator's once-a-second follow-up of agent statuses changed by another process reads
the agents that are not active, never the whole population, and still evicts and readmits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.databases import PostgresBackend, SqliteBackend

from dpfl.server.agents_control import AgentControl
from dpfl.server.sessions import SessionRegistry
from dpfl.server.store import AgentStatus, Store


class AgentSync:
    def test_sync_reads_only_inactive_agents(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        agents = [store.create_agent(name=f"a{i}") for i in range(30)]
        off, back = agents[3], agents[17]
        for agent in (off, back):  # as the CLI does, in the database only
            store.set_agent_status(agent.id, AgentStatus.DISABLED)
        returned: list[int] = []
        listing = store.list_agents

        def counted(**kwargs: Any) -> Any:
            rows = listing(**kwargs)
            returned.append(len(rows))
            return rows

        monkeypatch.setattr(store, "list_agents", counted)

        async def main() -> None:
            registry = SessionRegistry()
            control = AgentControl(store, registry)
            await control.sync()
            assert registry.evicted(off.id) is not None
            assert registry.evicted(back.id) is not None
            assert registry.evicted(agents[0].id) is None
            store.set_agent_status(back.id, AgentStatus.ACTIVE)
            await control.sync()
            assert registry.evicted(back.id) is None  # readmitted
            assert registry.evicted(off.id) is not None

        asyncio.run(main())
        assert returned == [2, 1]  # the inactive agents, not the 30


class TestSqliteSync(SqliteBackend, AgentSync):
    pass


class TestPostgresSync(PostgresBackend, AgentSync):
    pass
