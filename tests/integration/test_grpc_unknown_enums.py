"""Unknown enum values on the wire (issue 29, item 3), from a real gRPC client over loopback.

proto3 hands the coordinator an enum value it does not know as its number. An ``Error`` with
code 999 used to raise ``ValueError`` in ``ErrorCode.Name`` inside the round's channel, which
tore the agent's stream down with only "stream broken (ValueError…)" at INFO and lost the
agent's reason. Every enum an agent sends (an ``Error``'s code, a header's stage, an unmask
share's kind, a download's blob kind) is now checked first: the agent gets an answer naming the
field and the value, the coordinator logs a warning with the agent's id, and the stream stays.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest
from support.wire_agent import enroll, metadata

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.server.coordinator import Coordinator
from dpfl.server.orchestrator.channel import RoundChannel
from dpfl.server.settings import Settings

JOB = "job-enums"


def _header(stage: int) -> pb.RoundHeader:
    return pb.RoundHeader(job_id=JOB, round=1, stage=stage)  # type: ignore[arg-type]


def test_unknown_enum_values_are_answered_and_logged_and_the_stream_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpfl.coordinator")

    async def main() -> None:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'c.db'}",
            grpc_port=0,
            admin_token=secrets.token_urlsafe(32),
        )
        c = Coordinator(settings=settings, serve_api=False)
        await c.start()
        assert c.registry is not None
        try:
            token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
            agent = await enroll(c.grpc_address, token, "newer-agent")
            me = agent.agent_id
            # a round of JOB in which the agent takes part (its invitation stage is open)
            channel = RoundChannel(job_id=JOB, number=1, participants=[me])
            c.registry.add_route(channel)
            outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()

            async def requests() -> AsyncIterator[pb.AgentMessage]:
                yield pb.AgentMessage(hello=pb.Hello(agent_id=me))
                while True:
                    yield await outbox.get()

            async with grpc.aio.insecure_channel(c.grpc_address) as link:
                stub = agent_pb2_grpc.AgentServiceStub(link)
                call = stub.Connect(requests(), metadata=metadata(me, agent.credential))
                assert await c.registry.wait_connected([me], timeout=10)

                async def answer(message: pb.AgentMessage) -> pb.Error:
                    outbox.put_nowait(message)
                    reply = await asyncio.wait_for(call.read(), 10)
                    assert isinstance(reply, pb.CoordinatorMessage), reply
                    assert reply.WhichOneof("body") == "error", reply
                    return reply.error

                # an unknown code in the agent's Error: it still leaves the round, with its
                # reason kept, and is told which value was not understood
                quit = pb.Error(
                    header=_header(pb.STAGE_INVITATION),
                    code=999,  # type: ignore[arg-type]
                    message="disk full",
                )
                told = await answer(pb.AgentMessage(error=quit))
                assert told.code == pb.ERROR_INVALID_ARGUMENT
                assert "error.code" in told.message
                assert "999" in told.message
                assert told.header.job_id == JOB
                assert me in channel.gone
                assert "999" in channel.errors[me]
                assert "disk full" in channel.errors[me]

                # an unknown stage in a round message's header
                response = pb.InvitationResponse(header=_header(999), accept=True)
                told = await answer(pb.AgentMessage(invitation_response=response))
                assert told.code == pb.ERROR_INVALID_ARGUMENT
                assert "invitation_response.header.stage" in told.message
                assert "999" in told.message

                # an unknown kind of an unmask share, behind a known one
                shares = [
                    pb.UnmaskShare(owner=0, kind=pb.SHARE_SELF_MASK_SEED, share=b"\x01"),
                    pb.UnmaskShare(owner=1, kind=7, share=b"\x02"),  # type: ignore[arg-type]
                ]
                unmask = pb.UnmaskResponse(header=_header(pb.STAGE_UNMASK), shares=shares)
                told = await answer(pb.AgentMessage(unmask=unmask))
                assert told.code == pb.ERROR_INVALID_ARGUMENT
                assert "unmask.shares[1].kind" in told.message
                assert " 7 " in told.message

                # the stream is still up, and the same session
                assert c.registry.connected() == {me}
                stale = pb.InvitationResponse(header=_header(pb.STAGE_INVITATION), accept=True)
                told = await answer(pb.AgentMessage(invitation_response=stale))
                assert told.code == pb.ERROR_STALE_ROUND  # it left the round: a known refusal

                # a download of an unknown blob kind (a unary-stream RPC: a status)
                request = pb.DownloadRequest(job_id=JOB, kind=42)  # type: ignore[arg-type]
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in stub.Download(request, metadata=metadata(me, agent.credential)):
                        pass
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "kind" in (refused.value.details() or "")
                assert "42" in (refused.value.details() or "")
                call.cancel()
        finally:
            await c.close()
        records = [r for r in caplog.records if r.name == "dpfl.coordinator"]
        warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        for field, value in (
            ("error.code", "999"),
            ("invitation_response.header.stage", "999"),
            ("unmask.shares[1].kind", "7"),
            ("kind", "42"),
        ):
            assert any(me in w and field in w and value in w for w in warnings), (field, warnings)
        assert not any("stream broken" in r.getMessage() for r in records)
        (left,) = [r.getMessage() for r in records if "left round 1" in r.getMessage()]
        assert "disk full" in left
        assert "999" in left

    asyncio.run(main())
