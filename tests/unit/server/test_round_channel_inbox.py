"""What one agent has waiting in a round's inbox is bounded (``StreamLimits.inbox_*``).

Messages of the open stage are accepted while the engine is between stages (writing to the
store) and wait unread until it collects again; without a bound a participant could queue
messages there as fast as loopback carries them.
"""

from __future__ import annotations

import asyncio

import pytest

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.agent_protocol import InboxFull, error_message
from dpfl.server.orchestrator.channel import RoundChannel
from dpfl.server.settings import StreamLimits


def _keys() -> pb.AgentMessage:
    header = pb.RoundHeader(job_id="job", round=1, stage=pb.STAGE_ADVERTISE_KEYS)
    return pb.AgentMessage(advertise_keys=pb.AdvertiseKeysResponse(header=header))


def _channel(limits: StreamLimits) -> RoundChannel:
    channel = RoundChannel(job_id="job", number=1, participants=["a", "b"], limits=limits)
    channel.open_stage(pb.STAGE_ADVERTISE_KEYS)
    return channel


def test_an_agent_over_the_message_bound_is_refused_until_the_round_reads() -> None:
    async def main() -> None:
        channel = _channel(StreamLimits(inbox_messages=3))
        for _ in range(3):
            channel.deliver("a", _keys(), 10)
        with pytest.raises(InboxFull, match=r"stream_limits\.inbox_messages = 3") as refused:
            channel.deliver("a", _keys(), 10)
        channel.deliver("b", _keys(), 10)  # the bound is per agent
        reply = error_message(refused.value)
        assert reply.error.code == pb.ERROR_INVALID_ARGUMENT
        handled: list[str] = []
        await channel.collect(
            deadline=asyncio.get_running_loop().time() + 1,
            pending=lambda: {"a", "b"} - set(handled),
            handle=lambda agent, _: handled.append(agent),
        )
        channel.deliver("a", _keys(), 10)  # the round read one: room for one more

    asyncio.run(main())


def test_an_agent_over_the_byte_bound_is_refused_but_one_message_always_fits() -> None:
    channel = _channel(StreamLimits(inbox_bytes=4096))
    channel.deliver("a", _keys(), 1_000_000)  # alone: whatever its size
    with pytest.raises(InboxFull, match=r"stream_limits\.inbox_bytes = 4096"):
        channel.deliver("a", _keys(), 1)
    channel.deliver("b", _keys(), 4000)
    channel.deliver("b", _keys(), 96)
    with pytest.raises(InboxFull):
        channel.deliver("b", _keys(), 1)
