"""A group of simulated agents in a worker process of its own (``dpfl simulate --backend ray``).

:class:`RemoteAgentHost` does not import Ray: ``dpfl.simulation.ray_backend`` wraps it with
``ray.remote``, and its methods are coroutines so the actor's event loop keeps the agents' streams
alive between calls. Each host opens one gRPC channel, enrols its agents, loads their data shards
itself (the driver never ships data) and runs them in an
:class:`~dpfl.client.simulation.AgentHost`. If the process dies, its agents count as dropouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpfl.client.policy import Policy
from dpfl.client.simulation import AgentHost, SimulatedAgent
from dpfl.client.transport import Backoff, GrpcTransport
from dpfl.protos.dpfl.v1 import agent_pb2 as pb

__all__ = ["ENROLL_CONCURRENCY", "HostedAgent", "RemoteAgentHost"]

#: Enrolment calls one host keeps in flight (hundreds at once would outlast their timeout).
ENROLL_CONCURRENCY = 16


@dataclass(frozen=True)
class HostedAgent:
    """What a remote host needs to start one agent of the simulation."""

    index: int
    name: str
    enrollment_token: str
    data_spec: str
    policy: Policy | None = None


class RemoteAgentHost:
    """Agents of one simulation in this process, each on its own gRPC stream.

    Args:
        address: the coordinator's ``HOST:PORT``, reachable from this process.
        torch_threads: torch intra-op and BLAS threads for the process.
        device: where the agents train (``cuda`` when a GPU share was granted).
        coordinator_id: stored with each local ledger record.
    """

    def __init__(
        self,
        address: str,
        *,
        torch_threads: int = 1,
        device: str = "cpu",
        coordinator_id: str = "",
    ) -> None:
        self.address = address
        self.torch_threads = torch_threads
        self.device = device
        self.coordinator_id = coordinator_id
        self._tmp = tempfile.TemporaryDirectory(prefix="dpfl-remote-")
        self._host: AgentHost | None = None
        self._transport: GrpcTransport | None = None
        self._agents: list[SimulatedAgent] = []

    async def start(self, agents: Sequence[HostedAgent]) -> list[str]:
        """Enrol and start ``agents``; returns their agent ids in the same order.

        Raises:
            EnrollmentError, TransportError: enrolment failed.
            DataSpecError: a data spec is malformed or cannot be loaded.
        """
        if self._host is None:
            self._host = AgentHost(torch_threads=self.torch_threads)
            self._transport = GrpcTransport(self.address, insecure=True)
        assert self._transport is not None
        transport = self._transport
        gate = asyncio.Semaphore(ENROLL_CONCURRENCY)

        async def enroll(spec: HostedAgent) -> pb.EnrollResponse:
            async with gate:
                return await transport.enroll(token=spec.enrollment_token, name=spec.name)

        responses = await asyncio.gather(*(enroll(a) for a in agents))
        ids = []
        for spec, response in zip(agents, responses, strict=True):
            agent = await self._host.start(
                agent_id=response.agent_id,
                connector=transport.connector(
                    agent_id=response.agent_id, credential=response.credential
                ),
                data_spec=spec.data_spec,
                state_dir=Path(self._tmp.name) / f"{spec.index:05d}",
                policy=spec.policy,
                coordinator_id=self.coordinator_id,
                device=self.device,
                backoff=Backoff(initial=0.05, maximum=0.5),
            )
            self._agents.append(agent)
            ids.append(response.agent_id)
        return ids

    async def alive(self) -> list[bool]:
        """Whether each hosted agent is still serving, in start order."""
        return [a.alive for a in self._agents]

    async def pid(self) -> int:
        """This process's id (tests kill it to play a crashed machine)."""
        return os.getpid()

    async def stop(self) -> None:
        """Stop every agent, close the channel and remove the ledgers; idempotent."""
        if self._host is not None:
            await self._host.close(timeout=5)
            self._host = None
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await self._transport.close()
            self._transport = None
        self._tmp.cleanup()
