"""In-process links between a coordinator and agents in one event loop (``--transport inproc``).

Only the top of the layering (``dpfl``, ``dpfl.cli``) may import both ``dpfl.server`` and
``dpfl.client``; this module is the seam.
The agent's :class:`~dpfl.client.transport.InProcessConnector` calls the coordinator's
transport-free stream and download handlers with the same metadata a gRPC call carries, and
every message crosses the link as serialized bytes (both directions are copied through
``SerializeToString``/``FromString``), so authentication, ``Hello`` first, header checks, size
checks of vectors and every other validation run exactly as over gRPC. What is skipped is only the
socket, HTTP/2 framing and gRPC's message-size limit (which the link enforces itself here).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from google.protobuf.message import Message

from dpfl.client.transport import InProcessConnector
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server import agent_protocol
from dpfl.server.coordinator import Coordinator
from dpfl.server.sessions import Received, serve_stream

__all__ = ["InProcessCoordinator"]


class InProcessCoordinator:
    """The coordinator's handlers as an in-process agent sees them.

    Args:
        coordinator: a started coordinator (``serve_grpc`` may be False).
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.max_bytes = coordinator.settings.max_message_bytes

    def _check_size(self, message: Message) -> int:
        size = message.ByteSize()
        if size > self.max_bytes:
            raise agent_protocol.MessageTooLarge(
                f"message of {size} bytes exceeds the limit of {self.max_bytes}"
            )
        return size

    async def enroll(self, request: pb.EnrollRequest) -> pb.EnrollResponse:
        """``Enroll`` through the transport-free handler (messages copied as bytes)."""
        c = self.coordinator
        self._check_size(request)
        copy = pb.EnrollRequest.FromString(request.SerializeToString())
        response = await asyncio.to_thread(
            agent_protocol.enroll, c.store, c.settings, copy, coordinator_id=c.coordinator_id
        )
        return pb.EnrollResponse.FromString(response.SerializeToString())

    def connect_handler(
        self, metadata: agent_protocol.Metadata, inbound: AsyncIterator[pb.AgentMessage]
    ) -> AsyncGenerator[pb.CoordinatorMessage, None]:
        c = self.coordinator
        if c.registry is None:
            raise RuntimeError("the coordinator is not started")

        async def checked() -> AsyncIterator[Received]:
            async for message in inbound:
                yield Received(message, self._check_size(message))

        return serve_stream(
            store=c.store, registry=c.registry, metadata=list(metadata), inbound=checked()
        )

    async def download_handler(
        self, metadata: agent_protocol.Metadata, request: pb.DownloadRequest
    ) -> list[pb.DownloadChunk]:
        c = self.coordinator
        pairs = list(metadata)
        # as over gRPC: a download along the agent's live stream is trusted as the stream is
        live = c.registry.verified_agent(pairs) if c.registry is not None else None
        invited = (
            live is not None
            and c.registry is not None
            and c.registry.in_round(live.id, request.job_id)
        )
        return await asyncio.to_thread(
            agent_protocol.serve_download,
            c.store,
            pairs,
            request,
            blobs=c.orchestrator,
            live=live,
            invited=invited,
        )

    def connector(self, *, agent_id: str, credential: str) -> InProcessConnector:
        """An agent's connector to this coordinator."""
        return InProcessConnector(
            connect_handler=self.connect_handler,
            download_handler=self.download_handler,
            agent_id=agent_id,
            credential=credential,
        )
