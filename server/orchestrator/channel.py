"""The inbound side of one round: header checks, the inbox, dropouts, stage collection.

A :class:`RoundChannel` is the :class:`~dpfl.server.sessions.RoundRoute` the round engine registers
for its job while the round runs. Every inbound message is checked synchronously against the
round's (job, round, stage, session) and its participants before it is queued; a refused message
raises a :class:`~dpfl.server.agent_protocol.RoundMessageError` (the session answers with an
``Error``) and is never seen by the engine. A participant whose stream ends, or who reports an
``Error`` about the round, is *gone*: the stage being collected stops waiting for it at once.

What waits in the inbox is bounded per agent (``StreamLimits.inbox_*``): a message beyond the
bound is refused (:class:`~dpfl.server.agent_protocol.InboxFull`) until the engine has read the ones
before it. Messages of a stage are accepted while the engine is between stages (writing to the
store), so without the bound a participant could queue without limit there.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from collections.abc import Callable, Collection

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.agent_protocol import (
    MAX_ERROR_TEXT,
    InboxFull,
    MalformedMessage,
    StaleRound,
    check_round_header,
    enum_name,
)
from dpfl.server.settings import StreamLimits

__all__ = ["KIND_STAGE", "RoundChannel", "invitation_session_id"]

#: The stage each kind of agent message belongs to.
KIND_STAGE: dict[str, pb.Stage] = {
    "invitation_response": pb.STAGE_INVITATION,
    "advertise_keys": pb.STAGE_ADVERTISE_KEYS,
    "share_keys": pb.STAGE_SHARE_KEYS,
    "masked_input": pb.STAGE_MASKED_INPUT,
    "consistency": pb.STAGE_CONSISTENCY,
    "unmask": pb.STAGE_UNMASK,
}

Inbound = tuple[str, pb.AgentMessage | None]


def invitation_session_id(job_id: str, round_id: int) -> bytes:
    """The session id of one attempt's invitation stage: SHA-256 of the job and the attempt's
    round record. Agents echo it in their answers, so an answer to an earlier attempt of the
    same round is told apart (and refused as stale) instead of counting for the current one;
    the secure-aggregation setup replaces it with the protocol's own session id."""
    return hashlib.sha256(f"dpfl/invitation/{job_id}/{round_id}".encode()).digest()


_log = logging.getLogger("dpfl.coordinator")


class RoundChannel:
    """Routes the messages of one round of one job to the engine.

    Args:
        job_id: the job.
        number: the round number.
        participants: the agents that may send messages of this round (the invitees).
        limits: how much of one agent's messages may wait in the inbox.
    """

    def __init__(
        self,
        *,
        job_id: str,
        number: int,
        participants: Collection[str],
        limits: StreamLimits | None = None,
    ) -> None:
        self.job_id = job_id
        self.number = number
        self.participants = frozenset(participants)
        self.stage = pb.STAGE_INVITATION
        self.session_id = b""
        self.gone: set[str] = set()
        self.errors: dict[str, str] = {}
        self.inbox: asyncio.Queue[Inbound] = asyncio.Queue()
        self.limits = limits if limits is not None else StreamLimits()
        #: sizes of each agent's messages waiting in the inbox, oldest first, and their sum
        self._waiting: dict[str, deque[int]] = {}
        self._waiting_bytes: dict[str, int] = {}

    def open_stage(self, stage: pb.Stage, *, session_id: bytes | None = None) -> None:
        """From now on, only messages of ``stage`` are accepted (messages of the previous
        stage still queued are dropped by the engine's collector)."""
        self.stage = stage
        if session_id is not None:
            self.session_id = session_id

    def header(self, stage: pb.Stage) -> pb.RoundHeader:
        return pb.RoundHeader(
            job_id=self.job_id, round=self.number, stage=stage, session_id=self.session_id
        )

    # -- RoundRoute ------------------------------------------------------------------------------

    def deliver(self, agent_id: str, message: pb.AgentMessage, size: int = 0) -> None:
        kind = message.WhichOneof("body")
        if kind not in KIND_STAGE:
            raise MalformedMessage(f"{kind!r} is not a round message")
        header = getattr(message, kind).header
        if agent_id not in self.participants:
            raise StaleRound(
                f"agent {agent_id!r} takes no part in round {self.number} of job {self.job_id!r}"
            )
        if header.stage != KIND_STAGE[kind]:
            raise MalformedMessage(
                f"a {kind} message must carry stage {pb.Stage.Name(KIND_STAGE[kind])}"
            )
        check_round_header(
            header,
            job_id=self.job_id,
            round_number=self.number,
            stage=self.stage,
            session_id=self.session_id,
        )
        if agent_id in self.gone:
            raise StaleRound(f"agent {agent_id!r} already left round {self.number}")
        self._admit(agent_id, size)
        self.inbox.put_nowait((agent_id, message))

    def _admit(self, agent_id: str, size: int) -> None:
        """Count one more waiting message of ``agent_id``, or refuse it over the limits (one
        message is always admitted when none of the agent's waits)."""
        waiting = self._waiting.setdefault(agent_id, deque())
        queued = self._waiting_bytes.get(agent_id, 0)
        limits = self.limits
        if waiting and (
            len(waiting) >= limits.inbox_messages or queued + size > limits.inbox_bytes
        ):
            over = (
                f"stream_limits.inbox_messages = {limits.inbox_messages}"
                if len(waiting) >= limits.inbox_messages
                else f"stream_limits.inbox_bytes = {limits.inbox_bytes}"
            )
            raise InboxFull(
                f"{len(waiting)} messages ({queued} bytes) of agent {agent_id} wait for round "
                f"{self.number} of job {self.job_id!r} to read them; this one of {size} bytes "
                f"would exceed {over}, so it is refused"
            )
        waiting.append(size)
        self._waiting_bytes[agent_id] = queued + size

    def _taken(self, agent_id: str) -> None:
        """The engine took the agent's oldest waiting message from the inbox."""
        waiting = self._waiting.get(agent_id)
        if waiting:
            self._waiting_bytes[agent_id] -= waiting.popleft()

    def agent_error(self, agent_id: str, error: pb.Error) -> None:
        """A participant reports an ``Error`` about this round: it leaves it, and its reason is
        kept (cut to ``MAX_ERROR_TEXT``) and logged, whatever its code; a code this coordinator
        does not know is named by its number, never raised."""
        if agent_id in self.participants and error.header.round == self.number:
            code = enum_name(pb.ErrorCode.DESCRIPTOR, error.code)
            reason = f"{code}: {error.message[:MAX_ERROR_TEXT]}"
            if agent_id not in self.errors:
                self.errors[agent_id] = reason
                _log.info(
                    "agent %s left round %d of job %s: %s",
                    agent_id,
                    self.number,
                    self.job_id,
                    reason,
                )
            self._leave(agent_id)

    def disconnected(self, agent_id: str) -> None:
        if agent_id in self.participants:
            self._leave(agent_id)

    def _leave(self, agent_id: str) -> None:
        if agent_id not in self.gone:
            self.gone.add(agent_id)
            self.inbox.put_nowait((agent_id, None))

    # -- collection ------------------------------------------------------------------------------

    async def collect(
        self,
        *,
        deadline: float,
        pending: Callable[[], Collection[str]],
        handle: Callable[[str, pb.AgentMessage], None],
        flush: Callable[[], None] | None = None,
    ) -> None:
        """Feed queued messages of the open stage to ``handle`` until nobody who is still
        present is pending, or until ``deadline`` (event-loop time).

        With ``flush``, ``handle`` may defer its work: every message already queued is handled
        before ``flush()`` is called and ``pending`` is asked again, so a stage of n answers
        costs one ``pending`` per batch of arrivals instead of one per message.
        """
        loop = asyncio.get_running_loop()
        while set(pending()) - self.gone:
            timeout = deadline - loop.time()
            if timeout <= 0:
                return
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that races with a message, and a halted job would go on
                async with asyncio.timeout(timeout):
                    item = await self.inbox.get()
            except TimeoutError:
                return
            while True:
                self._feed(*item, handle)
                if flush is None or self.inbox.empty():
                    break
                item = self.inbox.get_nowait()
            if flush is not None:
                flush()

    def _feed(
        self,
        agent_id: str,
        message: pb.AgentMessage | None,
        handle: Callable[[str, pb.AgentMessage], None],
    ) -> None:
        if message is None:
            return
        self._taken(agent_id)
        kind = message.WhichOneof("body")
        if KIND_STAGE.get(kind) != self.stage or agent_id in self.gone:
            return  # queued before the stage closed
        handle(agent_id, message)
