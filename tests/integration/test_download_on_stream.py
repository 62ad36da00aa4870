"""A download riding along the agent's live, authenticated ``Connect`` stream skips the store's
credential transaction, and stops being trusted the moment the agent is shut out."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import grpc.aio
import pytest
from support.wire_agent import enroll, metadata

from dpfl.learning.jobs import parse_job
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.server.coordinator import Coordinator
from dpfl.server.orchestrator.channel import RoundChannel
from dpfl.server.settings import Settings
from dpfl.server.store import AgentStatus

SPEC = parse_job({"name": "dl", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}})


def test_downloads_on_a_live_stream_skip_the_credential_read_until_eviction(
    coordinator_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        settings = Settings(
            database_url=coordinator_db,
            grpc_port=0,
            api_port=0,
            admin_token=secrets.token_urlsafe(32),
        )
        c = Coordinator(settings=settings, serve_api=False)
        await c.start()
        try:
            token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
            enrolled = await enroll(c.grpc_address, token, "dl-agent")
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
            async with grpc.aio.insecure_channel(c.grpc_address) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)

                async def download(secret: str) -> bytes:
                    call = stub.Download(request, metadata=metadata(agent_id, secret))
                    return b"".join([chunk.data async for chunk in call])

                # no stream yet: the store authenticates
                assert await download(credential) == b"model-bytes"
                assert reads == [agent_id]
                stop = asyncio.Event()

                async def outbound() -> AsyncIterator[pb.AgentMessage]:
                    yield pb.AgentMessage(hello=pb.Hello(agent_id=agent_id))
                    await stop.wait()

                stream = stub.Connect(outbound(), metadata=metadata(agent_id, credential))
                received = asyncio.ensure_future(_drain(stream))
                assert await c.registry.wait_connected([agent_id], timeout=10)
                reads.clear()  # (opening the stream authenticated it)
                for _ in range(3):  # along the stream: no credential transaction
                    assert await download(credential) == b"model-bytes"
                assert reads == []
                # an invitee of the job's running round: no membership read either
                memberships: list[str] = []
                agent_jobs = c.store.agent_jobs

                def counted_jobs(agent: str) -> Any:
                    memberships.append(agent)
                    return agent_jobs(agent)

                monkeypatch.setattr(c.store, "agent_jobs", counted_jobs)
                assert await download(credential) == b"model-bytes"
                assert memberships == [agent_id]  # no round running: read from the store
                route = RoundChannel(job_id=job.id, number=1, participants=[agent_id])
                c.registry.add_route(route)
                assert await download(credential) == b"model-bytes"
                assert memberships == [agent_id]
                c.registry.remove_route(route)
                assert reads == []
                with pytest.raises(grpc.aio.AioRpcError) as wrong:  # another credential: store
                    await download("not-the-credential")
                assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert reads == [agent_id]
                c.registry.add_route(route)  # still invited, but shut out: refused at once
                await c.agents.set_status(agent_id, AgentStatus.DISABLED, actor="test")
                with pytest.raises(grpc.aio.AioRpcError) as shut:  # at once, no grace period
                    await download(credential)
                assert shut.value.code() == grpc.StatusCode.UNAUTHENTICATED
                stop.set()
                await asyncio.wait_for(received, 10)
        finally:
            await c.close()

    asyncio.run(main())


async def _drain(stream: Any) -> None:
    try:
        async for _ in stream:
            pass
    except grpc.aio.AioRpcError:
        pass
