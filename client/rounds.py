"""One job's rounds on the agent: the worker behind :class:`dpfl.client.task.TaskLoop`.

A :class:`JobWorker` handles the messages of one job, one at a time, in arrival order, and holds
at most one round attempt (:class:`RoundAttempt`). Its rules are those of the
:mod:`dpfl.client.task` docstring; this module is where they are implemented.

The worker sees the task loop through two narrow seams, so that this module does not import
:mod:`dpfl.client.task`: :class:`AgentSide` (what the agent knows across links: data, gate,
device, the round each job is at) and :class:`Outbox` (the link's serialised sender).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import secrets
import struct
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from dpfl.client.checks import (
    TASK_ERRORS,
    InvitationDeclined,
    SetupRefused,
    check_setup,
    parse_invitation,
)
from dpfl.client.gate import ChargeRefusedError, Decision, Gate, InvitationReview
from dpfl.client.local_work import Fetched, contribution, fetch_blobs
from dpfl.client.progress import EventKind
from dpfl.client.summation import (
    PeerCredentials,
    PlainParameters,
    SecureParameters,
    SecureSummation,
    Summation,
    start_summation,
)
from dpfl.client.transport import CoordinatorLink
from dpfl.learning.algorithms.base import AgentData, Algorithm, AnyAgent
from dpfl.protos import secagg_wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.enums import enum_name
from dpfl.secagg import ClientIdentity, IdentityError
from dpfl.secagg import messages as sm
from dpfl.secagg.errors import (
    DuplicateMessage,
    ParameterError,
    ProtocolAborted,
    StaleMessage,
    WrongStage,
)
from dpfl.secagg.randomness import RandomSource, SystemRandomSource

__all__ = ["AgentSide", "JobWorker", "Outbox", "RoundAttempt"]

_SECAGG_KINDS = ("advertise_keys", "share_keys", "masked_input", "consistency", "unmask")


class AgentSide(Protocol):
    """What a job worker needs of the agent (:class:`dpfl.client.task.TaskLoop`)."""

    @property
    def data(self) -> AgentData: ...
    @property
    def gate(self) -> Gate: ...
    @property
    def device(self) -> str: ...
    @property
    def executor(self) -> Executor | None: ...
    @property
    def piece_bytes(self) -> int: ...
    @property
    def algorithms(self) -> Callable[[str], Algorithm]: ...
    @property
    def peer(self) -> PeerCredentials | None:
        """The agent's peer certificate and federation CA (None: it takes no malicious-secure
        round)."""

    @property
    def last_round(self) -> MutableMapping[str, int]:
        """The latest round each job invited this agent to (kept across links)."""

    @property
    def public_data(self) -> MutableMapping[str, npt.NDArray[np.float32] | None]:
        """Each job's public data (None: the job has none), fetched once per job."""

    def attempt_rng(self, job_id: str) -> RandomSource: ...

    def emit(
        self, kind: EventKind, job_id: str = "", round: int = 0, message: str = "", **data: Any
    ) -> None: ...


class Outbox(Protocol):
    """The sending side of one link, shared by its job workers (sends never interleave)."""

    async def send(self, message: pb.AgentMessage) -> bool:
        """Send; False once the link has ended."""
        ...

    async def send_all(self, messages: Sequence[pb.AgentMessage]) -> bool:
        """Send several messages back to back (the pieces of one masked input)."""
        ...

    async def error(self, header: pb.RoundHeader | None, code: pb.ErrorCode, text: str) -> None:
        """Send an ``Error`` (with ``header`` when it concerns a round) and report it."""
        ...


class _Refusal(Exception):  # noqa: N818 (control flow, never escapes this module)
    """Answer the current message with an ``Error``; ``leave`` also drops the round."""

    def __init__(self, code: pb.ErrorCode, message: str, *, leave: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.leave = leave


def _computation_failed(error: BaseException) -> _Refusal:
    """The answer to a failed training or encoding: the task's fault, or the agent's."""
    code = pb.ERROR_INVALID_ARGUMENT if isinstance(error, TASK_ERRORS) else pb.ERROR_INTERNAL
    text = f"local computation failed: {type(error).__name__}: {error}"
    return _Refusal(code, text, leave=True)


@dataclass(frozen=True, slots=True)
class _ComputeFailed:
    attempt: RoundAttempt
    error: BaseException


def _attempt_id() -> str:
    """A fresh attempt id from the OS CSPRNG (never the task loop's RNG, which a simulation
    seeds: a restarted agent must not draw the same ids again)."""
    return secrets.token_hex(16)


def _digest(messages: list[pb.AgentMessage]) -> bytes:
    """SHA-256 of the exact messages that carry a contribution (length-prefixed, in order)."""
    h = hashlib.sha256()
    for message in messages:
        data = message.SerializeToString(deterministic=True)
        h.update(struct.pack(">Q", len(data)))
        h.update(data)
    return h.digest()


@dataclass(eq=False)
class RoundAttempt:
    """One accepted attempt at one round of one job.

    ``attempt_id`` is drawn by the agent when it accepts the invitation and is the key of the
    attempt's local charge: the coordinator's session id (built from a nonce the coordinator
    chooses) never is, so a coordinator that repeats a nonce cannot make two contributions share
    one ledger row.
    """

    review: InvitationReview
    side: AnyAgent  # the algorithm's agent side for the task
    invitation: bytes  # serialized: an exact repeat is a duplicate, anything else a new attempt
    model_version: int
    prefetch: asyncio.Task[Fetched]
    summation: Summation | None = None  # chosen by the setup: masked or plain
    session_id: bytes = b""
    compute: asyncio.Task[npt.NDArray[np.uint64]] | None = None
    charged: bool = False
    #: the review as invited and its own share's fraction, kept to re-verify the charge
    invited: InvitationReview | None = None
    own_fraction: float = 1.0
    started: float = field(default_factory=time.monotonic)
    attempt_id: str = field(default_factory=_attempt_id)
    rng: RandomSource = field(default_factory=SystemRandomSource)  # this attempt's own

    @property
    def number(self) -> int:
        return self.review.round

    @property
    def header(self) -> pb.RoundHeader:
        """The header of the summation's stage (``ADVERTISE_KEYS`` before the setup)."""
        stage = sm.Stage.ADVERTISE_KEYS if self.summation is None else self.summation.stage
        return pb.RoundHeader(
            job_id=self.review.job_id,
            round=self.number,
            stage=secagg_wire.stage_to_pb(stage),
            session_id=self.session_id,
        )

    def cancel(self) -> None:
        for task in (self.prefetch, self.compute):
            if task is not None and not task.done():
                task.cancel()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as seen (it is re-raised where it is awaited)."""
    if not task.cancelled():
        task.exception()


class JobWorker:
    """Handles one job's messages on one link; see the module docstring.

    Args:
        agent: the agent's data, gate and memory of rounds.
        outbox: where answers go.
        link: the link, for downloads.
        job_id: the job whose messages this worker gets.
    """

    def __init__(
        self, *, agent: AgentSide, outbox: Outbox, link: CoordinatorLink, job_id: str
    ) -> None:
        self.agent = agent
        self.outbox = outbox
        self.link = link
        self.job_id = job_id
        self.current: RoundAttempt | None = None
        self._last_invitation = b""
        self._queue: asyncio.Queue[pb.CoordinatorMessage | _ComputeFailed] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dpfl-job-{job_id}")

    def put(self, message: pb.CoordinatorMessage) -> None:
        self._queue.put_nowait(message)

    def stop(self) -> None:
        """The link ended: drop the round in flight (the coordinator sees a dropout)."""
        if self.current is not None:
            self._leave("the link to the coordinator ended")
        self._task.cancel()

    async def finished(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, _ComputeFailed):
                await self._compute_failed(item)
                continue
            kind = item.WhichOneof("body")
            header = getattr(item, kind).header if kind else None
            try:
                await self._handle(kind, item)
            except _Refusal as refusal:
                await self.outbox.error(header, refusal.code, str(refusal))
                if refusal.leave and self.current is not None:
                    self._leave(str(refusal))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug: report it, leave the round, keep serving
                await self.outbox.error(
                    header, pb.ERROR_INTERNAL, f"internal error of the agent ({type(exc).__name__})"
                )
                if self.current is not None:
                    self._leave(f"internal error: {type(exc).__name__}: {exc}")

    async def _handle(self, kind: str | None, message: pb.CoordinatorMessage) -> None:
        if kind == "invitation":
            await self._invitation(message.invitation)
        elif kind in _SECAGG_KINDS:
            await self._secagg(message)
        elif kind == "result":
            self._result(message.result)
        elif kind == "error":
            await self._coordinator_error(message.error)
        else:  # pragma: no cover - the session routes only the kinds above here
            raise _Refusal(pb.ERROR_INVALID_ARGUMENT, f"unexpected message {kind!r}")

    def _leave(self, reason: str) -> None:
        current = self.current
        if current is None:
            return
        current.cancel()
        self.current = None
        self.agent.emit(
            EventKind.LEFT_ROUND, self.job_id, current.number, reason, charged=current.charged
        )

    # -- invitation --------------------------------------------------------------------------

    async def _invitation(self, invitation: pb.Invitation) -> None:
        header = invitation.header
        if header.stage != pb.STAGE_INVITATION:
            raise _Refusal(
                pb.ERROR_WRONG_STAGE, f"an invitation carries stage {_stage(header.stage)}"
            )
        raw = invitation.SerializeToString(deterministic=True)
        self._last_round(header.round)
        if raw == self._last_invitation:
            raise _Refusal(pb.ERROR_DUPLICATE, f"round {header.round} was already answered")
        if self.current is not None:
            self._leave(f"superseded by an invitation to round {header.round}")
        self.agent.last_round[self.job_id] = header.round
        self._last_invitation = raw
        self.agent.emit(EventKind.INVITED, self.job_id, header.round, invitation.algorithm or "?")
        review: InvitationReview | None = None
        try:
            review, side = parse_invitation(
                invitation, job_id=self.job_id, algorithms=self.agent.algorithms
            )
            decision = await self._ask_gate(review)
        except InvitationDeclined as exc:
            decision = Decision.declined(str(exc))
        answer = pb.InvitationResponse(
            header=header, accept=decision.accept, reason=decision.reason
        )
        if not await self.outbox.send(pb.AgentMessage(invitation_response=answer)):
            return
        if not decision.accept or review is None:
            self.agent.emit(EventKind.DECLINED, self.job_id, header.round, decision.reason)
            return
        prefetch = asyncio.get_running_loop().create_task(
            fetch_blobs(
                self.link,
                job_id=self.job_id,
                model_version=invitation.model_version,
                input_shape=tuple(self.agent.data.input_shape),
                public_cache=self.agent.public_data,
            ),
            name=f"dpfl-fetch-{self.job_id}",
        )
        prefetch.add_done_callback(_retrieve)
        self.current = RoundAttempt(
            review=review,
            side=side,
            invitation=raw,
            model_version=invitation.model_version,
            prefetch=prefetch,
            rng=self.agent.attempt_rng(self.job_id),
            # the attempt's invitation session (empty from older coordinators): what refers to
            # an earlier attempt of this round no longer reaches this one
            session_id=header.session_id,
        )
        self.agent.emit(EventKind.ACCEPTED, self.job_id, header.round, review.algorithm)

    async def _ask_gate(self, review: InvitationReview) -> Decision:
        try:
            return await asyncio.to_thread(self.agent.gate.review, review)
        except Exception as exc:  # the gate must decline, never let an invitation through
            return Decision.declined(f"the local policy check failed: {type(exc).__name__}: {exc}")

    # -- local computation --------------------------------------------------------------------

    async def _compute(self, attempt: RoundAttempt) -> npt.NDArray[np.uint64]:
        assert attempt.summation is not None  # set before the task starts
        params = attempt.summation.params
        fetched = await attempt.prefetch
        self.agent.emit(EventKind.TRAINING, self.job_id, attempt.number, f"on {self.agent.device}")
        started = time.monotonic()
        label = f"encode/{self.job_id}/{attempt.number}/{attempt.session_id.hex()}"
        encoded = await asyncio.get_running_loop().run_in_executor(
            self.agent.executor,
            functools.partial(
                contribution,
                attempt.side,
                self.agent.data,
                fetched=fetched,
                device=self.agent.device,
                encoding=params.encoding,
                stream=attempt.rng.stream(label),
                vector_length=params.vector_length,
            ),
        )
        seconds = time.monotonic() - started
        self.agent.emit(
            EventKind.TRAINED, self.job_id, attempt.number, f"{seconds:.2f} s", seconds=seconds
        )
        return encoded

    def _watch(self, attempt: RoundAttempt, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._queue.put_nowait(_ComputeFailed(attempt, error))

    async def _compute_failed(self, failure: _ComputeFailed) -> None:
        attempt = failure.attempt
        if self.current is not attempt or attempt.charged:
            return
        refusal = _computation_failed(failure.error)
        await self.outbox.error(attempt.header, refusal.code, str(refusal))
        self._leave(str(refusal))

    # -- secure aggregation ------------------------------------------------------------------

    def _last_round(self, round: int) -> int | None:
        """The latest round of this job the agent was invited to; an older ``round`` is stale."""
        last = self.agent.last_round.get(self.job_id)
        if last is not None and round < last:
            stale = f"round {round} of job {self.job_id!r} is older than round {last}"
            raise _Refusal(pb.ERROR_STALE_ROUND, stale)
        return last

    def _attempt_for(self, header: pb.RoundHeader) -> RoundAttempt:
        last = self._last_round(header.round)
        current = self.current
        if last is None:
            raise _Refusal(pb.ERROR_UNKNOWN_JOB, f"job {self.job_id!r} never invited this agent")
        if header.round > last:
            raise _Refusal(
                pb.ERROR_WRONG_STAGE,
                f"round {header.round} of job {self.job_id!r}: no invitation was received",
            )
        if current is None:
            raise _Refusal(
                pb.ERROR_STALE_ROUND,
                f"this agent is not taking part in round {header.round} of job {self.job_id!r}",
            )
        return current

    async def _secagg(self, message: pb.CoordinatorMessage) -> None:
        """One request of the summation: the setup chooses it, then it answers every stage."""
        kind = message.WhichOneof("body")
        attempt = self._attempt_for(getattr(message, str(kind)).header)
        try:
            request = secagg_wire.from_coordinator_message(message)
        except secagg_wire.WireError as exc:
            raise _Refusal(pb.ERROR_INVALID_ARGUMENT, str(exc)) from None
        summation = attempt.summation
        if summation is None:
            if not isinstance(request, sm.AdvertiseKeysRequest):
                raise _Refusal(
                    pb.ERROR_WRONG_STAGE,
                    f"{kind} before the secure-aggregation setup (ADVERTISE_KEYS)",
                )
            await self._setup(attempt, request)
            return
        with _protocol_refusals():
            input_request = summation.input_request(request)
        if input_request is not None:
            await self._send_input(attempt, summation, input_request)
            return
        with _protocol_refusals():
            attempt.summation, reply = summation.answer(request)
        await self.outbox.send_all(self._wire(attempt.summation, reply))
        if isinstance(reply, sm.UnmaskResponse):
            self.agent.emit(EventKind.UNMASKED, self.job_id, attempt.number, "shares sent")

    def _wire(self, summation: Summation, reply: sm.ClientMessage) -> list[pb.AgentMessage]:
        return list(
            secagg_wire.to_agent_messages(
                reply, ring_bits=summation.params.ring_bits, max_bytes=self.agent.piece_bytes
            )
        )

    async def _setup(self, attempt: RoundAttempt, request: sm.AdvertiseKeysRequest) -> None:
        """Validate the setup, check the claim, choose the summation, acknowledge, train."""
        try:
            params, own = check_setup(
                request,
                review=attempt.review,
                side=attempt.side,
                alone_unmasked=self.agent.gate.alone_unmasked(),
            )
        except SetupRefused as exc:
            raise _Refusal(exc.code, str(exc), leave=True) from None
        identity = self._identity(params)
        await self._verify_charge(attempt, params, own)
        with _protocol_refusals():
            summation, reply = start_summation(
                params,
                request,
                job_id=self.job_id,
                round=attempt.number,
                rng=attempt.rng,
                identity=identity,
            )
        attempt.summation = summation
        attempt.session_id = request.header.session_id
        compute = asyncio.get_running_loop().create_task(
            self._compute(attempt), name=f"dpfl-compute-{self.job_id}"
        )
        compute.add_done_callback(functools.partial(self._watch, attempt))
        attempt.compute = compute
        self.agent.emit(
            EventKind.SETUP,
            self.job_id,
            attempt.number,
            f"{params.num_clients} agents, {summation.mode}, ring 2^{params.ring_bits}, "
            f"m={params.vector_length}",
            secure_aggregation=summation.secure,
            verified_shares=attempt.review.verified_shares,
            recorded_fraction=attempt.review.recorded_fraction,
        )
        await self.outbox.send_all(self._wire(summation, reply))

    def _identity(self, params: SecureParameters | PlainParameters) -> ClientIdentity | None:
        """The peer identity a malicious-secure setup needs (None for any other setup).

        Raises:
            _Refusal: POLICY_DECLINED when this agent has no peer credentials, or its own
                certificate is not a peer of the federation CA now.
        """
        if not isinstance(params, SecureParameters) or not params.malicious:
            return None
        peer = self.agent.peer
        if peer is None:
            raise _Refusal(
                pb.ERROR_POLICY_DECLINED,
                "malicious-secure setup refused: this agent has no peer identity (the "
                "federation CA to trust, a peer certificate of it and its signing key)",
                leave=True,
            )
        # c only bounds what verified_noise_shares reports; the policy's figure is the cap
        colluding = self.agent.gate.max_colluding_peers()
        try:
            return peer.identity(max_colluding_peers=colluding or 0)
        except IdentityError as exc:
            refused = f"malicious-secure setup refused: this agent's peer identity: {exc}"
            raise _Refusal(pb.ERROR_POLICY_DECLINED, refused, leave=True) from None

    async def _verify_charge(
        self,
        attempt: RoundAttempt,
        params: SecureParameters | PlainParameters,
        own: float,
        *,
        at_most: int | None = None,
    ) -> None:
        """Replace the review's charge with the noise this agent can verify is in the sum, and
        ask the gate again before anything is trained or sent: a setup that leaves the agent
        less noise than its budget allows is declined here. In a malicious-secure round the
        policy counts t − c shares (``max_colluding_peers``); ``at_most`` caps that count
        when the protocol's checks verified fewer (:meth:`_reverify`)."""
        gate = self.agent.gate
        threshold, degree = (
            (params.threshold, params.degree) if isinstance(params, SecureParameters) else (0, 0)
        )
        invited = attempt.invited or attempt.review
        attempt.invited, attempt.own_fraction = invited, own
        try:
            review = gate.verified(
                invited,
                own_fraction=own,
                malicious_secure=isinstance(params, SecureParameters) and params.malicious,
                threshold=threshold,
                degree=degree,
                at_most=at_most,
            )
        except ChargeRefusedError as exc:
            raise _Refusal(pb.ERROR_POLICY_DECLINED, str(exc), leave=True) from None
        if review is not attempt.review:
            decision = await self._ask_gate(review)
            if not decision.accept:
                raise _Refusal(
                    pb.ERROR_POLICY_DECLINED,
                    f"declined on the noise this agent can verify "
                    f"({review.recorded_fraction:.3g} of the claimed, {review.verified_shares} "
                    f"shares): {decision.reason}",
                    leave=True,
                )
            attempt.review = review

    async def _reverify(self, attempt: RoundAttempt, sent: Summation) -> None:
        """Right before the charge: the shares the protocol itself verified (stage 2 of a
        malicious-secure round) against those the charge counts on; fewer, and the charge is
        recomputed on them and decided again. The ledger never records more noise than
        verified."""
        if not isinstance(sent, SecureSummation):
            return
        shares = sent.verified_shares()
        if shares < attempt.review.verified_shares:
            await self._verify_charge(attempt, sent.params, attempt.own_fraction, at_most=shares)

    async def _send_input(
        self, attempt: RoundAttempt, summation: Summation, request: sm.MaskedInputRequest
    ) -> None:
        """Wait for the encoded vector, turn it into the summation's reply (masked unless the
        round is plain), charge the local ledger, and only then send it."""
        assert attempt.compute is not None
        try:
            vector = await attempt.compute
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _computation_failed(exc) from None
        with _protocol_refusals():
            try:
                sent, reply = summation.contribute(vector, request)
            except ParameterError as exc:
                refused = f"input refused: {exc}"
                raise _Refusal(pb.ERROR_INVALID_ARGUMENT, refused, leave=True) from None
        messages = self._wire(sent, reply)
        await self._reverify(attempt, sent)
        await self._charge(attempt, _digest(messages))
        attempt.summation = sent
        if await self.outbox.send_all(messages):
            self.agent.emit(
                EventKind.MASKED_INPUT_SENT, self.job_id, attempt.number, sent.input_note
            )

    async def _charge(self, attempt: RoundAttempt, sent_sha256: bytes) -> None:
        """Record the round's charge in the local ledger (ledger first: once the input is out,
        the aggregate, or without secure aggregation this agent's vector, is computable).

        The key is the agent's own ``attempt.attempt_id``, with the digest of the messages
        about to be sent: every contribution is one row of its own.

        ``attempt.charged`` is set before the write starts: if the link ends while the write
        runs, the write still completes in its thread, and the round must be reported as
        charged (an over-report, never an under-count)."""
        attempt.charged = True
        try:
            await asyncio.to_thread(
                functools.partial(
                    self.agent.gate.charge,
                    attempt.review,
                    attempt=attempt.attempt_id,
                    session_id=attempt.session_id,
                    sent_sha256=sent_sha256,
                )
            )
        except ChargeRefusedError as exc:
            attempt.charged = False
            raise _Refusal(pb.ERROR_BUDGET_EXCEEDED, str(exc), leave=True) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempt.charged = False
            raise _Refusal(
                pb.ERROR_INTERNAL,
                f"the local ledger could not record the charge ({type(exc).__name__}); "
                "the masked input was not sent",
                leave=True,
            ) from None
        review = attempt.review
        self.agent.emit(
            EventKind.CHARGED,
            self.job_id,
            attempt.number,
            f"recorded in the local ledger ({review.recorded_fraction:.3g} of the claimed noise, "
            f"{review.verified_shares} verified shares)",
            verified_shares=review.verified_shares,
            recorded_fraction=review.recorded_fraction,
        )

    # -- the end of a round ------------------------------------------------------------------

    def _result(self, result: pb.RoundResult) -> None:
        attempt = self.current
        header = result.header
        if attempt is None or header.round != attempt.number:
            return
        if header.session_id and attempt.session_id and header.session_id != attempt.session_id:
            return
        attempt.cancel()
        self.current = None
        outcome = "completed" if result.completed else "aborted"
        detail = f": {result.message}" if result.message else ""
        self.agent.emit(
            EventKind.RESULT,
            self.job_id,
            attempt.number,
            f"{outcome}{detail}",
            completed=result.completed,
            charged=attempt.charged,
            model_version=result.model_version,
        )

    async def _coordinator_error(self, error: pb.Error) -> None:
        """The coordinator refused something of the current round: leave it, and say so.

        The coordinator counts a refused message as if it had never arrived and keeps waiting
        for a good one; without this agent's ``Error`` (with the round's header) it would wait
        for the stage deadline before counting the agent as a dropout."""
        header = error.header
        text = f"{enum_name(pb.ErrorCode.DESCRIPTOR, error.code)}: {error.message}"
        self.agent.emit(EventKind.COORDINATOR_ERROR, self.job_id, header.round, text)
        attempt = self.current
        if attempt is None or header.round != attempt.number:
            return
        if header.session_id and attempt.session_id and header.session_id != attempt.session_id:
            return
        reason = f"the coordinator reported {text}"
        self._leave(reason)
        await self.outbox.error(
            attempt.header,
            pb.ERROR_PROTOCOL_ABORT,
            f"this agent left round {attempt.number}: {reason}",
        )


@contextlib.contextmanager
def _protocol_refusals() -> Iterator[None]:
    """A summation's refusals as answers: a request that is not for its state is refused and
    changes nothing; one whose content breaks the protocol ends the attempt."""
    try:
        yield
    except (StaleMessage, DuplicateMessage, WrongStage) as exc:
        raise _Refusal(secagg_wire.error_code_to_pb(exc.code), str(exc)) from None
    except ProtocolAborted as exc:
        raise _Refusal(pb.ERROR_PROTOCOL_ABORT, str(exc), leave=True) from None


def _stage(stage: int) -> str:
    return enum_name(pb.Stage.DESCRIPTOR, stage)
