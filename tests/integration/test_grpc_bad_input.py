"""Bad input on every RPC of ``dpfl.v1.AgentService``, over a real loopback gRPC server.

Unary and stream-opening mistakes get a gRPC status naming the problem; mistakes inside a round
get an ``Error`` with the right ``ErrorCode`` on the stream. In every case the store and the
round are unchanged: the round that received the garbage completes exactly like a clean one.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from support.coordination import deadlines, small_job
from support.wire_agent import WireAgent, enroll, metadata

from dpfl.learning.algorithms.base import AgentData
from dpfl.learning.data import federate, load_dataset, partition_from_config
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.server.agent_protocol import submit
from dpfl.server.coordinator import Coordinator
from dpfl.server.settings import Settings

LIMIT = 64 * 1024  # the smallest max_message_bytes the settings accept


async def _coordinator(tmp_path: Path) -> Coordinator:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'c.db'}",
        grpc_port=0,
        admin_token=secrets.token_urlsafe(32),
        max_message_bytes=LIMIT,
        stage_deadlines=deadlines(),
    )
    coordinator = Coordinator(settings=settings, serve_api=False, max_attempts=1)
    await coordinator.start()
    return coordinator


async def _enrolled(c: Coordinator, n: int) -> list[pb.EnrollResponse]:
    out = []
    for i in range(n):
        token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
        out.append(await enroll(c.grpc_address, token, f"agent-{i}"))
    return out


def _snapshot(c: Coordinator) -> tuple[Any, ...]:
    store = c.store
    return (
        [a.id for a in store.list_agents()],
        [(t.id, t.used_at) for t in store.list_enrollment_tokens()],
        [(j.id, j.status) for j in store.list_jobs()],
        store.ledger_entries(),
    )


async def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code()


def test_unary_and_stream_opening_errors(tmp_path: Path) -> None:
    async def main() -> None:
        c = await _coordinator(tmp_path)
        try:
            a, b = await _enrolled(c, 2)
            job = submit(c.store, small_job().model_dump(mode="json"), members=[a.agent_id])
            before = _snapshot(c)
            async with grpc.aio.insecure_channel(c.grpc_address) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)
                # Enroll: unknown token, empty name, oversized, undecodable bytes
                unknown = stub.Enroll(pb.EnrollRequest(enrollment_token="dpfl_enroll_x", name="n"))
                assert await _code(unknown) == grpc.StatusCode.UNAUTHENTICATED
                token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
                empty = stub.Enroll(pb.EnrollRequest(enrollment_token=token, name="  "))
                assert await _code(empty) == grpc.StatusCode.INVALID_ARGUMENT
                huge = stub.Enroll(pb.EnrollRequest(enrollment_token=token, name="n" * LIMIT))
                assert await _code(huge) == grpc.StatusCode.RESOURCE_EXHAUSTED
                raw = channel.unary_unary(
                    "/dpfl.v1.AgentService/Enroll",
                    request_serializer=lambda x: x,
                    response_deserializer=pb.EnrollResponse.FromString,
                )
                assert await _code(raw(b"\xff\xff\xff")) == grpc.StatusCode.INVALID_ARGUMENT
                assert len(c.store.list_agents()) == 2

                # Download: no credential, forged id, unknown job, not a member, bad kind
                def download(req: pb.DownloadRequest, md: Any) -> Any:
                    async def first() -> Any:
                        async for chunk in stub.Download(req, metadata=md):
                            return chunk
                        return None

                    return first()

                model = pb.DownloadRequest(job_id=job.id, kind=pb.BLOB_MODEL, version=0)
                codes = [
                    await _code(download(model, None)),
                    await _code(download(model, metadata(b.agent_id, a.credential))),
                    await _code(
                        download(
                            pb.DownloadRequest(job_id="job-none", kind=pb.BLOB_MODEL),
                            metadata(a.agent_id, a.credential),
                        )
                    ),
                    await _code(download(model, metadata(b.agent_id, b.credential))),
                    await _code(
                        download(
                            pb.DownloadRequest(job_id=job.id, kind=42),
                            metadata(a.agent_id, a.credential),
                        )
                    ),
                ]
                assert codes == [
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ]

                # Connect: no credential, forged id, not a Hello first, a Hello of another agent,
                # an oversized message
                async def stream(md: Any, *messages: pb.AgentMessage) -> grpc.StatusCode:
                    async def requests() -> AsyncIterator[pb.AgentMessage]:
                        for m in messages:
                            yield m
                        await asyncio.sleep(30)

                    call = stub.Connect(requests(), metadata=md)

                    async def drain() -> None:
                        async for _ in call:
                            pass

                    return await _code(drain())

                hello = pb.AgentMessage(hello=pb.Hello(agent_id=a.agent_id))
                own = metadata(a.agent_id, a.credential)
                assert await stream(None, hello) == grpc.StatusCode.UNAUTHENTICATED
                forged = metadata(b.agent_id, a.credential)
                assert await stream(forged, hello) == grpc.StatusCode.UNAUTHENTICATED
                pong = pb.AgentMessage(pong=pb.Ping())
                assert await stream(own, pong) == grpc.StatusCode.INVALID_ARGUMENT
                other = pb.AgentMessage(hello=pb.Hello(agent_id=b.agent_id))
                assert await stream(own, other) == grpc.StatusCode.UNAUTHENTICATED
                big = pb.AgentMessage(hello=pb.Hello(agent_id=a.agent_id, device="x" * LIMIT))
                assert await stream(own, big) == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _snapshot(c)[0] == before[0]
            assert _snapshot(c)[2:] == before[2:]
            assert not c.registry.connected()
        finally:
            await c.close()

    asyncio.run(main())


def test_bad_round_messages_get_errors_and_change_nothing(tmp_path: Path) -> None:
    job = small_job(rounds=1)
    dataset = load_dataset("digits")
    fed = federate(dataset, scheme=partition_from_config({"scheme": "iid"}), num_agents=3)

    def data(i: int) -> AgentData:
        part = fed.agent_dataset(i)
        return AgentData(part.x_train, part.y_train, dataset.input_shape, dataset.num_classes)

    def inject(agent: WireAgent, message: pb.CoordinatorMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "advertise_keys":
            header = message.advertise_keys.header
            bad: list[pb.AgentMessage] = [
                pb.AgentMessage(),  # no body
                pb.AgentMessage(hello=pb.Hello(agent_id=agent.agent_id)),  # a second Hello
                pb.AgentMessage(
                    invitation_response=pb.InvitationResponse(
                        header=pb.RoundHeader(
                            job_id="job-unknown", round=1, stage=pb.STAGE_INVITATION
                        ),
                        accept=True,
                    )
                ),
            ]
            stale = pb.RoundHeader()
            stale.CopyFrom(header)
            stale.round = header.round + 5
            bad.append(pb.AgentMessage(advertise_keys=pb.AdvertiseKeysResponse(header=stale)))
            other_session = pb.RoundHeader()
            other_session.CopyFrom(header)
            other_session.session_id = b"\x00" * 32
            bad.append(
                pb.AgentMessage(advertise_keys=pb.AdvertiseKeysResponse(header=other_session))
            )
            early = pb.RoundHeader()
            early.CopyFrom(header)
            early.stage = pb.STAGE_SHARE_KEYS
            bad.append(pb.AgentMessage(share_keys=pb.ShareKeysResponse(header=early)))
            no_header = pb.AgentMessage(advertise_keys=pb.AdvertiseKeysResponse())
            bad.append(no_header)
            for m in bad:
                agent.send(m)
        elif kind == "masked_input":
            header = message.masked_input.header
            wrong_length = pb.PackedVector(bit_width=8, length=3, data=b"abc", total_length=3)
            agent.send(
                pb.AgentMessage(
                    masked_input=pb.MaskedInputResponse(header=header, masked_input=wrong_length)
                )
            )

    async def main() -> None:
        c = await _coordinator(tmp_path)
        agents: list[WireAgent] = []
        try:
            enrolled = await _enrolled(c, 3)
            agents = [
                WireAgent(c.grpc_address, e.agent_id, e.credential, data(i))
                for i, e in enumerate(enrolled)
            ]
            agents[0].on_message = inject
            tasks = [asyncio.create_task(a.run()) for a in agents]
            assert await c.registry.wait_connected([a.agent_id for a in agents], timeout=10)
            created = submit(
                c.store, job.model_dump(mode="json"), members=[a.agent_id for a in agents]
            )
            await c.orchestrator.start(created.id)
            final = await asyncio.wait_for(c.orchestrator.wait(created.id), 60)
            assert final.status.value == "completed", final.error
            codes = [pb.ErrorCode.Name(e.code) for e in agents[0].errors]
            assert codes == [
                "ERROR_INVALID_ARGUMENT",  # no body
                "ERROR_DUPLICATE",  # second Hello
                "ERROR_UNKNOWN_JOB",
                "ERROR_STALE_ROUND",  # another round
                "ERROR_STALE_ROUND",  # another session
                "ERROR_WRONG_STAGE",  # a share-keys answer while keys are advertised
                "ERROR_INVALID_ARGUMENT",  # no header
                "ERROR_INVALID_ARGUMENT",  # wrong vector length
            ], [e.message for e in agents[0].errors]
            for e in agents[0].errors:
                assert e.message
            assert not agents[1].errors
            (rnd,) = c.store.list_rounds(created.id)
            ids = sorted(a.agent_id for a in agents)
            assert sorted(rnd.survivors["masked_input"]) == ids
            assert sorted(rnd.survivors["unmask"]) == ids
            entries = c.store.ledger_entries(job_id=created.id)
            assert sorted(e.agent_id for e in entries) == ids
            assert c.store.verify_ledger().ok
            for a in agents:
                await a.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        finally:
            await c.close()

    asyncio.run(main())


def test_a_second_stream_of_the_same_agent_replaces_the_first(tmp_path: Path) -> None:
    async def main() -> None:
        c = await _coordinator(tmp_path)
        try:
            (a,) = await _enrolled(c, 1)
            async with grpc.aio.insecure_channel(c.grpc_address) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)
                md = metadata(a.agent_id, a.credential)
                hello = pb.AgentMessage(hello=pb.Hello(agent_id=a.agent_id))

                async def requests() -> AsyncIterator[pb.AgentMessage]:
                    yield hello
                    await asyncio.sleep(30)

                first = stub.Connect(requests(), metadata=md)
                assert await c.registry.wait_connected([a.agent_id], timeout=5)
                old = c.registry.get(a.agent_id)
                second = stub.Connect(requests(), metadata=md)
                received = [m async for m in first]  # the first stream ends ...
                assert [m.WhichOneof("body") for m in received] == ["error"]
                assert received[0].error.code == pb.ERROR_DUPLICATE
                assert "replaced" in received[0].error.message
                for _ in range(50):  # ... and the newcomer is the agent's session
                    if c.registry.get(a.agent_id) not in (None, old):
                        break
                    await asyncio.sleep(0.02)
                assert c.registry.get(a.agent_id) is not old
                assert c.registry.connected() == {a.agent_id}
                second.cancel()
        finally:
            await c.close()

    asyncio.run(main())
