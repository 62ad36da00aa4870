"""A download riding along the agent's live, authenticated ``Connect`` stream skips the store's
credential transaction, and stops being trusted the moment the agent is shut out; over gRPC and
over the in-process link of ``--transport inproc`` alike."""

from __future__ import annotations

import asyncio
import contextlib
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
from dpfl.server.errors import InvalidCredential
from dpfl.server.orchestrator.channel import RoundChannel
from dpfl.server.settings import Settings
from dpfl.server.store import AgentStatus
from dpfl.simulation.inproc import InProcessCoordinator

SPEC = parse_job({"name": "dl", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}})


def _settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url, grpc_port=0, api_port=0, admin_token=secrets.token_urlsafe(32)
    )


def _counting(monkeypatch: pytest.MonkeyPatch, store: Any, method: str) -> list[str]:
    """The agent ids ``store.<method>`` is called with from now on (the call still runs)."""
    calls: list[str] = []
    real = getattr(store, method)

    def counted(agent: str, *args: Any) -> Any:
        calls.append(agent)
        return real(agent, *args)

    monkeypatch.setattr(store, method, counted)
    return calls


def test_downloads_on_a_live_stream_skip_the_credential_read_until_eviction(
    coordinator_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        c = Coordinator(settings=_settings(coordinator_db), serve_api=False)
        await c.start()
        try:
            token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
            enrolled = await enroll(c.grpc_address, token, "dl-agent")
            agent_id, credential = enrolled.agent_id, enrolled.credential
            job = c.store.create_job(SPEC, members=[agent_id])
            c.store.add_model_version(job.id, b"model-bytes")
            reads = _counting(monkeypatch, c.store, "authenticate_member")
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
                memberships = _counting(monkeypatch, c.store, "agent_jobs")
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


def test_inproc_downloads_take_the_same_path(
    coordinator_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--transport inproc`` serves downloads as gRPC does (one ``handlers.serve_download``)."""

    async def main() -> None:
        c = Coordinator(settings=_settings(coordinator_db), serve_api=False, serve_grpc=False)
        await c.start()
        try:
            link = InProcessCoordinator(c)
            token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
            enrolled = await link.enroll(pb.EnrollRequest(enrollment_token=token, name="dl"))
            agent_id, credential = enrolled.agent_id, enrolled.credential
            job = c.store.create_job(SPEC, members=[agent_id])
            c.store.add_model_version(job.id, b"model-bytes")
            reads = _counting(monkeypatch, c.store, "authenticate_member")
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
            drained = asyncio.ensure_future(_drain_link(stream))
            assert c.registry is not None
            assert await c.registry.wait_connected([agent_id], timeout=10)
            reads.clear()
            for _ in range(3):  # along the stream: no credential transaction
                assert await download(credential) == b"model-bytes"
            assert reads == []
            memberships = _counting(monkeypatch, c.store, "agent_jobs")
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


async def _drain_link(stream: Any) -> None:
    with contextlib.suppress(InvalidCredential):  # the stream ends with the eviction
        async for _ in stream:
            continue
