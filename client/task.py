"""The agent's task loop: invitations, local training and the four secure-aggregation stages.

:meth:`TaskLoop.serve` runs over one :class:`~dpfl.client.transport.CoordinatorLink` until the link
ends, following docs/architecture.md, "A round over the wire", on the agent's side:

1. **Invitation** (:func:`dpfl.client.checks.parse_invitation`) → the algorithm
   (``get_algorithm``), ``params_json`` (a JSON object),
   ``privacy_events_json`` (a JSON array of events in ``dpfl.accounting``'s form; one event object
   is read as an array of one) and ``Algorithm.agent_charge`` are parsed; anything malformed, or a
   refusal of the local :class:`~dpfl.client.gate.Gate` (policy, local budget), is answered with
   ``InvitationResponse(accept=False, reason)`` — whatever the coordinator believes about budgets.
   On acceptance the blobs the task may need start downloading (see *Downloads*).
2. **AdvertiseKeysRequest** (the setup) → :func:`dpfl.client.checks.check_setup`: the setup's mode
   must be the task's (``degree = threshold = 0`` marks a round without secure aggregation, taken
   only when the task says ``secure_aggregation: false``; no downgrade, no silent upgrade), the
   parameters are well formed (``RoundParameters.from_setup``: the ring cannot wrap; or
   :class:`~dpfl.client.plain.PlainParameters`), an encoding is present, and
   ``Algorithm.agent_check`` finds that the encoding's noise delivers the claimed events — all
   before anything is computed or sent. A refusal is an ``Error`` (``INVALID_ARGUMENT`` for a
   malformed setup, ``POLICY_DECLINED`` for another mode or noise that does not back the claim)
   and the agent leaves the round. Then the secagg client answers with fresh keys (a plain round:
   an acknowledgement without keys), and the algorithm's contribution starts in a worker thread
   on the agent's device (:mod:`dpfl.client.local_work`): by default ``Algorithm.agent_compute``
   followed by the encoding (clip, scale, conditional stochastic rounding, the agent's share of
   the integer noise — all of it without secure aggregation —, mod 2^r) with the round's
   ``EncodingConfig``.
3. **ShareKeysRequest** → the secagg client's shares (a plain round has no such stage).
4. **MaskedInputRequest** → waits for the encoded vector, masks it (a plain round: sends it as
   is), **commits the local charge** (``Gate.charge``) and only then sends it (in pieces). A
   refused charge sends an ``Error(BUDGET_EXCEEDED)`` instead, and nothing else.
5. **UnmaskRequest** → the requested shares (a plain round has no such stage); **RoundResult**
   ends the round.

Every message is checked against the job's current round: an older round or another session is
answered with ``Error(STALE_ROUND)``, a message of a job that never invited this agent with
``UNKNOWN_JOB``, a request answered already with ``DUPLICATE``, one out of order with
``WRONG_STAGE``, undecodable content with ``INVALID_ARGUMENT``; the round's state is unchanged by
all of them. A request whose content breaks the protocol (the secagg client aborts) is answered
with ``Error(PROTOCOL_ABORT)`` and the agent leaves the round. The coordinator's ``Error`` and
``RoundResult`` messages are never answered (no error loops).

One round at a time per job: an invitation for a later round (or a new attempt at the same
round number, which a restarted coordinator makes) abandons the current one; an exact repeat of
the accepted invitation is a duplicate. Jobs are independent: each has its own worker, so one
job's training never delays another job's messages. When the link ends, every round in flight
is dropped (the coordinator counts the agent as a dropout); the memory of which round each job
is at survives reconnections, so a replayed old message is still refused as stale.

**Downloads.** On acceptance the agent starts fetching the model and the job's public data
(:func:`dpfl.client.local_work.fetch_blobs`, which says what counts as "none").
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
from dpfl.client.transport import CoordinatorLink, LinkClosedError
from dpfl.learning.algorithms.base import AgentData, Algorithm, get_algorithm
from dpfl.protos import secagg_wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
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
                message=f"{pb.ErrorCode.Name(body.code)}: {body.message}",
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
        if self.broken:
            return False
        async with self._send_lock:
            try:
                await self.link.send(message)
            except LinkClosedError:
                self.broken = True
                return False
        return True

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

    async def error(self, header: pb.RoundHeader | None, code: int, text: str) -> None:
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
