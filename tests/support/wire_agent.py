"""Test-only: a protocol-level agent speaking ``dpfl.v1`` over a real gRPC channel.

It runs the real secagg client state machine and the real algorithm's agent side, but none of the
agent package's policy, ledger or reconnection logic: tests of the coordinator use it where they
need to put exact bytes on the wire (bad input on every RPC, a client that stops at a chosen
stage) and to check the coordinator against a second, independent implementation of the
agent's side of docs/architecture.md. End-to-end tests use the real ``dpfl.client`` agents.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from dpfl.learning.algorithms.base import AgentData
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.mechanisms import EncodingConfig, encode
from dpfl.protos import secagg_wire as wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.secagg import RoundParameters
from dpfl.secagg import client as secagg_client
from dpfl.secagg.randomness import SystemRandomSource

__all__ = ["WireAgent", "enroll", "metadata", "run_wire_job", "wire_agents"]


def metadata(agent_id: str, credential: str) -> tuple[tuple[str, str], ...]:
    return (("x-dpfl-agent-id", agent_id), ("authorization", f"Bearer {credential}"))


async def enroll(address: str, token: str, name: str) -> pb.EnrollResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        return await stub.Enroll(pb.EnrollRequest(enrollment_token=token, name=name))


@dataclass
class WireAgent:
    """One agent; ``stop_before`` names a stage ("advertise_keys", "share_keys", "masked_input",
    "unmask") at which it closes its stream instead of answering; ``rewrite`` turns each message
    it sends after ``Hello`` into the messages actually sent (corrupt, repeat or drop them).

    ``errors`` collects the ``Error`` messages the coordinator sent, ``results`` the
    ``RoundResult``s, ``received`` every message kind in order.
    """

    address: str
    agent_id: str
    credential: str
    data: AgentData
    accept: bool = True
    stop_before: str | None = None
    on_message: Callable[[WireAgent, pb.CoordinatorMessage], None] | None = None
    rewrite: Callable[[pb.AgentMessage], list[pb.AgentMessage]] | None = None
    errors: list[pb.Error] = field(default_factory=list)
    results: list[pb.RoundResult] = field(default_factory=list)
    received: list[str] = field(default_factory=list)
    _outbox: asyncio.Queue[pb.AgentMessage | None] = field(default_factory=asyncio.Queue)
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, message: pb.AgentMessage) -> None:
        for item in [message] if self.rewrite is None else self.rewrite(message):
            self._outbox.put_nowait(item)

    async def _outbound(self) -> AsyncIterator[pb.AgentMessage]:
        yield pb.AgentMessage(hello=pb.Hello(agent_id=self.agent_id, device="cpu"))
        while True:
            item = await self._outbox.get()
            if item is None:
                return
            yield item

    async def run(self) -> None:
        """Serve until the stream ends or the agent stops at ``stop_before``."""
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            call = stub.Connect(self._outbound(), metadata=metadata(self.agent_id, self.credential))
            self._stub = stub
            state: dict[str, Any] = {}
            try:
                async for message in call:
                    kind = message.WhichOneof("body")
                    self.received.append(kind)
                    if self.on_message is not None:
                        self.on_message(self, message)
                    if kind == self.stop_before:
                        call.cancel()
                        return
                    await self._handle(stub, message, state)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    raise
            finally:
                self._stopped.set()

    async def _handle(
        self,
        stub: agent_pb2_grpc.AgentServiceStub,
        message: pb.CoordinatorMessage,
        state: dict[str, Any],
    ) -> None:
        kind = message.WhichOneof("body")
        if kind == "error":
            self.errors.append(message.error)
        elif kind == "result":
            self.results.append(message.result)
        elif kind == "invitation":
            inv = message.invitation
            state.clear()
            state.update(
                params=get_algorithm(inv.algorithm).parse_task(inv.params_json),
                algorithm=inv.algorithm,
                job_id=inv.header.job_id,
                round=inv.header.round,
                model_version=inv.model_version,
            )
            self.send(
                pb.AgentMessage(
                    invitation_response=pb.InvitationResponse(header=inv.header, accept=self.accept)
                )
            )
        elif kind == "advertise_keys":
            setup = message.advertise_keys.setup
            encoding = EncodingConfig.from_json(setup.encoding_json)
            state["encoding"] = encoding
            state["ring_bits"] = setup.ring_bits
            state["vector"] = asyncio.ensure_future(self._compute(stub, state))
            if setup.degree == 0:  # a plain round (secure aggregation disabled)
                state["plain"] = True
                self.send(
                    pb.AgentMessage(
                        advertise_keys=pb.AdvertiseKeysResponse(
                            header=message.advertise_keys.header
                        )
                    )
                )
                return
            RoundParameters.from_setup(wire.setup_from_pb(setup))
            client = secagg_client.new_client(
                job_id=state["job_id"], round=state["round"], rng=SystemRandomSource()
            )
            await self._step(client, wire.from_coordinator_message(message), state)
        elif kind in ("share_keys", "unmask"):
            await self._step(state["client"], wire.from_coordinator_message(message), state)
        elif kind == "masked_input":
            encoded = await state["vector"]
            if state.get("plain"):
                header = message.masked_input.header
                for piece in wire.codec.to_messages(encoded, state["ring_bits"]):
                    self.send(
                        pb.AgentMessage(
                            masked_input=pb.MaskedInputResponse(header=header, masked_input=piece)
                        )
                    )
                return
            client = secagg_client.with_input(state["client"], encoded)
            await self._step(client, wire.from_coordinator_message(message), state)

    async def _step(self, client: Any, request: Any, state: dict[str, Any]) -> None:
        client, reply = secagg_client.step(client, request)
        state["client"] = client
        if reply is not None:
            for m in wire.to_agent_messages(reply, ring_bits=state["ring_bits"]):
                self.send(m)

    async def _compute(self, stub: agent_pb2_grpc.AgentServiceStub, state: dict[str, Any]) -> Any:
        model = None
        chunks = stub.Download(
            pb.DownloadRequest(
                job_id=state["job_id"], kind=pb.BLOB_MODEL, version=state["model_version"]
            ),
            metadata=metadata(self.agent_id, self.credential),
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            model = b"".join([c.data async for c in chunks])
        side = get_algorithm(state["algorithm"]).agent(state["params"])
        vector = await asyncio.to_thread(
            side.compute,
            self.data,
            model=model,
            public_x=None,
            device="cpu",
        )
        stream = SystemRandomSource().stream("encode")
        return encode(vector, config=state["encoding"], stream=stream)

    async def stop(self) -> None:
        self._outbox.put_nowait(None)


async def wire_agents(coordinator: Any, count: int, *, name: str = "wire") -> list[WireAgent]:
    """``count`` agents enrolled with a started ``dpfl.server`` coordinator (gRPC), agent i
    holding part i of an IID partition of digits."""
    from datetime import timedelta

    from dpfl.learning.data import federate, load_dataset, partition_from_config

    dataset = load_dataset("digits")
    fed = federate(dataset, scheme=partition_from_config({"scheme": "iid"}), num_agents=count)
    agents = []
    for i in range(count):
        token = coordinator.store.create_enrollment_token(ttl=timedelta(hours=1)).token
        enrolled = await enroll(coordinator.grpc_address, token, f"{name}-{i}")
        part = fed.agent_dataset(i)
        data = AgentData(part.x_train, part.y_train, dataset.input_shape, dataset.num_classes)
        agents.append(
            WireAgent(coordinator.grpc_address, enrolled.agent_id, enrolled.credential, data)
        )
    return agents


async def run_wire_job(
    coordinator: Any, job: Any, agents: list[WireAgent], *, timeout: float = 60.0
) -> tuple[str, Any]:
    """Connect ``agents``, run ``job`` (a ``JobSpec``) with them as its population until it
    ends, stop them; returns (job id, the job's final record)."""
    from dpfl.server.agent_protocol import submit

    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        ids = [a.agent_id for a in agents]
        assert await coordinator.registry.wait_connected(ids, timeout=10)
        created = submit(coordinator.store, job.model_dump(mode="json"), members=ids)
        await coordinator.orchestrator.start(created.id)
        final = await asyncio.wait_for(coordinator.orchestrator.wait(created.id), timeout)
        return created.id, final
    finally:
        for a in agents:
            await a.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
