"""Disabling an agent ends its part at once, over real gRPC, on SQLite and PostgreSQL.

Four protocol-level agents run a four-round DP-FedAvg job. One of them is patched to keep going
whatever happens: in round 2, with its stream open, it is disabled (through the REST API of the
running coordinator, or in the database as ``dpfl-coordinator agent disable`` does from another
process), and it still sends its masked input, then reconnects again and again and sends it
anew. The coordinator must close its stream, drop it from round 2 and every later round, and
refuse everything it sends afterwards: its input is summed in round 1 only, and it is charged
for no round after the one it was disabled in.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import pytest
from support.coordination import deadlines, small_job
from support.wire_agent import WireAgent, metadata, wire_agents

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.server.agent_protocol import submit
from dpfl.server.coordinator import Coordinator
from dpfl.server.settings import Settings
from dpfl.server.store import AgentStatus

ROUNDS = 4


class StubbornAgent(WireAgent):
    """Sends its masked input whatever it is told, and reconnects to send it again."""

    disable: Any = None
    coordinator: Any = None
    retries: list[grpc.StatusCode] = []  # noqa: RUF012 (replaced per instance)
    sent_after_disable: int = 0
    retrying: Any = None

    async def _handle(self, stub: Any, message: pb.CoordinatorMessage, state: Any) -> None:
        kind = message.WhichOneof("body")
        if kind == "masked_input" and message.masked_input.header.round == 2:
            await self.disable()
            for _ in range(50):  # the database path: the coordinator notices within seconds
                if self.coordinator.registry.get(self.agent_id) is None:
                    break
                await asyncio.sleep(0.1)
            before = self._outbox.qsize()
            await super()._handle(stub, message, state)
            self.sent_after_disable = self._outbox.qsize() - before
            pieces = [self._outbox.get_nowait() for _ in range(self._outbox.qsize())]
            for piece in pieces:
                self._outbox.put_nowait(piece)
            self.retrying = asyncio.ensure_future(self._retry([p for p in pieces if p]))
            return
        await super()._handle(stub, message, state)

    async def _retry(self, pieces: list[pb.AgentMessage]) -> None:
        """Reconnect three times with the cached credential and send the input again.

        Each attempt writes its ``Hello`` and waits for the coordinator's verdict before it
        writes more, as an agent does: a ``grpc.aio`` write still in flight when the refusal
        arrives turns the call's status into INTERNAL on the client (grpc/grpc#36066), which
        would hide the coordinator's answer. A stream that stays open gets the input anew.
        """
        self.retries = []
        for _ in range(3):
            async with grpc.aio.insecure_channel(self.address) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)
                call = stub.Connect(metadata=metadata(self.agent_id, self.credential))
                try:
                    await call.write(pb.AgentMessage(hello=pb.Hello(agent_id=self.agent_id)))
                    verdict = asyncio.ensure_future(call.code())
                    done, _ = await asyncio.wait({verdict}, timeout=2.0)
                    if not done:  # accepted: send the input anew, then close the stream
                        for piece in pieces:
                            await call.write(piece)
                        await call.done_writing()
                        async for _ in call:
                            pass
                    self.retries.append(await verdict)
                except grpc.aio.AioRpcError as exc:
                    self.retries.append(exc.code())
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("path", ["rest", "database"])
def test_a_disabled_agent_is_shut_out_of_its_open_stream_and_every_round(
    coordinator_db: str, tmp_path: Path, path: str
) -> None:
    async def main() -> None:
        admin = secrets.token_urlsafe(32)
        settings = Settings(
            database_url=coordinator_db,
            grpc_port=0,
            api_port=0,
            admin_token=admin,
            stage_deadlines=deadlines(),
        )
        c = Coordinator(settings=settings, serve_api=path == "rest", max_attempts=1)
        await c.start()
        try:
            plain = await wire_agents(c, ROUNDS)
            agents: list[WireAgent] = plain[1:]
            x = StubbornAgent(
                plain[0].address, plain[0].agent_id, plain[0].credential, plain[0].data
            )
            x.coordinator = c

            async def disable() -> None:
                if path == "rest":
                    async with httpx.AsyncClient(base_url=c.api_url) as http:
                        r = await http.post(
                            f"/api/v1/agents/{x.agent_id}/disable",
                            headers={"Authorization": f"Bearer {admin}"},
                            json={"reason": "silo compromised"},
                        )
                        assert r.status_code == 200, r.text
                else:
                    await asyncio.to_thread(
                        c.store.set_agent_status, x.agent_id, AgentStatus.DISABLED
                    )

            x.disable = disable
            everyone = [x, *agents]
            tasks = [asyncio.create_task(a.run()) for a in everyone]
            ids = [a.agent_id for a in everyone]
            assert await c.registry.wait_connected(ids, timeout=10)
            job = small_job(rounds=ROUNDS)
            created = submit(c.store, job.model_dump(mode="json"), members=ids)
            await c.orchestrator.start(created.id)
            final = await asyncio.wait_for(c.orchestrator.wait(created.id), 120)
            assert final.status.value == "completed", final.error
            rounds = [r for r in c.store.list_rounds(created.id) if r.status.value == "completed"]
            assert [r.number for r in rounds] == list(range(1, ROUNDS + 1))
            assert x.agent_id in rounds[0].survivors["masked_input"]
            assert x.sent_after_disable > 0  # it did send its input after being disabled
            for rnd in rounds[1:]:
                assert x.agent_id not in rnd.survivors["masked_input"], rnd.number
                assert x.agent_id not in rnd.survivors.get("unmask", ()), rnd.number
            for rnd in rounds[2:]:
                assert x.agent_id not in rnd.invited, rnd.number
            entries = c.store.ledger_entries(agent_id=x.agent_id, job_id=created.id)
            # round 2's population was fixed before the disable: charging all of it (the
            # sampled-population event) stays an over-report, never an under-count
            assert [e.round_number for e in entries] == [1, 2]
            # its stream was closed with the reason, and every reconnection was refused
            assert any(e.code == pb.ERROR_UNAUTHENTICATED for e in x.errors), x.errors
            for _ in range(50):
                if len(x.retries) == 3:
                    break
                await asyncio.sleep(0.1)
            assert x.retries == [grpc.StatusCode.UNAUTHENTICATED] * 3
            assert c.registry.get(x.agent_id) is None
            if path == "rest":
                (record,) = c.store.audit_records(agent_id=x.agent_id)
                assert record.action == "agent.disable"
                assert "silo compromised" in record.detail
            for a in agents:
                await a.stop()
            await x.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        finally:
            await c.close()

    asyncio.run(main())
