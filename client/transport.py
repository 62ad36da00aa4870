"""How the agent reaches its coordinator: one interface, two implementations.

The task loop sees only a :class:`CoordinatorLink` (one open task stream) opened by a
:class:`Connector`. :class:`GrpcConnector` speaks ``grpc.aio`` to a real coordinator (TLS unless
``insecure=True`` is said); :class:`InProcessConnector` calls the coordinator's transport-free
handlers with the same metadata and serialized copies of the messages, so every check runs as
over gRPC. :func:`assemble_blob` refuses malformed or mis-hashed downloads. A refused credential
is final (:class:`CredentialRejectedError`); any other broken stream is retried with
:class:`Backoff`. When the coordinator cannot be reached, one quick probe tells whether the
address is the coordinator's REST port instead of its gRPC port, and the error says so
(:meth:`GrpcTransport.port_hint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from dpfl.client.errors import DownloadError, EnrollmentError, TransportError
from dpfl.cmdline.ports import port_hint, probe_port, split_address
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc

__all__ = [
    "AGENT_ID_HEADER",
    "AUTHORIZATION_HEADER",
    "Backoff",
    "Blob",
    "ConnectHandler",
    "Connector",
    "CoordinatorLink",
    "CredentialRejectedError",
    "DownloadHandler",
    "GrpcConnector",
    "GrpcLink",
    "GrpcTransport",
    "InProcessConnector",
    "InProcessLink",
    "LinkClosedError",
    "agent_metadata",
    "assemble_blob",
]

AGENT_ID_HEADER = "x-dpfl-agent-id"
AUTHORIZATION_HEADER = "authorization"
#: Largest blob the agent accepts by default (a model or a public query set).
DEFAULT_MAX_BLOB_BYTES = 1 << 30
#: Channel options: keepalive pings every 30 s on an open stream (the coordinator accepts one every
#: 5 s), messages up to 64 MiB both ways.
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)

#: How long the probe that tells the REST port from the gRPC port may take, after a failure.
PORT_PROBE_TIMEOUT_S = 2.0

Metadata = tuple[tuple[str, str], ...]
M = TypeVar("M", bound=Message)


class LinkClosedError(TransportError):
    """The link has ended; nothing more can be sent on it."""


class CredentialRejectedError(TransportError):
    """The coordinator refused this agent's id or credential (revoked, or another federation)."""


@dataclass(frozen=True, slots=True)
class Blob:
    """A downloaded, verified blob."""

    data: bytes
    media_type: str
    sha256: bytes


class CoordinatorLink(Protocol):
    """One open task stream to the coordinator (``Hello`` already sent)."""

    async def send(self, message: pb.AgentMessage) -> None:
        """Send one message. Raises :class:`LinkClosedError` when the stream has ended."""
        ...

    async def receive(self) -> pb.CoordinatorMessage | None:
        """The next message, or None once the stream has ended (``reason`` says why).

        Raises :class:`CredentialRejectedError` when the coordinator refused the credential.
        """
        ...

    async def download(self, request: pb.DownloadRequest) -> Blob:
        """A verified blob. Raises :class:`DownloadError` (refused, broken, corrupt)."""
        ...

    async def close(self) -> None:
        """End the stream (idempotent)."""
        ...

    @property
    def reason(self) -> str:
        """Why the stream ended ("" while open)."""
        ...


class Connector(Protocol):
    """Opens task streams to one coordinator for one agent."""

    async def connect(self, hello: pb.Hello) -> CoordinatorLink:
        """A new link whose first message was ``hello``.

        Raises:
            CredentialRejectedError: the coordinator refused the credential.
            TransportError: the coordinator cannot be reached now (retry later).
        """
        ...


def agent_metadata(agent_id: str, credential: str) -> Metadata:
    """The metadata every authenticated RPC carries."""
    return ((AGENT_ID_HEADER, agent_id), (AUTHORIZATION_HEADER, f"Bearer {credential}"))


# -- backoff ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter between reconnection attempts.

    Attempt ``n`` (0-based) waits ``min(maximum, initial·factor^n)`` scaled by a uniform factor
    in ``[1 − jitter, 1]``, so a coordinator restart is not met by every agent at the same instant.
    """

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {self}")
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff needs factor >= 1 and jitter in [0, 1], got {self}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        base = min(self.maximum, self.initial * self.factor ** min(attempt, 64))
        draw = (rng or random).random()
        return base * (1.0 - self.jitter * draw)


# -- blobs -----------------------------------------------------------------------------------------


async def assemble_blob(
    chunks: AsyncIterable[pb.DownloadChunk] | Iterable[pb.DownloadChunk],
    *,
    max_bytes: int = DEFAULT_MAX_BLOB_BYTES,
) -> Blob:
    """Join ``DownloadChunk`` messages into a verified blob.

    Raises:
        DownloadError: no chunk, a gap or overlap, a total size that changes or exceeds
            ``max_bytes``, data beyond the total, chunks after the last one, or a SHA-256 digest
            that is missing or does not match.
    """
    buffer = bytearray()
    total: int | None = None
    media_type = ""
    digest: bytes | None = None
    async for chunk in _aiter(chunks):
        if digest is not None:
            raise DownloadError("download: chunk after the last one (which carried the digest)")
        if total is None:
            total = int(chunk.total_size)
            media_type = chunk.media_type
            if total > max_bytes:
                raise DownloadError(f"download: blob of {total} bytes exceeds {max_bytes}")
        elif chunk.total_size != total:
            raise DownloadError(f"download: total size changed from {total} to {chunk.total_size}")
        if chunk.offset != len(buffer):
            raise DownloadError(
                f"download: chunk at offset {chunk.offset}, expected {len(buffer)} (gap or overlap)"
            )
        if len(buffer) + len(chunk.data) > total:
            raise DownloadError(f"download: more data than the announced {total} bytes")
        buffer += chunk.data
        if chunk.sha256:
            digest = bytes(chunk.sha256)
    if total is None:
        raise DownloadError("download: the coordinator sent no chunk")
    if len(buffer) != total:
        raise DownloadError(f"download: got {len(buffer)} of {total} bytes")
    if digest is None:
        raise DownloadError("download: the last chunk carries no SHA-256 digest")
    actual = hashlib.sha256(buffer).digest()
    if actual != digest:
        raise DownloadError("download: SHA-256 mismatch (blob corrupted in transit)")
    return Blob(bytes(buffer), media_type, actual)


async def _aiter(
    items: AsyncIterable[pb.DownloadChunk] | Iterable[pb.DownloadChunk],
) -> AsyncIterator[pb.DownloadChunk]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


# -- gRPC ------------------------------------------------------------------------------------------


def _status(exc: grpc.aio.AioRpcError) -> str:
    details = exc.details() or "no details"
    hint = ""
    if "handshake" in details.lower():
        hint = " [TLS: check --ca, --cert and --key, and that the coordinator serves TLS]"
    elif "socket closed" in details.lower():
        hint = (
            " [a TLS coordinator closes plaintext connections and, under mutual TLS, those"
            " without a client certificate signed by a CA it trusts]"
        )
    return f"{exc.code().name}: {details}{hint}"


class GrpcTransport:
    """A ``grpc.aio`` channel to the coordinator at ``address``.

    Args:
        address: ``HOST:PORT``.
        credentials: TLS (or mutual TLS) channel credentials; None means plaintext, which is
            refused unless ``insecure`` is True.
        insecure: allow a plaintext channel (tests, loopback simulations).
        options: extra channel options (appended to :data:`DEFAULT_CHANNEL_OPTIONS`).
        max_blob_bytes: the largest download accepted.
        download_timeout: seconds one download may take.
        enroll_timeout: seconds the ``Enroll`` call may take.

    Raises:
        TransportError: plaintext without ``insecure``, or an empty address.
    """

    def __init__(
        self,
        address: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        insecure: bool = False,
        options: Sequence[tuple[str, Any]] = (),
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
        download_timeout: float = 300.0,
        enroll_timeout: float = 30.0,
    ) -> None:
        if not address or ":" not in address:
            raise TransportError(f"coordinator address must be HOST:PORT, got {address!r}")
        if credentials is None and not insecure:
            raise TransportError(
                "refusing a plaintext channel: give TLS credentials, or insecure=True (--insecure)"
            )
        self.address = address
        self.secure = credentials is not None
        all_options = [*DEFAULT_CHANNEL_OPTIONS, *options]
        self._channel = (
            grpc.aio.secure_channel(address, credentials, options=all_options)
            if credentials is not None
            else grpc.aio.insecure_channel(address, options=all_options)
        )
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        self.max_blob_bytes = max_blob_bytes
        self.download_timeout = download_timeout
        self.enroll_timeout = enroll_timeout

    async def __aenter__(self) -> GrpcTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def enroll(
        self,
        *,
        token: str,
        name: str,
        agent_version: str = "",
        labels: dict[str, str] | None = None,
    ) -> pb.EnrollResponse:
        """Redeem an enrollment token.

        Raises:
            EnrollmentError: the coordinator refused the token or the request.
            TransportError: the coordinator cannot be reached.
        """
        request = pb.EnrollRequest(
            enrollment_token=token, name=name, agent_version=agent_version, labels=labels or {}
        )
        try:
            response: pb.EnrollResponse = await self._stub.Enroll(
                request, timeout=self.enroll_timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                hint = await self.port_hint()
                raise TransportError(
                    f"cannot reach the coordinator at {self.address} to enrol"
                    f"{f': {hint}' if hint else ''} ({_status(exc)})"
                ) from None
            raise EnrollmentError(f"enrolment refused by {self.address}: {_status(exc)}") from None
        if not response.agent_id or not response.credential:
            raise EnrollmentError("the coordinator's enrolment answer lacks an id or credential")
        return response

    async def port_hint(self) -> str | None:
        """After a failure to reach the coordinator: whether :attr:`address` is the
        coordinator's REST port instead of its gRPC port, and what to do (one quick probe,
        :mod:`dpfl.cmdline.ports`); None when it does not look like that mix-up."""
        target = split_address(self.address)
        if target is None:
            return None
        probe = await probe_port(*target, tls=self.secure, timeout=PORT_PROBE_TIMEOUT_S)
        return port_hint(probe, wanted="grpc", address=self.address)

    def connector(self, *, agent_id: str, credential: str) -> GrpcConnector:
        """Open task streams as ``agent_id``."""
        return GrpcConnector(self, agent_metadata(agent_id, credential))


class GrpcConnector:
    """Opens ``Connect`` streams over a :class:`GrpcTransport`."""

    def __init__(self, transport: GrpcTransport, metadata: Metadata) -> None:
        self._transport = transport
        self._metadata = metadata

    async def connect(self, hello: pb.Hello) -> GrpcLink:
        call = self._transport._stub.Connect(metadata=self._metadata)
        link = GrpcLink(call, self._transport, self._metadata)
        try:
            await link.send(pb.AgentMessage(hello=hello))
        except LinkClosedError as exc:
            await link.close()
            code = await call.code() if call.done() else None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise CredentialRejectedError(
                    f"the coordinator refused the credential: {exc}"
                ) from None
            hint = await self._transport.port_hint()
            raise TransportError(
                f"cannot reach the coordinator at {self._transport.address}"
                f"{f': {hint}' if hint else ''}: {exc}"
            ) from None
        return link


class GrpcLink:
    """One ``Connect`` stream (see :class:`CoordinatorLink`)."""

    def __init__(
        self,
        call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.CoordinatorMessage],
        transport: GrpcTransport,
        metadata: Metadata,
    ) -> None:
        self._call = call
        self._transport = transport
        self._metadata = metadata
        self._reason = ""

    @property
    def reason(self) -> str:
        return self._reason

    async def send(self, message: pb.AgentMessage) -> None:
        if self._reason:
            raise LinkClosedError(self._reason)
        try:
            await self._call.write(message)
        except grpc.aio.AioRpcError as exc:
            self._reason = _status(exc)
            raise LinkClosedError(self._reason) from None
        except (asyncio.InvalidStateError, grpc.RpcError, RuntimeError) as exc:
            self._reason = await self._final_status(exc)
            raise LinkClosedError(self._reason) from None

    async def _final_status(self, exc: BaseException) -> str:
        if self._call.done():
            with contextlib.suppress(Exception):
                code = await self._call.code()
                details = await self._call.details()
                return f"{code.name}: {details or 'no details'}"
        return f"stream closed ({type(exc).__name__})"

    async def receive(self) -> pb.CoordinatorMessage | None:
        if self._reason:
            return None
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            self._reason = _status(exc)
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise CredentialRejectedError(
                    f"the coordinator refused the credential: {exc.details()}"
                ) from None
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._reason = await self._final_status(exc)
            return None
        if not isinstance(message, pb.CoordinatorMessage):  # grpc.aio.EOF: the stream ended
            self._reason = await self._final_status(EOFError())
            return None
        return message

    async def download(self, request: pb.DownloadRequest) -> Blob:
        stub = self._transport._stub
        try:
            call = stub.Download(
                request, metadata=self._metadata, timeout=self._transport.download_timeout
            )
            return await assemble_blob(call, max_bytes=self._transport.max_blob_bytes)
        except grpc.aio.AioRpcError as exc:
            raise DownloadError(
                f"download of {pb.BlobKind.Name(request.kind)} of job {request.job_id!r} "
                f"refused: {_status(exc)}",
                status=exc.code().name,
            ) from None

    async def close(self) -> None:
        if not self._reason:
            self._reason = "closed by the agent"
        self._call.cancel()


# -- in-process ------------------------------------------------------------------------------------

#: The coordinator's ``Connect`` handler: (metadata, inbound agent messages) -> outbound messages
#: (an async generator, closed when the link ends).
ConnectHandler = Callable[
    [Metadata, AsyncIterator[pb.AgentMessage]], AsyncGenerator[pb.CoordinatorMessage, None]
]
#: Chunks as a ``Download`` handler returns them: a sync or async iterable, or an awaitable of
#: either.
DownloadChunks = (
    Iterable[pb.DownloadChunk]
    | AsyncIterable[pb.DownloadChunk]
    | Awaitable[Iterable[pb.DownloadChunk] | AsyncIterable[pb.DownloadChunk]]
)
#: The coordinator's ``Download`` handler: (metadata, request) -> chunks.
DownloadHandler = Callable[[Metadata, pb.DownloadRequest], DownloadChunks]


def _copy(message: M) -> M:
    return type(message).FromString(message.SerializeToString())


def _refused(exc: BaseException) -> bool:
    """An error the coordinator maps to UNAUTHENTICATED (its errors carry ``grpc_status``)."""
    return getattr(exc, "grpc_status", None) == "UNAUTHENTICATED"


class InProcessConnector:
    """Opens in-process task streams to a coordinator's transport-free handlers.

    Args:
        connect_handler: e.g. the coordinator's ``serve_stream`` bound to its store and registry:
            called with the metadata and an async iterator of this agent's messages (``Hello``
            first), it yields the coordinator's messages. An exception it raises before the first
            message is the stream's failure: one carrying ``grpc_status == "UNAUTHENTICATED"``
            becomes :class:`CredentialRejectedError`, anything else a broken link.
        download_handler: serves ``Download`` requests (same metadata).
        agent_id, credential: this agent's identity (carried as metadata, as over gRPC).
        max_blob_bytes: the largest download accepted.
    """

    def __init__(
        self,
        *,
        connect_handler: ConnectHandler,
        download_handler: DownloadHandler,
        agent_id: str,
        credential: str,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
    ) -> None:
        self._connect = connect_handler
        self._download = download_handler
        self._metadata = agent_metadata(agent_id, credential)
        self.max_blob_bytes = max_blob_bytes

    async def connect(self, hello: pb.Hello) -> InProcessLink:
        link = InProcessLink(self)
        await link.send(pb.AgentMessage(hello=hello))
        link.start(self._connect(self._metadata, link.inbound()))
        return link


class _End:
    """The end-of-stream marker in an :class:`InProcessLink` queue."""


_END = _End()


class InProcessLink:
    """One in-process task stream (see :class:`CoordinatorLink` and :class:`InProcessConnector`)."""

    def __init__(self, connector: InProcessConnector) -> None:
        self._connector = connector
        self._to_coordinator: asyncio.Queue[pb.AgentMessage | _End] = asyncio.Queue()
        self._to_agent: asyncio.Queue[pb.CoordinatorMessage | _End] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._reason = ""
        self._failure: BaseException | None = None

    @property
    def reason(self) -> str:
        return self._reason

    async def inbound(self) -> AsyncIterator[pb.AgentMessage]:
        """The agent's messages as the coordinator's handler reads them."""
        while True:
            item = await self._to_coordinator.get()
            if isinstance(item, _End):
                return
            yield item

    def start(self, outbound: AsyncGenerator[pb.CoordinatorMessage, None]) -> None:
        async def pump() -> None:
            try:
                async for message in outbound:
                    self._to_agent.put_nowait(_copy(message))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failure = exc
            finally:
                with contextlib.suppress(Exception):
                    await outbound.aclose()
                self._to_agent.put_nowait(_END)

        self._pump = asyncio.get_running_loop().create_task(pump(), name="dpfl-inproc-link")

    async def send(self, message: pb.AgentMessage) -> None:
        if self._reason:
            raise LinkClosedError(self._reason)
        self._to_coordinator.put_nowait(_copy(message))

    async def receive(self) -> pb.CoordinatorMessage | None:
        if self._reason and self._to_agent.empty():
            return None
        item = await self._to_agent.get()
        if isinstance(item, _End):
            self._to_agent.put_nowait(_END)  # later calls see the end too
            failure = self._failure
            if not self._reason:
                self._reason = (
                    f"the coordinator ended the stream ({type(failure).__name__}: {failure})"
                    if failure is not None
                    else "the coordinator ended the stream"
                )
            if failure is not None and _refused(failure):
                self._failure = None
                raise CredentialRejectedError(f"the coordinator refused the credential: {failure}")
            return None
        return item

    async def download(self, request: pb.DownloadRequest) -> Blob:
        connector = self._connector
        try:
            result = connector._download(connector._metadata, _copy(request))
            if isinstance(result, Awaitable):
                result = await result
            chunks = [_copy(c) async for c in _aiter(result)]
        except DownloadError:
            raise
        except Exception as exc:
            raise DownloadError(
                f"download of {pb.BlobKind.Name(request.kind)} of job {request.job_id!r} "
                f"refused: {type(exc).__name__}: {exc}",
                status=str(getattr(exc, "grpc_status", "INTERNAL")),
            ) from None
        return await assemble_blob(chunks, max_bytes=connector.max_blob_bytes)

    async def close(self) -> None:
        if not self._reason:
            self._reason = "closed by the agent"
        self._to_coordinator.put_nowait(_END)
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
