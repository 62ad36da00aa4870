"""Values a database cannot hold, sent over a real loopback gRPC channel to a coordinator on
SQLite and on PostgreSQL (issue 29, item 2).

``Enroll`` with NUL in the name or a label, and ``Download(BLOB_MODEL)`` of a version past
2**31 - 1, were ``INTERNAL (DataError)`` on PostgreSQL, with nothing logged: each is now
``INVALID_ARGUMENT`` naming the field, on both backends, and changes nothing (the token stays
unused and still enrols). So is a name or label with a control or format character (item 6:
U+202E, RIGHT-TO-LEFT OVERRIDE, made a name display as another).
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import timedelta
from typing import Any

import grpc
import grpc.aio
import pytest
from support.coordination import deadlines, small_job
from support.wire_agent import enroll, metadata

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.server.agent_protocol import submit
from dpfl.server.coordinator import Coordinator
from dpfl.server.settings import Settings


async def _refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


def test_enrol_and_download_values_no_database_can_hold(coordinator_db: str) -> None:
    async def main() -> None:
        settings = Settings(
            database_url=coordinator_db,
            grpc_port=0,
            admin_token=secrets.token_urlsafe(32),
            stage_deadlines=deadlines(),
        )
        c = Coordinator(settings=settings, serve_api=False, max_attempts=1)
        await c.start()
        try:
            first = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
            member = await enroll(c.grpc_address, first, "silo-a")
            job = submit(c.store, small_job().model_dump(mode="json"), members=[member.agent_id])
            c.store.add_model_version(job.id, b"the initial model")
            token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
            async with grpc.aio.insecure_channel(c.grpc_address) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)
                requests = [
                    (pb.EnrollRequest(enrollment_token=token, name="a\x00b"), "name"),
                    (
                        pb.EnrollRequest(
                            enrollment_token=token, name="silo-b", labels={"site": "x\x00"}
                        ),
                        "label 'site'",
                    ),
                ]
                for request, field in requests:
                    code, details = await _refusal(stub.Enroll(request))
                    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
                    assert details.startswith(f"enrol request: {field}: character U+0000")
                # item 6: what would make a name display as another
                for name, shown in (
                    ("Bank\u202eB", "U+202E RIGHT-TO-LEFT OVERRIDE"),
                    ("Bank\u200bB", "U+200B ZERO WIDTH SPACE"),
                    ("Bank\x1bB", "U+001B ESCAPE"),
                ):
                    request = pb.EnrollRequest(enrollment_token=token, name=name)
                    code, details = await _refusal(stub.Enroll(request))
                    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
                    assert details.startswith(f"enrol request: name: character {shown} ")
                request = pb.EnrollRequest(
                    enrollment_token=token, name="silo-b", labels={"site": "\u202eeu"}
                )
                code, details = await _refusal(stub.Enroll(request))
                assert code == grpc.StatusCode.INVALID_ARGUMENT, details
                assert details.startswith("enrol request: label 'site': character U+202E")

                async def first_chunk(version: int) -> pb.DownloadChunk:
                    request = pb.DownloadRequest(job_id=job.id, kind=pb.BLOB_MODEL, version=version)
                    own = metadata(member.agent_id, member.credential)
                    async for chunk in stub.Download(request, metadata=own):
                        return chunk
                    raise AssertionError("no chunk")

                for version in (2**31, 2**63, 2**64 - 1):
                    code, details = await _refusal(first_chunk(version))
                    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
                    assert details == (
                        f"download request: version must be at most {2**31 - 1}, got {version}"
                    )
                code, details = await _refusal(first_chunk(2**31 - 1))
                assert code == grpc.StatusCode.NOT_FOUND, details
                assert (await first_chunk(0)).data == b"the initial model"

            # nothing was written; the token still enrols
            assert [a.id for a in c.store.list_agents()] == [member.agent_id]
            enrolled = await enroll(c.grpc_address, token, "silo-b")
            assert c.store.get_agent(enrolled.agent_id).name == "silo-b"
        finally:
            await c.close()

    asyncio.run(main())
