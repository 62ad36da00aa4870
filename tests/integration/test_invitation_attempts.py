"""An answer to an earlier attempt of a round never counts for the current one, and a retried
invitation waits longer.

Each attempt's invitation carries its own session id, which agents echo. Here every agent
holds back its answer to the first invitation, so the first attempt aborts with nobody
accepted; on the second invitation each sends the held answer (an accept) and then its real
one: agent 0 declines. Before, the held accepts were counted for the second attempt and the
real answers refused as "already answered", so agent 0 was summed although it declined."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from pathlib import Path

import pytest
from support.coordination import small_job
from support.wire_agent import WireAgent, run_wire_job, wire_agents

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.coordinator import Coordinator
from dpfl.server.orchestrator.channel import invitation_session_id
from dpfl.server.settings import Settings, StageDeadlines

INVITATION_SECONDS = 1.5


def _holding(agent: WireAgent, *, decline_second: bool) -> None:
    held: list[pb.AgentMessage] = []

    def rewrite(message: pb.AgentMessage) -> list[pb.AgentMessage]:
        if message.WhichOneof("body") != "invitation_response":
            return [message]
        if not held:
            held.append(message)  # the first attempt's answer, sent late
            return []
        if len(held) == 1:
            held.append(message)
            answer = pb.AgentMessage()
            answer.CopyFrom(message)
            answer.invitation_response.accept = not decline_second
            return [held[0], answer]
        return [message]

    agent.rewrite = rewrite


def test_a_late_answer_to_an_earlier_attempt_does_not_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpfl.coordinator")

    async def main() -> None:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'c.db'}",
            grpc_port=0,
            admin_token=secrets.token_urlsafe(32),
            stage_deadlines=StageDeadlines(
                invitation=INVITATION_SECONDS, download=20, training=20, masked_input=20
            ),
        )
        c = Coordinator(settings=settings, serve_api=False, max_attempts=3)
        await c.start()
        try:
            agents = await wire_agents(c, 3, name="late")
            windows: list[float] = []

            def seen(agent: WireAgent, message: pb.CoordinatorMessage) -> None:
                if message.WhichOneof("body") == "invitation" and agent is agents[1]:
                    windows.append(message.invitation.deadline_unix - time.time())

            for i, agent in enumerate(agents):
                _holding(agent, decline_second=i == 0)
                agent.on_message = seen
            job_id, final = await run_wire_job(c, small_job(rounds=1), agents, timeout=60)
            assert final.status.value == "completed", final.error
            first, second = c.store.list_rounds(job_id)
            assert first.status.value == "aborted"
            assert not first.accepted
            assert second.status.value == "completed"
            assert sorted(second.accepted) == sorted(a.agent_id for a in agents[1:])
            assert agents[0].agent_id not in second.survivors["masked_input"]
            for agent in agents:
                stale = [e for e in agent.errors if e.header.stage == pb.STAGE_INVITATION]
                # the held answer is refused as stale, naming the first attempt's session
                assert [e.code for e in stale] == [pb.ERROR_STALE_ROUND]
                assert bytes(stale[0].header.session_id) == invitation_session_id(job_id, first.id)
                assert "already answered" not in stale[0].message
            # the operator reads the job's course at INFO: start, plan, each round, the end
            said = [r.getMessage() for r in caplog.records if r.name == "dpfl.coordinator"]
            for expected in (
                f"job {job_id} starting",
                f"job {job_id} (it-dpfedavg, dp-fedavg) planned in",
                f"job {job_id} round 1 aborted",
                f"job {job_id} round 1 completed",
                f"job {job_id} completed: 1 rounds",
            ):
                assert any(m.startswith(expected) for m in said), (expected, said)
            # the retry gave twice as long for the answers
            assert len(windows) == 2
            assert windows[0] < INVITATION_SECONDS + 0.5 < 2 * INVITATION_SECONDS - 0.5 < windows[1]
        finally:
            await c.close()

    asyncio.run(main())
