"""``dpfl.v1.AgentService`` over ``grpc.aio``: authentication, the task stream and downloads.

Nothing here decides anything: each RPC calls a transport-free handler and maps its typed error to
a gRPC status. A bad job document or protocol message never reaches the store or a round.

Under mutual TLS the verified client certificate's common name (:func:`peer_certificate_cn`) is
handed to the handlers: ``Enroll`` binds the new agent to it, ``Connect`` and ``Download``
refuse an agent whose certificate is not the one it enrolled with. With a certificate revocation
list (``dpfl.server.grpc.crl``) every RPC presenting a revoked certificate is refused
(``UNAUTHENTICATED``) before anything else.

An agent that stops reading its ``Connect`` stream is disconnected once its session overflows
(``dpfl.server.sessions.Session``): the status ``RESOURCE_EXHAUSTED`` is queued behind what the
transport still holds for it, and the call, whose write the agent never reads, is ended then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from dpfl.learning.jobs import JobSpecError
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.server import agent_protocol
from dpfl.server.errors import ServerError
from dpfl.server.grpc.crl import RevocationList, peer_certificate_serial
from dpfl.server.sessions import Received, SessionRegistry, StreamOverflow, serve_stream
from dpfl.server.settings import Settings
from dpfl.server.store import Store

__all__ = ["OVERFLOW_STATUS_GRACE_S", "AgentServicer", "grpc_status", "peer_certificate_cn"]

#: Seconds the status of an overflowing stream may take to reach its agent before the call is
#: ended anyway (an agent that reads gets it at once; one that never reads holds it unread).
OVERFLOW_STATUS_GRACE_S = 1.0

_log = logging.getLogger("dpfl.server.grpc")

M = TypeVar("M", bound=Message)
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and detail an error is answered with (INTERNAL for anything untyped, which is
    logged with its traceback: the answer reveals nothing of it)."""
    if isinstance(exc, ServerError):
        if exc.grpc_status == "INTERNAL":
            _log.error("internal error answered: %s", exc)
        return grpc.StatusCode[exc.grpc_status], str(exc)
    if isinstance(exc, JobSpecError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    _log.error("internal error answered (%s)", type(exc).__name__, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})"


def peer_certificate_cn(context: grpc.aio.ServicerContext[_Request, _Response]) -> str | None:
    """The common name of the client certificate gRPC verified for this call.

    Returns None when the peer presented no certificate (plaintext, or TLS without client
    certificates) and ``""`` for a verified certificate without a common name, so that such a
    certificate can never match an agent's binding.
    """
    auth = context.auth_context()
    if not auth.get("x509_pem_cert"):
        return None
    name = next(iter(auth.get("x509_common_name", ())), None)
    return name.decode("utf-8", "replace") if name is not None else ""


def _peer_serial(context: grpc.aio.ServicerContext[_Request, _Response]) -> int | None:
    pem = next(iter(context.auth_context().get("x509_pem_cert", ())), None)
    return peer_certificate_serial(pem) if pem is not None else None


def _decode(cls: type[M], data: bytes) -> M:
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise agent_protocol.MalformedMessage(f"malformed {cls.__name__}: {exc}") from None


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """The coordinator's side of ``AgentService``.

    Args:
        store: the coordinator's store.
        settings: its settings (default budget of enrolled agents).
        registry: the sessions of connected agents.
        blobs: where public query sets come from (the orchestrator).
        coordinator_id: returned by ``Enroll``.
        revocations: the client CA's revocation list (mutual TLS), or None.
    """

    def __init__(
        self,
        *,
        store: Store,
        settings: Settings,
        registry: SessionRegistry,
        blobs: agent_protocol.BlobSource | None,
        coordinator_id: str,
        revocations: RevocationList | None = None,
    ) -> None:
        self.revocations = revocations
        self.store = store
        self.settings = settings
        self.registry = registry
        self.blobs = blobs
        self.coordinator_id = coordinator_id
        self._endings: set[asyncio.Task[None]] = set()

    def rpc_handlers(self) -> grpc.GenericRpcHandler:
        """The service's handlers, decoding requests here rather than in gRPC, so that
        undecodable bytes are answered with INVALID_ARGUMENT (gRPC itself would say UNKNOWN)."""

        async def enroll(
            data: bytes, context: grpc.aio.ServicerContext[bytes, pb.EnrollResponse]
        ) -> pb.EnrollResponse:
            try:
                request = _decode(pb.EnrollRequest, data)
            except agent_protocol.MalformedMessage as exc:
                await context.abort(*grpc_status(exc))
            return await self.Enroll(request, context)

        async def connect(
            requests: AsyncIterator[bytes],
            context: grpc.aio.ServicerContext[bytes, pb.CoordinatorMessage],
        ) -> AsyncIterator[pb.CoordinatorMessage]:
            async def decoded() -> AsyncIterator[Received | agent_protocol.RoundMessageError]:
                async for data in requests:
                    try:
                        yield Received(_decode(pb.AgentMessage, data), len(data))
                    except agent_protocol.MalformedMessage as exc:
                        yield exc

            async for message in self._connect(decoded(), context):
                yield message

        async def download(
            data: bytes, context: grpc.aio.ServicerContext[bytes, pb.DownloadChunk]
        ) -> AsyncIterator[pb.DownloadChunk]:
            try:
                request = _decode(pb.DownloadRequest, data)
            except agent_protocol.MalformedMessage as exc:
                await context.abort(*grpc_status(exc))
            async for chunk in self.Download(request, context):
                yield chunk

        return grpc.method_handlers_generic_handler(
            "dpfl.v1.AgentService",
            {
                "Enroll": grpc.unary_unary_rpc_method_handler(
                    enroll, response_serializer=pb.EnrollResponse.SerializeToString
                ),
                "Connect": grpc.stream_stream_rpc_method_handler(
                    connect, response_serializer=pb.CoordinatorMessage.SerializeToString
                ),
                "Download": grpc.unary_stream_rpc_method_handler(
                    download, response_serializer=pb.DownloadChunk.SerializeToString
                ),
            },
        )

    def _check_revoked(self, context: grpc.aio.ServicerContext[_Request, _Response]) -> int | None:
        """The peer certificate's serial. Raises: InvalidCredential when it is revoked."""
        serial = _peer_serial(context)
        if self.revocations is not None:
            self.revocations.check(serial)
        return serial

    async def Enroll(  # noqa: N802 (the proto's method name)
        self,
        request: pb.EnrollRequest,
        context: grpc.aio.ServicerContext[_Request, pb.EnrollResponse],
    ) -> pb.EnrollResponse:
        try:
            self._check_revoked(context)
            return await asyncio.to_thread(
                agent_protocol.enroll,
                self.store,
                self.settings,
                request,
                coordinator_id=self.coordinator_id,
                certificate_cn=peer_certificate_cn(context),
            )
        except Exception as exc:
            await context.abort(*grpc_status(exc))

    def Connect(  # noqa: N802
        self,
        request_iterator: AsyncIterator[pb.AgentMessage],
        context: grpc.aio.ServicerContext[_Request, pb.CoordinatorMessage],
    ) -> AsyncIterator[pb.CoordinatorMessage]:
        return self._connect(request_iterator, context)

    async def _connect(
        self,
        request_iterator: AsyncIterator[
            pb.AgentMessage | Received | agent_protocol.RoundMessageError
        ],
        context: grpc.aio.ServicerContext[_Request, pb.CoordinatorMessage],
    ) -> AsyncIterator[pb.CoordinatorMessage]:
        try:
            serial = self._check_revoked(context)
        except ServerError as exc:
            await context.abort(*grpc_status(exc))
        call = asyncio.current_task()

        def overflow(exc: StreamOverflow) -> None:
            task = asyncio.get_running_loop().create_task(self._end_unread(context, call, exc))
            self._endings.add(task)
            task.add_done_callback(self._endings.discard)

        stream = serve_stream(
            store=self.store,
            registry=self.registry,
            metadata=context.invocation_metadata(),
            inbound=request_iterator,
            certificate_cn=peer_certificate_cn(context),
            certificate_serial=serial,
            on_overflow=overflow,
        )
        try:
            async for message in stream:
                yield message
        except Exception as exc:
            if not context.done():  # an overflow's status may be on its way already
                await context.abort(*grpc_status(exc))
        finally:
            await stream.aclose()

    @staticmethod
    async def _end_unread(
        context: grpc.aio.ServicerContext[_Request, pb.CoordinatorMessage],
        call: asyncio.Task[object] | None,
        exc: StreamOverflow,
    ) -> None:
        """End the call of a session that overflowed.

        Its writer is stuck in a write the agent does not read, so it cannot answer the status
        itself: the status is sent from here, queued behind what the transport holds for the
        agent (it gets it once it reads). When it has not gone out within
        :data:`OVERFLOW_STATUS_GRACE_S`, the call's task is cancelled, which releases the
        stuck write; the status stays queued.
        """
        if context.done():
            return
        try:
            async with asyncio.timeout(OVERFLOW_STATUS_GRACE_S):
                await context.abort(*grpc_status(exc))
        except TimeoutError:
            if call is not None and not call.done():
                call.cancel()
        except grpc.aio.AbortError:
            pass  # the status went out: the call ends by itself

    async def Download(  # noqa: N802
        self,
        request: pb.DownloadRequest,
        context: grpc.aio.ServicerContext[_Request, pb.DownloadChunk],
    ) -> AsyncIterator[pb.DownloadChunk]:
        try:
            self._check_revoked(context)
            metadata = context.invocation_metadata()
            certificate_cn = peer_certificate_cn(context)

            # an agent downloading along its live, authenticated stream is trusted as that
            # stream is (evicting the agent ends both); otherwise the store authenticates it
            live = self.registry.verified_agent(metadata)
            # an invitee of the job's running round is a member for that round's download
            invited = live is not None and self.registry.in_round(live.id, request.job_id)

            chunks = await asyncio.to_thread(  # one worker-thread hop for both steps
                agent_protocol.serve_download,
                self.store,
                metadata,
                request,
                blobs=self.blobs,
                live=live,
                invited=invited,
                certificate_cn=certificate_cn,
            )
        except Exception as exc:
            await context.abort(*grpc_status(exc))
        for chunk in chunks:
            yield chunk
