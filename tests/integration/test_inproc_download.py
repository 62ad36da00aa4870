"""``--transport inproc`` serves downloads as gRPC does: along the agent's live, authenticated
stream without the store's credential read, and refused the moment the agent is shut out."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from support.wire_agent import metadata

from dpfl.cli.inproc import InProcessCoordinator
from dpfl.learning.jobs import parse_job
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.coordinator import Coordinator
from dpfl.server.errors import InvalidCredential
from dpfl.server.orchestrator.channel import RoundChannel
from dpfl.server.settings import Settings
from dpfl.server.store import AgentStatus

SPEC = parse_job({"name": "dl", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}})


def test_inproc_downloads_ride_the_live_stream_until_eviction(
    coordinator_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        settings = Settings(
            database_url=coordinator_db,
            grpc_port=0,
            api_port=0,
            admin_token=secrets.token_urlsafe(32),
        )
        c = Coordinator(settings=settings, serve_api=False, serve_grpc=False)
        await c.start()
        try:
            link = InProcessCoordinator(c)
            token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
            enrolled = await link.enroll(pb.EnrollRequest(enrollment_token=token, name="dl"))
            agent_id, credential = enrolled.agent_id, enrolled.credential
            job = c.store.create_job(SPEC, members=[agent_id])
            c.store.add_model_version(job.id, b"model-bytes")
            reads: list[str] = []
            authenticate = c.store.authenticate_member

            def counted(agent: str, secret: str) -> Any:
                reads.append(agent)
                return authenticate(agent, secret)

            monkeypatch.setattr(c.store, "authenticate_member", counted)
            request = pb.DownloadRequest(job_id=job.id, kind=pb.BLOB_MODEL, version=0)

            async def download(secret: str) -> bytes:
                chunks = await link.download_handler(metadata(agent_id, secret), request)
                return b"".join(chunk.data for chunk in chunks)

            assert await download(credential) == b"model-bytes"  # no stream: the store
            assert reads == [agent_id]
            stop = asyncio.Event()

            async def inbound() -> AsyncIterator[pb.AgentMessage]:
                yield pb.AgentMessage(hello=pb.Hello(agent_id=agent_id))
                await stop.wait()

            stream = link.connect_handler(metadata(agent_id, credential), inbound())
            drained = asyncio.ensure_future(_drain(stream))
            assert c.registry is not None
            assert await c.registry.wait_connected([agent_id], timeout=10)
            reads.clear()
            for _ in range(3):  # along the stream: no credential transaction
                assert await download(credential) == b"model-bytes"
            assert reads == []
            memberships: list[str] = []
            agent_jobs = c.store.agent_jobs

            def counted_jobs(agent: str) -> Any:
                memberships.append(agent)
                return agent_jobs(agent)

            monkeypatch.setattr(c.store, "agent_jobs", counted_jobs)
            route = RoundChannel(job_id=job.id, number=1, participants=[agent_id])
            c.registry.add_route(route)  # an invitee of the running round: no membership read
            assert await download(credential) == b"model-bytes"
            assert memberships == []
            with pytest.raises(InvalidCredential):  # another credential: the store refuses
                await download("not-the-credential")
            assert reads == [agent_id]
            await c.agents.set_status(agent_id, AgentStatus.DISABLED, actor="test")
            with pytest.raises(InvalidCredential):  # shut out: refused at once
                await download(credential)
            stop.set()
            await asyncio.wait_for(drained, 10)
        finally:
            await c.close()

    asyncio.run(main())


async def _drain(stream: Any) -> None:
    try:
        async for _ in stream:
            pass
    except Exception:  # the stream ends with the eviction's error
        pass
