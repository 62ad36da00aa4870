"""Test-only: a minimal coordinator that drives real agents through real rounds.

It implements the coordinator's half of ``dpfl.v1.AgentService`` just far enough to test the
agent without ``dpfl.server``: enrolment with one-time tokens, authenticated ``Connect`` streams
(``Hello`` first), chunked downloads with a SHA-256, and :meth:`ScriptedCoordinator.run_round`,
which runs one round with the REAL ``dpfl.secagg.server`` state machine, the REAL
``protos.secagg_wire`` conversion (masked inputs reassembled from their pieces) and the REAL
algorithm's coordinator side. It is reachable two ways, exactly like the real coordinator:

- in process: ``connect_handler`` / ``download_handler`` for
  :class:`dpfl.client.transport.InProcessConnector`;
- over gRPC on loopback: :func:`start_grpc` serves the same core with ``grpc.aio``.

Tests script misbehaviour through hooks (``setup_hook`` rewrites the encoding the setup carries,
``before_unmask`` runs between the masked-input stage and the unmask requests, a seeded ``rng``
repeats the session nonce) and by sending raw messages (:meth:`send`, :meth:`next_message`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import numpy as np

from dpfl.accounting import DpEvent, event_to_json
from dpfl.learning.algorithms.base import Algorithm, JobPlan, RoundTask
from dpfl.learning.jobs import JobSpec
from dpfl.mechanisms import EncodingConfig, decode
from dpfl.protos import secagg_wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.secagg import ClientIdentity, RoundParameters, ThreatModel
from dpfl.secagg import client as secagg_client
from dpfl.secagg import messages as sm
from dpfl.secagg import server as server_sm
from dpfl.secagg.errors import ProtocolViolation
from dpfl.secagg.randomness import RandomSource
from dpfl.secagg.server_states import (
    ServerAborted,
    ServerCompleted,
    ServerReadyToUnmask,
    ServerState,
)

AGENT_ID = "x-dpfl-agent-id"


class Refused(Exception):  # noqa: N818
    """A refusal carrying the gRPC status name (the convention of ``dpfl.server.errors``)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.grpc_status = status


@dataclass(eq=False)
class Session:
    agent_id: str
    hello: pb.Hello
    outbound: asyncio.Queue[pb.CoordinatorMessage | None] = field(default_factory=asyncio.Queue)
    inbox: asyncio.Queue[pb.AgentMessage | None] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class RoundReport:
    """What one scripted round saw."""

    accepted: list[str] = field(default_factory=list)
    declined: dict[str, str] = field(default_factory=dict)
    errors: dict[str, list[pb.Error]] = field(default_factory=dict)
    params: RoundParameters | None = None
    encoding: EncodingConfig | None = None
    survivors: frozenset[str] = frozenset()
    aggregate: np.ndarray | None = None
    ring_sum: np.ndarray | None = None
    aborted: str = ""


class ScriptedCoordinator:
    """See the module docstring."""

    def __init__(self, *, chunk_bytes: int = 1000) -> None:
        self.credentials: dict[str, str] = {}
        self.tokens: set[str] = set()
        self.sessions: dict[str, Session] = {}
        self.blobs: dict[tuple[str, int, int], bytes] = {}
        self.hellos: list[pb.Hello] = []
        self.chunk_bytes = chunk_bytes
        self.downloads: list[pb.DownloadRequest] = []
        self.enrolled: list[str] = []  # names, in enrolment order (agent ids enrolled-1, ...)
        self._changed = asyncio.Event()

    # -- identities --------------------------------------------------------------------------

    def add_agent(self, agent_id: str) -> str:
        credential = secrets.token_urlsafe(16)
        self.credentials[agent_id] = credential
        return credential

    def issue_token(self) -> str:
        # prefixed as the coordinator's are: a bare URL-safe token starts with "-" one time in
        # 64, and a command line then reads it as an option
        token = "dpfl_enroll_" + secrets.token_urlsafe(12)
        self.tokens.add(token)
        return token

    def enroll(self, request: pb.EnrollRequest) -> pb.EnrollResponse:
        if request.enrollment_token not in self.tokens:
            raise Refused("UNAUTHENTICATED", "unknown enrollment token")
        self.tokens.discard(request.enrollment_token)
        self.enrolled.append(request.name)
        agent_id = f"enrolled-{len(self.enrolled)}"
        credential = self.add_agent(agent_id)
        return pb.EnrollResponse(
            agent_id=agent_id,
            credential=credential,
            coordinator_id="scripted",
            api_token="api-" + agent_id,
        )

    def _authenticate(self, metadata: Iterable[tuple[str, Any]]) -> str:
        pairs = dict(metadata)
        agent_id = pairs.get(AGENT_ID, "")
        auth = pairs.get("authorization", "")
        expected = self.credentials.get(agent_id)
        if expected is None or auth != f"Bearer {expected}":
            raise Refused("UNAUTHENTICATED", "unknown agent or invalid credential")
        return agent_id

    # -- the handlers ------------------------------------------------------------------------

    async def connect_handler(
        self, metadata: Iterable[tuple[str, Any]], inbound: AsyncIterator[pb.AgentMessage]
    ) -> AsyncIterator[pb.CoordinatorMessage]:
        agent_id = self._authenticate(metadata)
        first = await anext(inbound)
        if first.WhichOneof("body") != "hello" or first.hello.agent_id != agent_id:
            raise Refused("INVALID_ARGUMENT", "the first message must be this agent's Hello")
        old = self.sessions.get(agent_id)
        if old is not None:
            self._close(old)
        session = Session(agent_id, first.hello)
        self.sessions[agent_id] = session
        self.hellos.append(first.hello)
        self._changed.set()

        async def read() -> None:
            try:
                async for message in inbound:
                    session.inbox.put_nowait(message)
            except Exception:  # a broken transport ends the stream
                pass
            finally:
                self._close(session)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await session.outbound.get()
                if item is None:
                    return
                yield item
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._close(session)

    def download_handler(
        self, metadata: Iterable[tuple[str, Any]], request: pb.DownloadRequest
    ) -> list[pb.DownloadChunk]:
        self._authenticate(metadata)
        self.downloads.append(request)
        version = request.version if request.kind == pb.BLOB_MODEL else 0
        data = self.blobs.get((request.job_id, request.kind, version))
        if data is None:
            raise Refused("NOT_FOUND", f"no blob {pb.BlobKind.Name(request.kind)} v{version}")
        digest = hashlib.sha256(data).digest()
        chunks = []
        offset = 0
        while True:
            piece = data[offset : offset + self.chunk_bytes]
            last = offset + len(piece) >= len(data)
            chunks.append(
                pb.DownloadChunk(
                    offset=offset,
                    total_size=len(data),
                    data=piece,
                    sha256=digest if last else b"",
                    media_type="application/octet-stream",
                )
            )
            offset += len(piece)
            if last:
                return chunks

    # -- sessions ----------------------------------------------------------------------------

    def _close(self, session: Session) -> None:
        if not session.closed.is_set():
            session.closed.set()
            session.outbound.put_nowait(None)
            session.inbox.put_nowait(None)
        if self.sessions.get(session.agent_id) is session:
            del self.sessions[session.agent_id]
        self._changed.set()

    def drop(self, agent_id: str) -> None:
        """End an agent's stream from the coordinator's side (the agent sees the link end)."""
        session = self.sessions.get(agent_id)
        if session is not None:
            self._close(session)

    async def wait_connected(self, agent_ids: Iterable[str], *, timeout: float = 10.0) -> None:
        wanted = set(agent_ids)
        deadline = time.monotonic() + timeout
        while not wanted <= set(self.sessions):
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"agents {sorted(wanted - set(self.sessions))} not connected")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def send(self, agent_id: str, message: pb.CoordinatorMessage) -> None:
        self.sessions[agent_id].outbound.put_nowait(message)

    async def next_message(
        self, agent_id: str, *, timeout: float = 10.0, skip_pongs: bool = True
    ) -> pb.AgentMessage:
        """The agent's next message on its current stream (TimeoutError / EOFError otherwise)."""
        session = self.sessions.get(agent_id)
        if session is None:
            raise EOFError(f"{agent_id} is not connected")
        while True:
            item = await asyncio.wait_for(session.inbox.get(), timeout)
            if item is None:
                raise EOFError(f"{agent_id}'s stream ended")
            if skip_pongs and item.WhichOneof("body") == "pong":
                continue
            return item

    # -- one round ---------------------------------------------------------------------------

    def invitation(
        self,
        *,
        job_id: str,
        round: int,
        algorithm: str,
        job_name: str,
        params: dict[str, Any],
        events: Sequence[DpEvent],
        model_version: int = 0,
        expected: int = 0,
    ) -> pb.CoordinatorMessage:
        return pb.CoordinatorMessage(
            invitation=pb.Invitation(
                header=pb.RoundHeader(job_id=job_id, round=round, stage=pb.STAGE_INVITATION),
                algorithm=algorithm,
                job_name=job_name,
                params_json=json.dumps(params),
                privacy_events_json=json.dumps([event_to_json(e) for e in events]),
                model_version=model_version,
                deadline_unix=time.time() + 30,
                expected_participants=expected,
            )
        )

    async def run_round(
        self,
        *,
        job_id: str,
        round: int,
        agents: Sequence[str],
        algorithm: Algorithm,
        job: JobSpec,
        plan: JobPlan,
        task: RoundTask,
        events: Sequence[DpEvent] | None = None,
        timeout: float = 10.0,
        setup_hook: Callable[[EncodingConfig], EncodingConfig] | None = None,
        before_unmask: Callable[[ServerReadyToUnmask], Awaitable[None]] | None = None,
        masked_input_hook: Callable[[str], Awaitable[None]] | None = None,
        rng: RandomSource | None = None,
        sybils: int = 0,
        threat_model: ThreatModel = ThreatModel.SEMI_HONEST,
        sybil_identities: Sequence[ClientIdentity] = (),
        tamper: Callable[[int, sm.ServerMessage], sm.ServerMessage] | None = None,
    ) -> RoundReport:
        """One round with ``agents`` invited; see the module docstring. ``rng`` draws the
        session nonce (a seeded source repeats it: a coordinator that reuses nonces).
        ``sybils`` agents of the coordinator's own join the secure aggregation after the
        accepted ones: in-process secagg clients that add zero vectors and no noise.
        ``threat_model`` is the setup's (MALICIOUS: the malicious-secure variant, with its
        consistency stage); ``sybil_identities`` give the sybils peer certificates (e.g. of a CA
        the coordinator runs itself), one per sybil. ``tamper(index, message)`` rewrites every
        protocol request before it goes to a real agent (a coordinator that deviates).
        """
        report = RoundReport()
        claimed = (
            list(events)
            if events is not None
            else list(
                algorithm.bind(job, plan).invitation_events(
                    round_number=round, population=list(agents)
                )
            )
        )
        for agent_id in agents:
            self.send(
                agent_id,
                self.invitation(
                    job_id=job_id,
                    round=round,
                    algorithm=algorithm.name,
                    job_name=job.name,
                    params=task.params.to_json(),
                    events=claimed,
                    model_version=task.model_version or 0,
                    expected=len(agents),
                ),
            )
        for agent_id in agents:
            reply = await self._expect(agent_id, "invitation_response", report, timeout)
            if reply is None:
                continue
            if reply.invitation_response.accept:
                report.accepted.append(agent_id)
            else:
                report.declined[agent_id] = reply.invitation_response.reason
        accepted = report.accepted
        if len(accepted) + sybils < 2:
            report.aborted = "fewer than two agents accepted"
            return report
        n = len(accepted) + sybils
        own: dict[int, secagg_client.ClientState] = {
            len(accepted) + i: secagg_client.new_client(
                job_id=job_id,
                round=round,
                input=np.zeros(task.vector_length, dtype=np.int64),
                identity=sybil_identities[i] if i < len(sybil_identities) else None,
            )
            for i in range(sybils)
        }
        probe = RoundParameters.choose(
            num_clients=n,
            vector_length=task.vector_length,
            ring_bits=64,
            corrupt_fraction=job.secagg.corrupt_fraction,
            dropout_fraction=job.secagg.dropout_fraction,
            model=threat_model,
        )
        encoding = algorithm.bind(job, plan).encoding(
            task, participants=n, min_survivors=probe.min_survivors
        )
        params = RoundParameters(
            num_clients=n,
            degree=probe.degree,
            threshold=probe.threshold,
            ring_bits=encoding.ring_bits,
            vector_length=task.vector_length,
            min_survivors=probe.min_survivors,
        )
        if setup_hook is not None:
            encoding = setup_hook(encoding)
        report.params, report.encoding = params, encoding
        state: ServerState
        state, outbound = server_sm.start_round(
            job_id=job_id,
            round=round,
            params=params,
            rng=rng,
            encoding_json=encoding.to_json(),
            threat_model=threat_model,
        )
        kinds = {
            sm.Stage.ADVERTISE_KEYS: "advertise_keys",
            sm.Stage.SHARE_KEYS: "share_keys",
            sm.Stage.MASKED_INPUT: "masked_input",
            sm.Stage.CONSISTENCY: "consistency",
            sm.Stage.UNMASK: "unmask",
        }
        while not isinstance(state, ServerCompleted | ServerAborted):
            stage = state.stage
            replies: list[tuple[int, sm.ClientMessage]] = []
            for item in outbound:
                if item.recipient in own:
                    own[item.recipient], reply = secagg_client.step(
                        own[item.recipient], item.message
                    )
                    if reply is not None:
                        replies.append((item.recipient, reply))
                    continue
                outgoing = item.message if tamper is None else tamper(item.recipient, item.message)
                message = secagg_wire.to_coordinator_message(outgoing)
                if accepted[item.recipient] in self.sessions:
                    self.send(accepted[item.recipient], message)
            for index, reply in replies:
                state = server_sm.receive(state, index, reply)
            for index in sorted(state.pending):
                if index in own:
                    continue
                agent_id = accepted[index]
                response = await self._collect(
                    agent_id, kinds[stage], report, timeout, params=params
                )
                if response is None:
                    continue
                with contextlib.suppress(ProtocolViolation):
                    state = server_sm.receive(state, index, response)
                if stage is sm.Stage.MASKED_INPUT and masked_input_hook is not None:
                    await masked_input_hook(agent_id)
            state, outbound = server_sm.close_stage(state)
            if isinstance(state, ServerReadyToUnmask):
                if before_unmask is not None:
                    await before_unmask(state)
                state, outbound = server_sm.begin_unmask(state)
        if isinstance(state, ServerAborted):
            report.aborted = f"{state.at_stage.name}: {state.reason}"
            report.survivors = frozenset(accepted[i] for i in state.survivors.a3 if i not in own)
        else:
            report.ring_sum = state.aggregate
            report.aggregate = decode(state.aggregate, config=encoding)
            report.survivors = frozenset(accepted[i] for i in state.survivors.a3 if i not in own)
        for agent_id in accepted:
            if agent_id in self.sessions:
                self.send(
                    agent_id,
                    pb.CoordinatorMessage(
                        result=pb.RoundResult(
                            header=pb.RoundHeader(
                                job_id=job_id,
                                round=round,
                                stage=pb.STAGE_RESULT,
                                session_id=state.ctx.session_id,
                            ),
                            completed=report.aggregate is not None,
                            message=report.aborted,
                        )
                    ),
                )
        return report

    async def _expect(
        self, agent_id: str, kind: str, report: RoundReport, timeout: float
    ) -> pb.AgentMessage | None:
        """The agent's next message if it is of ``kind``; errors and silence give None."""
        try:
            message = await self.next_message(agent_id, timeout=timeout)
        except (TimeoutError, EOFError):
            return None
        if message.WhichOneof("body") == "error":
            report.errors.setdefault(agent_id, []).append(message.error)
            return None
        if message.WhichOneof("body") != kind:
            return None
        return message

    async def _collect(
        self,
        agent_id: str,
        kind: str,
        report: RoundReport,
        timeout: float,
        *,
        params: RoundParameters,
    ) -> sm.ClientMessage | None:
        message = await self._expect(agent_id, kind, report, timeout)
        if message is None:
            return None
        if kind != "masked_input":
            return secagg_wire.from_agent_message(message)
        assembler = secagg_wire.MaskedInputAssembler(
            vector_length=params.vector_length, ring_bits=params.ring_bits
        )
        while True:
            done = assembler.add(message.masked_input)
            if done is not None:
                return done
            message = await self._expect(agent_id, kind, report, timeout)
            if message is None:
                return None


# -- gRPC --------------------------------------------------------------------------------------


class ScriptedServicer(agent_pb2_grpc.AgentServiceServicer):
    """The scripted coordinator behind a real ``grpc.aio`` server."""

    def __init__(self, coordinator: ScriptedCoordinator) -> None:
        self.coordinator = coordinator

    async def Enroll(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        try:
            return self.coordinator.enroll(request)
        except Refused as exc:
            await context.abort(grpc.StatusCode[exc.grpc_status], str(exc))

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        metadata = tuple((m.key, m.value) for m in context.invocation_metadata())
        stream = self.coordinator.connect_handler(metadata, request_iterator)
        try:
            async for message in stream:
                yield message
        except Refused as exc:
            await context.abort(grpc.StatusCode[exc.grpc_status], str(exc))

    async def Download(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        metadata = tuple((m.key, m.value) for m in context.invocation_metadata())
        try:
            chunks = self.coordinator.download_handler(metadata, request)
        except Refused as exc:
            await context.abort(grpc.StatusCode[exc.grpc_status], str(exc))
            return
        for chunk in chunks:
            yield chunk


async def start_grpc(
    coordinator: ScriptedCoordinator, *, port: int = 0
) -> tuple[grpc.aio.Server, str]:
    """Serve ``coordinator`` on loopback; returns the server and its ``HOST:PORT``."""
    server = grpc.aio.server(
        options=[
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(ScriptedServicer(coordinator), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, f"127.0.0.1:{bound}"
