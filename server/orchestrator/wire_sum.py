"""The two summations of the round driver over the agents' streams: secure aggregation's stages
(:func:`sum_securely`) and the plain summation (:func:`sum_plainly`,
docs/architecture.md#without-secure-aggregation-secaggenabled-false). Each calls the driver's
``commit`` before the first message that makes the sum computable: the unmask request, or
without secure aggregation, the first vector request (ledger rule 1). A malicious-secure round
(``secagg.threat_model: malicious``) has one stage more between the masked inputs and the commit:
the consistency round, where every summed agent signs the survivor set
(docs/secagg.md#the-malicious-secure-variant).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from dpfl.learning.rounds import Commit, RoundAborted, Summed, SumSetup
from dpfl.protos import secagg_wire as wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import RoundParameters, ThreatModel
from dpfl.secagg import server as secagg_server
from dpfl.secagg.errors import SecAggError
from dpfl.secagg.messages import ClientMessage
from dpfl.secagg.primitives import compute_session_id
from dpfl.secagg.server_states import (
    ServerAborted,
    ServerCompleted,
    ServerReadyToUnmask,
    ServerState,
)
from dpfl.server.agent_protocol import MalformedMessage, RoundMessageError

if TYPE_CHECKING:
    from dpfl.server.orchestrator.round import WireRound

__all__ = ["sum_plainly", "sum_securely"]

#: Answers added to the secure-aggregation state at once (the copy of its collections is shared
#: by the batch); masked inputs wait as decoded vectors, so fewer of them.
ANSWER_BATCH = 256
MASKED_BATCH = 16


async def sum_securely(run: WireRound, setup: SumSetup, commit: Commit) -> Summed:
    """Secure aggregation: keys, shares and masked inputs (and in a malicious-secure round the
    survivor set's attestations), the commit, then the unmasking."""
    params, agents, d = setup.params, setup.accepted, run.deadlines  # client i is agents[i]
    assert params is not None
    threat = ThreatModel(setup.threat_model or ThreatModel.SEMI_HONEST.value)
    malicious = threat is ThreatModel.MALICIOUS
    stages = (  # name, seconds, the stage opened when it closes
        ("advertise_keys", d.advertise_keys, pb.STAGE_SHARE_KEYS),
        ("share_keys", d.share_keys, pb.STAGE_MASKED_INPUT),
        (
            "masked_input",
            d.masked_input + d.training,
            pb.STAGE_CONSISTENCY if malicious else None,
        ),
        *((("consistency", d.consistency, None),) if malicious else ()),
    )
    state: ServerState
    encoding = setup.encoding.to_json()  # the protocol carries it to the agents unread
    state, outbound = secagg_server.start_round(
        job_id=run.ctx.job_id,
        round=run.rnd.number,
        params=params,
        encoding_json=encoding,
        threat_model=threat,
    )
    run.channel.open_stage(pb.STAGE_ADVERTISE_KEYS, session_id=state.ctx.session_id)
    expected: Sequence[str] = agents
    for name, seconds, following in stages:
        started = time.monotonic()
        for item in outbound:
            run.send(agents[item.recipient], wire.to_coordinator_message(item.message))
        state = await _collect(run, state, agents, params, seconds)
        state, outbound = await asyncio.to_thread(secagg_server.close_stage, state)
        answered = [agents[i] for i in sorted(_answered(name, state))]
        await run.record(name, answered, expected, started)
        expected = answered
        await run.hooks.at(f"{name}_closed", run.info)
        if isinstance(state, ServerAborted):
            raise RoundAborted(f"secure aggregation aborted at {name}: {state.reason}")
        if following is not None:
            run.channel.open_stage(following)
    assert isinstance(state, ServerReadyToUnmask)
    summed = tuple(agents[i] for i in sorted(state.a3))
    await commit(summed)
    # ledger rule 1: only now may the aggregate become computable
    return Summed(await _unmask(run, state, agents, params), summed)


def _answered(stage: str, state: ServerState) -> frozenset[int]:
    """Who answered the stage just closed: A1, A2, A3, or the agents that attested S."""
    s = state.survivors
    if stage == "consistency":
        return s.attested
    return {"advertise_keys": s.a1, "share_keys": s.a2}.get(stage, s.a3)


async def _unmask(
    run: WireRound, ready: ServerReadyToUnmask, agents: Sequence[str], params: RoundParameters
) -> npt.NDArray[np.uint64]:
    started = time.monotonic()
    run.channel.open_stage(pb.STAGE_UNMASK)
    unmasking, outbound = await asyncio.to_thread(secagg_server.begin_unmask, ready)
    for item in outbound:
        run.send(agents[item.recipient], wire.to_coordinator_message(item.message))
    collected = await _collect(run, unmasking, agents, params, run.deadlines.unmask)
    final, _ = await asyncio.to_thread(secagg_server.close_stage, collected)
    responders = [agents[i] for i in sorted(collected.survivors.unmask)]
    asked = [agents[i] for i in sorted(unmasking.requests)]  # A3, or those that attested S
    await run.record("unmask", responders, asked, started)
    await run.hooks.at("unmask_closed", run.info)
    if not isinstance(final, ServerCompleted):
        reason = final.reason if isinstance(final, ServerAborted) else type(final).__name__
        raise RoundAborted(f"secure aggregation aborted at unmask: {reason}")
    return final.aggregate


class _Inbox:
    """A stage's answers on their way into the secure-aggregation state: masked inputs
    assembled from their pieces, every answer added in batches (whatever arrived since the last
    one), since adding them one by one copies the state's collections per message, O(n²) per
    stage."""

    def __init__(
        self,
        run: WireRound,
        state: ServerState,
        index: Mapping[str, int],
        params: RoundParameters,
    ) -> None:
        self.run = run
        self.state = state
        self.index = index
        self.params = params
        self.assemblers: dict[int, wire.MaskedInputAssembler] = {}
        self.batch: list[tuple[int, ClientMessage, str, pb.RoundHeader]] = []

    def handle(self, agent_id: str, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("body")
        header = getattr(message, kind).header
        sender = self.index[agent_id]
        try:
            response = self._response(sender, kind, message)
        except (wire.WireError, SecAggError, RoundMessageError) as exc:
            if kind == "masked_input":
                self.assemblers.pop(sender, None)
            refused = MalformedMessage(str(exc)) if isinstance(exc, wire.WireError) else exc
            self.run.refuse(agent_id, refused, header)
            return
        if response is None:
            return
        self.batch.append((sender, response, agent_id, header))
        # a decoded masked input is L ring words: bound what waits in memory
        if len(self.batch) >= (MASKED_BATCH if kind == "masked_input" else ANSWER_BATCH):
            self.flush()

    def _response(self, sender: int, kind: str, message: pb.AgentMessage) -> ClientMessage | None:
        if kind != "masked_input":
            return wire.from_agent_message(message)
        if sender not in self.state.pending:
            raise MalformedMessage(f"client {sender} was not asked for a masked input")
        assembler = self.assemblers.setdefault(
            sender,
            wire.MaskedInputAssembler(
                vector_length=self.params.vector_length, ring_bits=self.params.ring_bits
            ),
        )
        response = assembler.add(message.masked_input)
        if response is not None:
            del self.assemblers[sender]
        return response

    def flush(self) -> None:
        if not self.batch:
            return
        items = list(self.batch)
        self.batch.clear()
        self.state, rejected = secagg_server.receive_many(
            self.state, [(sender, response) for sender, response, _, _ in items]
        )
        by_sender: dict[int, list[tuple[str, pb.RoundHeader]]] = {}
        for sender, _, agent_id, header in items:
            by_sender.setdefault(sender, []).append((agent_id, header))
        for sender, exc in rejected:
            agent_id, header = by_sender[sender].pop(0)
            self.run.refuse(agent_id, exc, header)


async def _collect(
    run: WireRound,
    state: ServerState,
    agents: Sequence[str],
    params: RoundParameters,
    seconds: float,
) -> ServerState:
    inbox = _Inbox(run, state, {a: i for i, a in enumerate(agents)}, params)
    await run.channel.collect(
        deadline=run.deadline(seconds),
        pending=lambda: {agents[i] for i in inbox.state.pending},
        handle=inbox.handle,
        flush=inbox.flush,
    )
    inbox.flush()
    return inbox.state


async def sum_plainly(run: WireRound, setup: SumSetup, commit: Commit) -> Summed:
    """The plain summation: each agent acknowledges its setup, everyone who did is charged,
    then each is asked for its vector, read as it arrives."""
    acked = await _plain_setup(run, setup)
    if not acked:
        raise RoundAborted("no client acknowledged the plain-summation setup")
    # ledger rule 1 without secure aggregation: each vector is readable the moment it
    # arrives, so everyone who will be asked for one is charged before anyone is asked
    await commit(acked)
    return await _plain_vectors(run, setup, acked)


async def _plain_setup(run: WireRound, setup: SumSetup) -> tuple[str, ...]:
    """Send every accepted agent its setup (``num_clients``, ``min_survivors = 1``, the
    encoding); who acknowledged it."""
    n, encoding = len(setup.accepted), setup.encoding
    nonce = os.urandom(32)
    session_id = compute_session_id(job_id=run.ctx.job_id, round=run.rnd.number, nonce=nonce)
    run.channel.open_stage(pb.STAGE_ADVERTISE_KEYS, session_id=session_id)
    started = time.monotonic()
    for i, agent_id in enumerate(setup.accepted):
        message = pb.SecAggSetup(
            client_index=i,
            num_clients=n,
            degree=0,
            threshold=0,
            ring_bits=encoding.ring_bits,
            vector_length=setup.vector_length,
            min_survivors=1,
            encoding_json=encoding.to_json(),
            session_nonce=nonce,
        )
        header = run.channel.header(pb.STAGE_ADVERTISE_KEYS)
        request = pb.AdvertiseKeysRequest(header=header, setup=message)
        run.send(agent_id, pb.CoordinatorMessage(advertise_keys=request))
    acked: set[str] = set()

    def ack(agent_id: str, message: pb.AgentMessage) -> None:
        keys = message.advertise_keys
        if agent_id in acked:
            run.refuse(agent_id, MalformedMessage("already acknowledged"), keys.header)
        elif keys.encryption_public_key or keys.masking_public_key or keys.signature:
            # a plain round exchanges no keys: an agent sending some runs another protocol
            refused = MalformedMessage("a plain-summation acknowledgement carries no keys")
            run.refuse(agent_id, refused, keys.header)
        else:
            acked.add(agent_id)

    await run.channel.collect(
        deadline=run.deadline(run.deadlines.advertise_keys),
        pending=lambda: set(setup.accepted) - acked,
        handle=ack,
    )
    answered = tuple(sorted(acked - run.channel.gone))
    await run.record("advertise_keys", answered, setup.accepted, started)
    await run.hooks.at("advertise_keys_closed", run.info)
    return answered


async def _plain_vectors(run: WireRound, setup: SumSetup, charged: Sequence[str]) -> Summed:
    """Ask each charged agent for its vector; their sum mod 2^64."""
    started = time.monotonic()
    run.channel.open_stage(pb.STAGE_MASKED_INPUT)
    ask = pb.MaskedInputRequest(header=run.channel.header(pb.STAGE_MASKED_INPUT))
    for agent_id in charged:
        run.send(agent_id, pb.CoordinatorMessage(masked_input=ask))
    total = np.zeros(setup.vector_length, dtype=np.uint64)
    assemblers: dict[str, wire.MaskedInputAssembler] = {}
    received: set[str] = set()

    def vector(agent_id: str, message: pb.AgentMessage) -> None:
        nonlocal total
        header = message.masked_input.header
        if agent_id not in charged:
            refused = MalformedMessage("this agent was not asked for a vector in this round")
            run.refuse(agent_id, refused, header)
            return
        if agent_id in received:
            run.refuse(agent_id, MalformedMessage("masked input already received"), header)
            return
        assembler = assemblers.setdefault(
            agent_id,
            wire.MaskedInputAssembler(
                vector_length=setup.vector_length, ring_bits=setup.encoding.ring_bits
            ),
        )
        try:
            response = assembler.add(message.masked_input)
        except wire.WireError as exc:
            assemblers.pop(agent_id, None)
            run.refuse(agent_id, MalformedMessage(str(exc)), header)
            return
        if response is not None:
            del assemblers[agent_id]
            total = total + response.masked_input  # uint64 wraps mod 2^64
            received.add(agent_id)

    await run.channel.collect(
        deadline=run.deadline(run.deadlines.masked_input + run.deadlines.training),
        pending=lambda: set(charged) - received,
        handle=vector,
    )
    summed = tuple(sorted(received))
    await run.record("masked_input", summed, charged, started)
    await run.hooks.at("masked_input_closed", run.info)
    if not summed:
        raise RoundAborted("no vector arrived")
    return Summed(total, summed)
