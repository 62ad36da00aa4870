"""An agent names an error code it does not know instead of crashing on it.

A coordinator built from a newer protocol, or a hostile one, may send any number in an
``Error``'s code or a header's stage. The agent used to call ``ErrorCode.Name`` on it, which
raises; now the event names the value and the agent keeps serving its stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.agent_kit import federation

from dpfl.client.progress import EventKind
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.enums import enum_name


def test_enum_names_of_unknown_values() -> None:
    assert enum_name(pb.ErrorCode.DESCRIPTOR, pb.ERROR_INTERNAL) == "ERROR_INTERNAL"
    assert enum_name(pb.ErrorCode.DESCRIPTOR, 999) == "999 (unknown ErrorCode)"
    assert enum_name(pb.Stage.DESCRIPTOR, 77) == "77 (unknown Stage)"


def test_an_error_with_an_unknown_code_is_named_and_the_stream_stays(tmp_path: Path) -> None:
    async def main() -> None:
        async with federation(tmp_path, "inproc", 1) as (coord, agents):
            agent = agents[0]
            # without a job (a connection-level error), then inside a round it is not in
            coord.send(agent.agent_id, pb.CoordinatorMessage(error=pb.Error(code=999, message="a")))
            header = pb.RoundHeader(job_id="job-x", round=3, stage=42)
            coord.send(
                agent.agent_id,
                pb.CoordinatorMessage(error=pb.Error(header=header, code=1234, message="b")),
            )
            coord.send(agent.agent_id, pb.CoordinatorMessage(ping=pb.Ping(sent_unix=1.0)))
            pong = await coord.next_message(agent.agent_id, skip_pongs=False)
            assert pong.WhichOneof("body") == "pong"
            errors = [e.message for e in agent.events if e.kind is EventKind.COORDINATOR_ERROR]
            assert any(m.startswith("999 (unknown ErrorCode): a") for m in errors), errors

    asyncio.run(asyncio.wait_for(main(), 60))
