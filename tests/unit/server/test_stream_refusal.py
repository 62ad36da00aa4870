"""A refused ``Connect`` is answered only once the agent's opening ``Hello`` has arrived
(``dpfl.server.sessions.serve_stream``), on a real SQLite store.

A ``grpc.aio`` client whose ``Hello`` write is still in flight when the call's status arrives
reports INTERNAL instead of the coordinator's UNAUTHENTICATED (grpc/grpc#36066); under load a
disabled agent then took its refusal for a broken transport. Refusing after the ``Hello`` has
been read leaves no write of the agent's in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.errors import InvalidCredential
from dpfl.server.sessions import SessionRegistry, serve_stream
from dpfl.server.store import AgentStatus, open_store


def _metadata(agent_id: str, credential: str) -> tuple[tuple[str, str], ...]:
    return (("x-dpfl-agent-id", agent_id), ("authorization", f"Bearer {credential}"))


async def _refusal(tmp_path: Path, *, hello_after: float | None) -> tuple[bool, float]:
    """Connect as a disabled agent whose ``Hello`` comes ``hello_after`` seconds after the
    stream opens (None: never); (whether the Hello was read before the refusal, seconds)."""
    store = open_store(f"sqlite:///{tmp_path / 'coordinator.db'}")
    try:
        agent = store.create_agent(name="silo")
        credential = store.issue_credential(agent.id)
        store.set_agent_status(agent.id, AgentStatus.DISABLED, reason="compromised")
        taken = asyncio.Event()

        async def inbound() -> AsyncIterator[pb.AgentMessage]:
            if hello_after is None:
                await asyncio.sleep(3600)
            await asyncio.sleep(hello_after or 0.0)
            taken.set()
            yield pb.AgentMessage(hello=pb.Hello(agent_id=agent.id))
            await asyncio.sleep(3600)

        started = time.monotonic()
        stream = serve_stream(
            store=store,
            registry=SessionRegistry(),
            metadata=_metadata(agent.id, credential),
            inbound=inbound(),
        )
        with pytest.raises(InvalidCredential):
            await anext(stream)
        return taken.is_set(), time.monotonic() - started
    finally:
        store.close()


def test_a_refusal_waits_for_the_opening_hello(tmp_path: Path) -> None:
    read, seconds = asyncio.run(_refusal(tmp_path, hello_after=0.3))
    assert read  # the agent's Hello write completed before its refusal was sent
    assert 0.3 <= seconds < 2.0


def test_a_refusal_without_a_hello_is_answered_within_the_grace(tmp_path: Path) -> None:
    read, seconds = asyncio.run(_refusal(tmp_path, hello_after=None))
    assert not read
    assert seconds < 5.0  # REFUSAL_GRACE_S (2 s), not the 30 s the Hello of a valid agent gets
