"""Agent sessions: one ``Connect`` stream per agent, outbound queues, inbound routing.

A :class:`Session` is the coordinator's end of one agent's stream; the :class:`SessionRegistry`
routes each inbound round message to its job's :class:`RoundRoute`, which accepts it or raises a
:class:`~dpfl.server.agent_protocol.RoundMessageError` (a refused message changes nothing). The
newest stream of an agent wins, an evicted agent is shut out at once, downloads on a live stream's
credential are trusted without a store read, and a closed stream is reported to every round
(docs/architecture.md#wire-details-both-sides-rely-on). :func:`serve_stream` is the whole
transport-free ``Connect`` exchange.

What a stream can make the coordinator hold is bounded (``Settings.stream_limits``,
docs/deploy.md#stream-limits): the messages waiting to be sent to an agent (past the limit the
agent, which evidently does not read, is disconnected with ``RESOURCE_EXHAUSTED``), the
messages of an agent waiting for a round (``dpfl.server.orchestrator.channel``), and every
``Error`` (:func:`dpfl.server.agent_protocol.error_reply`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from google.protobuf.message import Message

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server import agent_protocol
from dpfl.server.agent_protocol import MalformedMessage, RoundMessageError, UnknownJob
from dpfl.server.errors import InvalidCredential, ServerError
from dpfl.server.settings import StreamLimits
from dpfl.server.store import Agent, Store

__all__ = [
    "HELLO_TIMEOUT_S",
    "REFUSAL_GRACE_S",
    "Received",
    "RoundRoute",
    "Session",
    "SessionRegistry",
    "StreamOverflow",
    "serve_stream",
]

#: Seconds an agent has to send its ``Hello`` after opening the stream.
HELLO_TIMEOUT_S = 30.0
#: Seconds a refused stream waits for the agent's opening message before its status is sent.
REFUSAL_GRACE_S = 2.0
_ROUND_KINDS = (
    "invitation_response",
    "advertise_keys",
    "share_keys",
    "masked_input",
    "consistency",
    "unmask",
)

_log = logging.getLogger("dpfl.coordinator")


class RoundRoute(Protocol):
    """What the round engine registers for a job while a round runs."""

    job_id: str
    #: the round's invitees
    participants: frozenset[str]

    def deliver(self, agent_id: str, message: pb.AgentMessage, size: int) -> None:
        """Accept one message of the round (``size`` bytes on the wire), or raise a
        ``RoundMessageError``."""
        ...

    def agent_error(self, agent_id: str, error: pb.Error) -> None:
        """The agent reported an ``Error`` about this job (it leaves the round)."""
        ...

    def disconnected(self, agent_id: str) -> None:
        """The agent's stream ended."""
        ...


class StreamOverflow(ServerError):  # noqa: N818 (names read as outcomes)
    """More is waiting to be sent to an agent than ``stream_limits.outbound_*`` allow: the
    agent does not read its stream, so it is disconnected (``RESOURCE_EXHAUSTED``) and what
    was waiting is dropped, rather than held until the agent reads or cancels."""

    grpc_status = "RESOURCE_EXHAUSTED"
    http_status = 429
    code = "stream_overflow"


@dataclass(frozen=True, slots=True)
class Received:
    """An inbound message with its size on the wire, as a transport decoded it (so that
    bounding what waits for a round costs no second serialization)."""

    message: pb.AgentMessage
    size: int


#: What a transport hands :func:`serve_stream`: a message (its size then computed), a message
#: with its size, or the refusal of bytes that could not be decoded.
Inbound = pb.AgentMessage | Received | RoundMessageError


@dataclass(eq=False)
class Session:
    """The coordinator's end of one agent's ``Connect`` stream.

    ``outbound`` holds at most ``limits.outbound_messages`` messages of at most
    ``limits.outbound_bytes`` together (one message of any size when it is empty); a message
    beyond that closes the session as overflowing (:class:`StreamOverflow`), drops what was
    waiting, and calls ``on_overflow`` so that the transport can end a call whose write the
    agent never reads.
    """

    agent_id: str
    hello: pb.Hello
    outbound: asyncio.Queue[pb.CoordinatorMessage | None] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    #: serial number of the verified client certificate (mutual TLS), for the revocation list
    certificate_serial: int | None = None
    #: the agent record and SHA-256 of the credential the stream was authenticated with
    agent: Agent | None = None
    credential_digest: bytes = b""
    limits: StreamLimits = field(default_factory=StreamLimits)
    #: bytes of the messages in ``outbound``
    queued_bytes: int = 0
    #: why the session overflowed, once it did
    failure: StreamOverflow | None = None
    #: called once, with the failure, when the session overflows (after it was closed)
    on_overflow: Callable[[StreamOverflow], None] | None = None
    #: closes the session where it is registered (set by :meth:`SessionRegistry.open`)
    closer: Callable[[Session, str], None] | None = None
    _sizes: deque[int] = field(default_factory=deque)

    LIMIT_NAMES: ClassVar[tuple[str, str]] = (
        "stream_limits.outbound_messages",
        "stream_limits.outbound_bytes",
    )

    def send(self, message: pb.CoordinatorMessage) -> bool:
        """Queue a message; False when the session is closed (the agent will not get it), or
        overflows with this message (and is closed)."""
        if self.closed.is_set():
            return False
        size = message.ByteSize()
        waiting = self.outbound.qsize()
        if waiting and (
            waiting >= self.limits.outbound_messages
            or self.queued_bytes + size > self.limits.outbound_bytes
        ):
            self._overflow(waiting, size)
            return False
        self.queued_bytes += size
        self._sizes.append(size)
        self.outbound.put_nowait(message)
        return True

    def _overflow(self, waiting: int, size: int) -> None:
        limits = self.limits
        which = 0 if waiting >= limits.outbound_messages else 1
        limit = (limits.outbound_messages, limits.outbound_bytes)[which]
        self.failure = StreamOverflow(
            f"the agent does not read its stream: {waiting} messages ({self.queued_bytes} "
            f"bytes) wait to be sent, and one more of {size} bytes would exceed "
            f"{self.LIMIT_NAMES[which]} = {limit}; the coordinator closed the stream"
        )
        _log.warning("agent %s disconnected: %s", self.agent_id, self.failure)
        while not self.outbound.empty():  # free what waits now, not when the agent reads
            self.outbound.get_nowait()
        self._sizes.clear()
        self.queued_bytes = 0
        reason = str(self.failure)
        if self.closer is not None:
            self.closer(self, reason)
        self._close(reason)
        if self.on_overflow is not None:
            self.on_overflow(self.failure)

    def _close(self, reason: str) -> None:
        if not self.closed.is_set():
            self.reason = reason
            self.closed.set()
            self.outbound.put_nowait(None)

    async def messages(self) -> AsyncIterator[pb.CoordinatorMessage]:
        """The outbound messages, until the session closes.

        Raises:
            StreamOverflow: the session closed because the agent did not read.
        """
        while True:
            item = await self.outbound.get()
            if item is None:
                if self.failure is not None:
                    raise self.failure
                return
            if self._sizes:
                self.queued_bytes -= self._sizes.popleft()
            yield item


class SessionRegistry:
    """The connected agents' sessions and the round routes of running jobs.

    Args:
        on_count: called with the number of connected agents whenever it changes (metrics).
        limits: what one stream may hold (default: the settings' defaults).
    """

    def __init__(
        self,
        *,
        on_count: Callable[[int], None] | None = None,
        limits: StreamLimits | None = None,
    ) -> None:
        self.limits = limits if limits is not None else StreamLimits()
        self._sessions: dict[str, Session] = {}
        self._routes: dict[str, RoundRoute] = {}
        #: agents shut out by an administrator (agent id → why), until readmitted
        self._evicted: dict[str, str] = {}
        self._on_count = on_count
        self._changed = asyncio.Condition()

    # -- sessions --------------------------------------------------------------------------------

    def open(self, agent_id: str, hello: pb.Hello) -> Session:
        """Register a new stream for ``agent_id``, closing (replacing) an older one.

        Raises:
            InvalidCredential: the agent was shut out (its authentication raced the eviction).
        """
        if agent_id in self._evicted:
            raise InvalidCredential("unknown agent or invalid credential")
        old = self._sessions.get(agent_id)
        if old is not None:
            old.send(
                pb.CoordinatorMessage(
                    error=pb.Error(
                        code=pb.ERROR_DUPLICATE,
                        message="this stream was replaced by a newer Connect of the same agent",
                    )
                )
            )
            self.close(old, "replaced by a newer stream")
        session = Session(agent_id=agent_id, hello=hello, limits=self.limits, closer=self.close)
        self._sessions[agent_id] = session
        self._count_changed()
        return session

    def close(self, session: Session, reason: str) -> None:
        """End a session; when it is the agent's current one, every route sees a disconnect."""
        session._close(reason)
        if self._sessions.get(session.agent_id) is session:
            del self._sessions[session.agent_id]
            for route in list(self._routes.values()):
                route.disconnected(session.agent_id)
            self._count_changed()

    def evict(self, agent_id: str, reason: str) -> bool:
        """Shut an agent out now (it was disabled or revoked, or its certificate revoked): its
        stream is closed after an ``Error`` saying why, every running round counts it as gone
        at once, and any message still arriving on the old stream is refused (the session is
        no longer current). Returns whether it was connected."""
        self._evicted[agent_id] = reason
        for route in list(self._routes.values()):
            route.disconnected(agent_id)
        session = self._sessions.get(agent_id)
        if session is None:
            return False
        session.send(
            pb.CoordinatorMessage(
                error=pb.Error(code=pb.ERROR_UNAUTHENTICATED, message=f"shut out: {reason}")
            )
        )
        self.close(session, reason)
        return True

    def readmit(self, agent_id: str) -> None:
        """An evicted agent was enabled again: it may open a stream (authentication decides)."""
        self._evicted.pop(agent_id, None)

    def evicted_ids(self) -> set[str]:
        """The agents shut out now."""
        return set(self._evicted)

    def evicted(self, agent_id: str) -> str | None:
        """Why the agent was shut out, or None."""
        return self._evicted.get(agent_id)

    def close_all(self, reason: str) -> None:
        for session in list(self._sessions.values()):
            self.close(session, reason)

    def get(self, agent_id: str) -> Session | None:
        return self._sessions.get(agent_id)

    def in_round(self, agent_id: str, job_id: str) -> bool:
        """Whether a round of ``job_id`` is running with ``agent_id`` among its invitees (who
        were members when invited, and take part in the round whatever happens to the
        population meanwhile)."""
        route = self._routes.get(job_id)
        return route is not None and agent_id in route.participants

    def verified_agent(self, metadata: agent_protocol.Metadata | None) -> Agent | None:
        """The agent whose current, open stream was authenticated with the credential in
        ``metadata``; None otherwise (no stream, another credential, malformed metadata).

        Lets a download that rides along an agent's live stream skip the credential's read
        transaction. It is exactly as fresh as the stream: disabling, revoking or evicting the
        agent closes the stream (:meth:`evict`), after which this answers None at once and the
        caller authenticates against the store, which refuses.
        """
        try:
            agent_id, credential = agent_protocol.credentials(metadata)
        except InvalidCredential:
            return None
        session = self._sessions.get(agent_id)
        if session is None or session.agent is None or session.closed.is_set():
            return None
        if agent_id in self._evicted:
            return None
        digest = hashlib.sha256(credential.encode()).digest()
        if not hmac.compare_digest(digest, session.credential_digest):
            return None
        return session.agent

    def connected(self) -> set[str]:
        """Ids of the agents with an open stream."""
        return set(self._sessions)

    def send(self, agent_id: str, message: pb.CoordinatorMessage) -> bool:
        """Queue a message for an agent; False when it is not connected."""
        session = self._sessions.get(agent_id)
        return session.send(message) if session is not None else False

    async def wait_connected(self, agent_ids: Iterable[str], *, timeout: float) -> bool:
        """Wait until every agent in ``agent_ids`` is connected; False at the timeout."""
        wanted = set(agent_ids)

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: wanted <= set(self._sessions))

        try:
            async with asyncio.timeout(timeout):
                await wait()
        except TimeoutError:
            return False
        return True

    def _count_changed(self) -> None:
        if self._on_count is not None:
            self._on_count(len(self._sessions))

        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        with contextlib.suppress(RuntimeError):  # no running loop (closing at shutdown)
            asyncio.get_running_loop().create_task(notify())

    # -- routes ----------------------------------------------------------------------------------

    def add_route(self, route: RoundRoute) -> None:
        self._routes[route.job_id] = route

    def remove_route(self, route: RoundRoute) -> None:
        if self._routes.get(route.job_id) is route:
            del self._routes[route.job_id]

    def dispatch(
        self, session: Session, message: pb.AgentMessage, size: int | None = None
    ) -> pb.CoordinatorMessage | None:
        """Route one inbound message (``size`` bytes on the wire; None: measure it); returns
        the ``Error`` to send back, if any.

        Nothing an agent sends ends its stream here: a message with an enum value this
        coordinator does not know is refused naming the field and value (logged as a warning
        with the agent's id), and an unexpected error of a route is logged with its traceback
        and answered with ``ERROR_INTERNAL``.
        """
        kind = message.WhichOneof("body")
        header = None
        try:
            if kind is None:
                raise MalformedMessage("an AgentMessage without a body")
            if kind == "pong":
                return None
            if kind == "hello":
                raise agent_protocol.DuplicateMessage("Hello is sent once, first on the stream")
            shut_out = self._evicted.get(session.agent_id)
            if shut_out is not None:
                raise agent_protocol.StaleRound(f"this agent was shut out: {shut_out}")
            if kind == "error":
                return self._agent_error(session, message.error)
            if kind not in _ROUND_KINDS:  # pragma: no cover - the oneof has no other member
                raise MalformedMessage(f"unexpected message {kind!r}")
            body = getattr(message, kind)
            if not body.HasField("header"):
                raise MalformedMessage(f"{kind} without a RoundHeader")
            header = body.header
            _check_enums(session, message)
            if self._sessions.get(session.agent_id) is not session:
                raise agent_protocol.StaleRound("this stream was replaced by a newer one")
            route = self._routes.get(header.job_id)
            if route is None:
                raise UnknownJob(
                    f"job {agent_protocol.shown(header.job_id)} is not running a round"
                )
            route.deliver(session.agent_id, message, message.ByteSize() if size is None else size)
        except RoundMessageError as exc:
            return agent_protocol.error_message(exc, header=header)
        except Exception as exc:
            _log.exception("agent %s: routing its %s message failed", session.agent_id, kind)
            return agent_protocol.error_message(exc, header=header)
        return None

    def _agent_error(self, session: Session, error: pb.Error) -> pb.CoordinatorMessage | None:
        """The agent reports an ``Error`` about a job: the job's round (if one runs) counts it
        as gone, even when the error carries a code or stage this coordinator does not know;
        such a value is answered with an ``Error`` naming it."""
        unknown: agent_protocol.UnknownEnumValue | None = None
        try:
            _check_enums(session, error, "error")
        except agent_protocol.UnknownEnumValue as exc:
            unknown = exc
        route = self._routes.get(error.header.job_id)
        if route is not None:
            route.agent_error(session.agent_id, error)
        if unknown is None:
            return None
        return agent_protocol.error_message(unknown, header=error.header)


def _check_enums(session: Session, message: Message, path: str = "") -> None:
    """:func:`dpfl.server.agent_protocol.check_enums`, logging a refusal as a warning with the
    agent's id (an agent sending values this coordinator does not know runs another protocol
    version, which the operator should hear of).

    Raises:
        UnknownEnumValue: as ``check_enums``.
    """
    try:
        agent_protocol.check_enums(message, path)
    except agent_protocol.UnknownEnumValue as exc:
        _log.warning("agent %s: refused a message: %s", session.agent_id, exc)
        raise


async def _await_opening(inbound: AsyncIterator[Inbound], timeout: float) -> None:
    """Let the stream's opening message (the agent's ``Hello``) arrive before a refusal is
    answered, for at most ``timeout`` seconds.

    A ``grpc.aio`` client whose write is still in flight when the call's status arrives reports
    ``INTERNAL`` ("Internal error from Core", ``Failed "execute_batch"``) in place of the status
    the coordinator sent (grpc/grpc#36066): an agent that writes its ``Hello`` and then reads
    would, under load, take a refused credential for a broken transport and retry. Once the
    ``Hello`` has arrived here, the agent's write has completed and the refusal reaches it.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            await anext(inbound)


async def _opening_hello(
    inbound: AsyncIterator[Inbound], timeout: float, agent_id: str
) -> pb.Hello:
    """The stream's opening ``Hello``, which names no other agent (errors: :func:`serve_stream`)."""
    try:
        async with asyncio.timeout(timeout):
            first = await anext(inbound)
    except StopAsyncIteration:
        raise MalformedMessage("the stream closed before its Hello") from None
    except TimeoutError:
        raise MalformedMessage(f"no Hello within {timeout:g} s") from None
    if isinstance(first, RoundMessageError):
        raise first
    if isinstance(first, Received):
        first = first.message
    if first.WhichOneof("body") != "hello":
        raise MalformedMessage("the first message of a Connect stream must be a Hello")
    if first.hello.agent_id and first.hello.agent_id != agent_id:
        raise InvalidCredential("the Hello names another agent than the credential")
    return first.hello


async def _route_inbound(
    registry: SessionRegistry, session: Session, inbound: AsyncIterator[Inbound]
) -> None:
    """Dispatch the agent's messages to the registry until its stream ends, then close it."""
    try:
        async for item in inbound:
            if isinstance(item, RoundMessageError):
                session.send(agent_protocol.error_message(item))
                continue
            if isinstance(item, Received):
                reply = registry.dispatch(session, item.message, item.size)
            else:
                reply = registry.dispatch(session, item)
            if reply is not None:
                session.send(reply)
    except Exception as exc:  # a broken transport ends the stream like a close
        if not session.closed.is_set():  # else the coordinator ended it, and said why
            _log.info("agent %s: stream broken (%s: %s)", session.agent_id, type(exc).__name__, exc)
    finally:
        registry.close(session, "the agent's stream ended")


async def serve_stream(
    *,
    store: Store,
    registry: SessionRegistry,
    metadata: agent_protocol.Metadata | None,
    inbound: AsyncIterator[Inbound],
    hello_timeout: float = HELLO_TIMEOUT_S,
    certificate_cn: str | None = None,
    certificate_serial: int | None = None,
    on_overflow: Callable[[StreamOverflow], None] | None = None,
) -> AsyncGenerator[pb.CoordinatorMessage, None]:
    """One agent's whole ``Connect`` stream: authenticate, expect ``Hello``, then route.

    ``inbound`` may yield a :class:`RoundMessageError` in place of a message that could not be
    decoded; it is answered with an ``Error`` like any other refused message. A message may come
    as :class:`Received` with its size on the wire (otherwise it is measured).
    ``on_overflow`` is called when the agent stops reading and its session overflows
    (:class:`Session`): the generator then raises :class:`StreamOverflow` once the transport
    takes its next message, which never happens while the agent's write is stuck, so a
    transport whose writes can block must end the call from there.
    ``certificate_cn`` is the verified client certificate's common name under mutual TLS
    (checked against the agent's binding, :func:`dpfl.server.agent_protocol.authenticate`), and
    ``certificate_serial`` its serial number (kept on the session for the revocation list).

    Errors before the first yielded message (authentication, a missing or foreign ``Hello``)
    are raised as typed errors for the adapter to turn into a status; a refused credential is
    raised once the opening message has arrived (:func:`_await_opening`), within
    :data:`REFUSAL_GRACE_S`.

    Raises:
        InvalidCredential: bad metadata, or a ``Hello`` naming another agent.
        MalformedMessage: the first message is not a ``Hello``, or none came in time.
        StreamOverflow: the agent did not read its stream.
    """
    try:
        agent: Agent = await asyncio.to_thread(
            lambda: agent_protocol.authenticate(store, metadata, certificate_cn=certificate_cn)
        )
    except Exception:
        await _await_opening(inbound, min(hello_timeout, REFUSAL_GRACE_S))
        raise
    session = registry.open(agent.id, await _opening_hello(inbound, hello_timeout, agent.id))
    session.certificate_serial = certificate_serial
    session.agent = agent
    session.credential_digest = hashlib.sha256(
        agent_protocol.credentials(metadata)[1].encode()
    ).digest()
    session.on_overflow = on_overflow
    reader = asyncio.create_task(
        _route_inbound(registry, session, inbound), name=f"dpfl-read-{agent.id}"
    )
    try:
        async for message in session.messages():
            yield message
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        registry.close(session, "the coordinator ended the stream")
