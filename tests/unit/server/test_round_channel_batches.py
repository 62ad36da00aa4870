"""A stage's answers are handled in batches: everything already queued, then one ``flush``.

With n answers arriving together, the engine used to add each to the secure-aggregation state
on its own (copying the state's collections per message) and to recompute the pending set per
message: O(n²) per stage, the second-largest cost at 1000 agents in ``benchmarks/scale.py``.
"""

from __future__ import annotations

import asyncio

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.orchestrator.channel import RoundChannel


def _keys(agent: str) -> pb.AgentMessage:
    header = pb.RoundHeader(job_id="job", round=1, stage=pb.STAGE_ADVERTISE_KEYS)
    return pb.AgentMessage(advertise_keys=pb.AdvertiseKeysResponse(header=header))


def test_queued_answers_are_handled_before_one_flush() -> None:
    agents = [f"a{i}" for i in range(50)]

    async def main() -> tuple[list[str], list[int], int]:
        channel = RoundChannel(job_id="job", number=1, participants=agents)
        channel.open_stage(pb.STAGE_ADVERTISE_KEYS)
        for agent in agents[:-1]:
            channel.inbox.put_nowait((agent, _keys(agent)))
        channel.disconnected(agents[-1])  # a dropout in the same burst
        handled: list[str] = []
        flushed: list[int] = []
        applied: set[str] = set()
        asked = [0]

        def pending() -> set[str]:
            asked[0] += 1
            return set(agents) - applied

        def handle(agent: str, message: pb.AgentMessage) -> None:
            handled.append(agent)

        def flush() -> None:
            flushed.append(len(handled) - sum(flushed))
            applied.update(handled)

        loop = asyncio.get_running_loop()
        await channel.collect(deadline=loop.time() + 5, pending=pending, handle=handle, flush=flush)
        return handled, flushed, asked[0]

    handled, flushed, asked = asyncio.run(main())
    assert handled == agents[:-1]
    assert flushed == [49]  # one batch for the whole burst
    assert asked == 2  # before the burst, and once after it


def test_without_flush_each_message_is_handled_at_once() -> None:
    agents = ["a", "b"]

    async def main() -> list[tuple[str, int]]:
        channel = RoundChannel(job_id="job", number=1, participants=agents)
        channel.open_stage(pb.STAGE_ADVERTISE_KEYS)
        for agent in agents:
            channel.inbox.put_nowait((agent, _keys(agent)))
        seen: list[tuple[str, int]] = []
        done: set[str] = set()

        def handle(agent: str, message: pb.AgentMessage) -> None:
            done.add(agent)
            seen.append((agent, len(done)))

        loop = asyncio.get_running_loop()
        await channel.collect(
            deadline=loop.time() + 5, pending=lambda: set(agents) - done, handle=handle
        )
        return seen

    assert asyncio.run(main()) == [("a", 1), ("b", 2)]
