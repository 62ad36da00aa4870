"""An agent that leaves a round says so, and the coordinator drops it at once.

Real coordinator (SQLite store, round engine, gRPC on loopback) and real agents
(``dpfl.client``). One agent's first masked-input piece is damaged on its way out (its link
rewrites it); the coordinator refuses that piece with an ``Error`` carrying the round's header.
The agent then leaves the round; it must tell the coordinator with its own ``Error``, so that
the round goes on without it well before the masked-input deadline (40 s here) instead of
waiting for it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from support.coordination import deadlines, small_job

from dpfl.client.progress import AgentEvent, EventKind
from dpfl.client.simulation import start_simulated_agent
from dpfl.client.transport import Backoff, Connector, CoordinatorLink, GrpcTransport
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.agent_protocol import submit
from dpfl.server.coordinator import Coordinator
from dpfl.server.settings import Settings

AGENTS = 4


class _DamagingLink:
    """A real link whose first masked-input piece gets a wrong vector length on the way out."""

    def __init__(self, link: CoordinatorLink) -> None:
        self._link = link
        self.damaged = 0

    async def send(self, message: pb.AgentMessage) -> None:
        if message.WhichOneof("body") == "masked_input" and not self.damaged:
            bad = pb.AgentMessage()
            bad.CopyFrom(message)
            bad.masked_input.masked_input.CopyFrom(
                pb.PackedVector(bit_width=8, length=3, data=b"abc", total_length=3)
            )
            self.damaged += 1
            message = bad
        await self._link.send(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)


class _DamagingConnector:
    def __init__(self, inner: Connector) -> None:
        self.inner = inner
        self.links: list[_DamagingLink] = []

    async def connect(self, hello: pb.Hello) -> CoordinatorLink:
        link = _DamagingLink(await self.inner.connect(hello))
        self.links.append(link)
        return link  # type: ignore[return-value]


def test_an_agent_whose_piece_was_refused_leaves_and_the_round_goes_on_at_once(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'c.db'}",
            grpc_port=0,
            admin_token=secrets.token_urlsafe(32),
            stage_deadlines=deadlines(),
        )
        c = Coordinator(settings=settings, serve_api=False, max_attempts=1)
        await c.start()
        transports: list[GrpcTransport] = []
        agents: list[Any] = []
        events: list[AgentEvent] = []
        damaging: _DamagingConnector | None = None
        try:
            for i in range(AGENTS):
                token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
                transport = GrpcTransport(c.grpc_address, insecure=True)
                transports.append(transport)
                enrolled = await transport.enroll(token=token, name=f"a{i}")
                connector: Connector = transport.connector(
                    agent_id=enrolled.agent_id, credential=enrolled.credential
                )
                if i == 0:
                    damaging = _DamagingConnector(connector)
                    connector = damaging  # type: ignore[assignment]
                agents.append(
                    start_simulated_agent(
                        agent_id=enrolled.agent_id,
                        connector=connector,
                        data_spec=f"digits#index={i}&agents={AGENTS}",
                        state_dir=tmp_path / f"agent-{i}",
                        coordinator_id=c.coordinator_id,
                        observer=events.append if i == 0 else None,
                        backoff=Backoff(initial=0.05, maximum=0.2),
                    )
                )
            ids = [a.agent_id for a in agents]
            assert await c.registry.wait_connected(ids, timeout=20)
            job = submit(c.store, small_job(rounds=1).model_dump(mode="json"), members=ids)
            started = time.monotonic()
            await c.orchestrator.start(job.id)
            final = await asyncio.wait_for(c.orchestrator.wait(job.id), 60)
            elapsed = time.monotonic() - started
            assert final.status.value == "completed", final.error
            assert damaging is not None
            assert damaging.links[0].damaged == 1
            (rnd,) = c.store.list_rounds(job.id)
            assert sorted(rnd.survivors["masked_input"]) == sorted(ids[1:])
            # the masked-input stage closed when the victim said it left, not at its deadline
            assert rnd.stage_seconds["masked_input"] < 5.0, rnd.stage_seconds
            assert elapsed < 20.0
            kinds = [e.kind for e in events]
            assert EventKind.COORDINATOR_ERROR in kinds
            assert EventKind.LEFT_ROUND in kinds
            sent = [e for e in events if e.kind is EventKind.ERROR_SENT]
            assert sent
            assert "left round 1" in sent[-1].message
        finally:
            for agent in agents:
                await agent.close()
            for transport in transports:
                await transport.close()
            await c.close()

    asyncio.run(main())
