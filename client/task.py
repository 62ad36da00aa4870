"""The agent's task loop: invitations, local training and the secure-aggregation stages.

:meth:`TaskLoop.serve` runs the agent's side of a round over one
:class:`~dpfl.client.transport.CoordinatorLink` until the link ends. Every check runs before
anything is computed or sent, the local charge is committed before the masked input leaves, and
every message that does not fit the job's current round is answered with a precise ``Error``
without changing the round's state. The sequence and the refusals, message by message:
docs/agent.md#the-task-loop-message-by-message and docs/agent.md#what-the-agent-refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfl.client.gate import Gate
from dpfl.client.progress import AgentEvent, EventKind, Observer, null_observer
from dpfl.client.rounds import JobWorker
from dpfl.client.summation import PeerCredentials
from dpfl.client.transport import CoordinatorLink, LinkClosedError
from dpfl.learning.algorithms.base import AgentData, Algorithm
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.protos import secagg_wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.enums import enum_name
from dpfl.secagg.randomness import RandomSource, SystemRandomSource

__all__ = ["LinkSummary", "TaskLoop"]


@dataclass(frozen=True, slots=True)
class LinkSummary:
    """How one link ended: messages received on it and the link's reason."""

    messages: int
    reason: str


class TaskLoop:
    """The agent's side of the task stream; see the module docstring.

    Args:
        agent_id: this agent's id (for ``Hello`` and log lines).
        data: the silo's private training data.
        gate: the local policy and ledger.
        device: where ``agent_compute`` runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``...).
        rng: the CSPRNG of keys, rounding and noise (default: the system CSPRNG; a seeded source
            makes simulations reproducible).
        observer: receives progress events.
        algorithms: resolves an algorithm tag (default ``get_algorithm``; tests inject others).
        executor: where training and encoding run (default: asyncio's default thread pool).
        piece_bytes: payload bytes per masked-input piece.
        peer: the agent's peer certificate, signing key and federation CA, used in every
            malicious-secure round (None: such rounds are refused,
            docs/agent.md#malicious-secure-rounds).
    """

    def __init__(
        self,
        *,
        agent_id: str,
        data: AgentData,
        gate: Gate,
        device: str = "cpu",
        rng: RandomSource | None = None,
        observer: Observer | None = None,
        algorithms: Callable[[str], Algorithm] = get_algorithm,
        executor: Executor | None = None,
        piece_bytes: int = secagg_wire.DEFAULT_PIECE_BYTES,
        peer: PeerCredentials | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.data = data
        self.gate = gate
        self.device = device
        self.rng = rng if rng is not None else SystemRandomSource()
        self.observer = observer if observer is not None else null_observer
        self.algorithms = algorithms
        self.executor = executor
        self.piece_bytes = piece_bytes
        self.peer = peer
        #: the latest round number each job invited this agent to (kept across links)
        self.last_round: dict[str, int] = {}
        #: each job's public data (None: the job has none), fetched once per job
        self.public_data: dict[str, npt.NDArray[np.float32] | None] = {}
        self._attempts = 0

    def attempt_rng(self, job_id: str) -> RandomSource:
        """The randomness of one accepted attempt: independent of every other attempt's even
        when the coordinator repeats a session id (whose labels would otherwise repeat under a
        seeded source); the system source stays the system source."""
        self._attempts += 1
        return self.rng.child(f"attempt/{job_id}/{self._attempts}")

    def hello(self, *, agent_version: str = "") -> pb.Hello:
        """The ``Hello`` this agent opens every stream with."""
        return pb.Hello(
            agent_id=self.agent_id,
            agent_version=agent_version,
            device="cuda" if self.device.startswith("cuda") else "cpu",
            algorithms=list(self.gate.allowed_algorithms()),
        )

    def emit(
        self, kind: EventKind, job_id: str = "", round: int = 0, message: str = "", **data: Any
    ) -> None:
        """Tell the observer (which must not raise; if it does, the event is dropped)."""
        with contextlib.suppress(Exception):
            self.observer(AgentEvent(kind, job_id, round, message, data))

    async def serve(
        self, link: CoordinatorLink, *, stop: asyncio.Event | None = None
    ) -> LinkSummary:
        """Handle the link's messages until it ends (or ``stop`` is set).

        Raises:
            CredentialRejectedError: the coordinator refused this agent's credential.
        """
        session = _LinkSession(self, link)
        try:
            await session.run(stop)
        finally:
            await session.shutdown()
        return LinkSummary(session.received, link.reason)


class _LinkSession:
    """The per-link part of the loop: routing to one worker per job, and the link's
    :class:`~dpfl.client.rounds.Outbox`."""

    def __init__(self, loop: TaskLoop, link: CoordinatorLink) -> None:
        self.loop = loop
        self.link = link
        self.received = 0
        self.workers: dict[str, JobWorker] = {}
        self.broken = False
        self._send_lock = asyncio.Lock()

    async def run(self, stop: asyncio.Event | None) -> None:
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            while True:
                receive = asyncio.ensure_future(self.link.receive())
                waiting: set[asyncio.Future[Any]] = {receive}
                if stopper is not None:
                    waiting.add(stopper)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if receive not in done:
                    receive.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await receive
                    return
                message = receive.result()  # CredentialRejectedError propagates
                if message is None or self.broken:
                    return
                self.received += 1
                await self.route(message)
        finally:
            if stopper is not None:
                stopper.cancel()

    async def route(self, message: pb.CoordinatorMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "ping":
            await self.send(pb.AgentMessage(pong=pb.Ping(sent_unix=message.ping.sent_unix)))
            return
        if kind is None:
            await self.error(None, pb.ERROR_INVALID_ARGUMENT, "a CoordinatorMessage without a body")
            return
        body = getattr(message, kind)
        if kind == "error" and not body.header.job_id:
            self.loop.emit(
                EventKind.COORDINATOR_ERROR,
                message=f"{enum_name(pb.ErrorCode.DESCRIPTOR, body.code)}: {body.message}",
            )
            return
        if not body.HasField("header") or not body.header.job_id:
            if kind == "result":
                return
            await self.error(
                body.header if body.HasField("header") else None,
                pb.ERROR_INVALID_ARGUMENT,
                f"{kind} without a RoundHeader naming its job",
            )
            return
        job_id = body.header.job_id
        worker = self.workers.get(job_id)
        if worker is None:
            worker = JobWorker(agent=self.loop, outbox=self, link=self.link, job_id=job_id)
            self.workers[job_id] = worker
        worker.put(message)

    async def send(self, message: pb.AgentMessage) -> bool:
        """Send; False (and the session marked broken) when the link has ended."""
        return await self.send_all((message,))

    async def send_all(self, messages: Sequence[pb.AgentMessage]) -> bool:
        """Send several messages back to back (the pieces of one masked input)."""
        if self.broken:
            return False
        async with self._send_lock:
            try:
                for message in messages:
                    await self.link.send(message)
            except LinkClosedError:
                self.broken = True
                return False
        return True

    async def error(self, header: pb.RoundHeader | None, code: pb.ErrorCode, text: str) -> None:
        error = pb.Error(code=code, message=text)
        if header is not None:
            error.header.CopyFrom(header)
        self.loop.emit(
            EventKind.ERROR_SENT,
            header.job_id if header is not None else "",
            header.round if header is not None else 0,
            f"{pb.ErrorCode.Name(code)}: {text}",
            code=code,
        )
        await self.send(pb.AgentMessage(error=error))

    async def shutdown(self) -> None:
        workers = list(self.workers.values())
        for worker in workers:
            worker.stop()
        await asyncio.gather(*(w.finished() for w in workers), return_exceptions=True)
