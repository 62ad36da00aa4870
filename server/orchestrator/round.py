"""The round engine: one round of one job, in the sequence of
docs/architecture.md#a-round-over-the-wire.

Nothing that makes the aggregate computable (an unmask request; without secure aggregation, any
vector request) happens before the ledger commit is durable (ledger rule 1); an abort before the
commit charges nothing, after it the charge stays. A cancelled engine writes nothing more.
Rounds without secure aggregation are
docs/architecture.md#without-secure-aggregation-secaggenabled-false; where the charge credits
client sampling every sample is released
(docs/accounting.md#client-sampling-every-sample-is-released).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpfl.accounting import event_to_json
from dpfl.learning.algorithms.base import (
    Algorithm,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundTask,
)
from dpfl.learning.algorithms.release import (
    Release,
    minimum_accepted,
    release_for,
    restore_dropped_noise,
    secure_sum,
)
from dpfl.learning.jobs import JobSpec
from dpfl.protos import secagg_wire as wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import EncodingConfig, RoundParameters, ThreatModel, decode, encode
from dpfl.secagg import server as secagg_server
from dpfl.secagg.errors import SecAggError
from dpfl.secagg.messages import ClientMessage
from dpfl.secagg.primitives import compute_session_id
from dpfl.secagg.randomness import SystemRandomSource
from dpfl.secagg.server_states import (
    ServerAborted,
    ServerCompleted,
    ServerReadyToUnmask,
    ServerState,
)
from dpfl.server.errors import BudgetExceeded
from dpfl.server.handlers import MalformedMessage, RoundMessageError, error_message, error_reply
from dpfl.server.ledger_charges import store_charge
from dpfl.server.orchestrator.channel import RoundChannel, invitation_session_id
from dpfl.server.orchestrator.hooks import NO_HOOKS, FaultHooks
from dpfl.server.orchestrator.sampling import attempt_sample
from dpfl.server.orchestrator.state import round_record
from dpfl.server.sessions import SessionRegistry
from dpfl.server.settings import StageDeadlines
from dpfl.server.store import AgentStatus, Round, Store

__all__ = ["JobContext", "RoundEngine", "RoundReport"]


@dataclass(frozen=True, slots=True)
class JobContext:
    """What every round of a job shares."""

    job_id: str
    spec: JobSpec
    algorithm: Algorithm
    plan: JobPlan
    data: CoordinatorData


@dataclass(frozen=True, slots=True)
class RoundReport:
    """How a round ended.

    ``skipped``: fewer clients were sampled than a round needs, for an algorithm whose charge
    credits no client sampling (the others release every sample); nothing was sent or charged
    and the job moves on to the next round number. ``exhausted``: no client of the population
    can afford another round.
    """

    completed: bool
    reason: str = ""
    round: Round | None = None
    state: CoordinatorState | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    done: bool = False
    skipped: bool = False
    exhausted: bool = False


class _Aborted(Exception):  # noqa: N818 (control flow inside the engine)
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: Answers added to the secure-aggregation state at once (the copy of its collections is shared
#: by the batch); masked inputs wait as decoded vectors, so fewer of them.
ANSWER_BATCH = 256
#: Characters kept of an agent's decline reason (the agent's text, bounded in the round record).
DECLINE_REASON_CHARS = 300
MASKED_BATCH = 16


def _threat_model(name: str) -> ThreatModel:
    return ThreatModel(name)  # the job schema admits exactly the values secagg implements


class RoundEngine:
    """Runs rounds; one instance serves every job of a coordinator.

    Args:
        store: the coordinator's store.
        registry: the connected agents' sessions.
        deadlines: seconds per stage (the masked-input stage also waits for download and
            training).
        hooks: fault-injection points (tests only).
        metrics: an object with ``stage_latency(stage, seconds)`` and
            ``round_finished(job_id, completed)`` (``dpfl.server.metrics.Metrics``), or None.
        enforce_budgets: False only in tests of the agent's own budget check: invite clients
            over budget and commit without the budget check.
        data_dependent_budget: measure spending with data-dependent curves (settings).
        max_piece_bytes: payload of one masked-input piece the agents are expected to send.
    """

    def __init__(
        self,
        *,
        store: Store,
        registry: SessionRegistry,
        deadlines: StageDeadlines,
        hooks: FaultHooks = NO_HOOKS,
        metrics: Any = None,
        enforce_budgets: bool = True,
        data_dependent_budget: bool = False,
    ) -> None:
        self.store = store
        self.registry = registry
        self.deadlines = deadlines
        self.hooks = hooks
        self.metrics = metrics
        self.enforce_budgets = enforce_budgets
        self.data_dependent_budget = data_dependent_budget

    # -- population and selection --------------------------------------------------------------

    def _population(self, ctx: JobContext, number: int) -> tuple[list[str], list[str]]:
        """(active members within budget, members excluded for their budget) — blocking.

        A disabled or revoked member is no part of the population: never invited, never
        charged (its ledger stays)."""
        active = {a.id for a in self.store.list_agents(status=AgentStatus.ACTIVE)}
        members = [
            a
            for a in self.store.job_members(ctx.job_id)
            if a in active and self.registry.evicted(a) is None
        ]
        if not members or not self.enforce_budgets:
            return members, []
        charges = ctx.algorithm.charges(
            ctx.spec, ctx.plan, round_number=number, population=members, participants=members
        )
        events = {a: charges[a].event for a in members if a in charges}
        checks = self.store.check_budgets(events, data_dependent=self.data_dependent_budget)
        excluded = sorted(a for a, c in checks.items() if not c.allowed)
        return [a for a in members if a not in excluded], excluded

    async def run(self, ctx: JobContext, *, number: int, state: CoordinatorState) -> RoundReport:
        """Run one attempt at round ``number`` from ``state``.

        Raises:
            asyncio.CancelledError: cancelled (nothing more was written).
            Exception: an unexpected failure; the round was aborted with its reason first.
        """
        population, excluded = await asyncio.to_thread(self._population, ctx, number)
        if not population:
            return RoundReport(
                completed=False,
                exhausted=True,
                reason="no client of the population can afford another round within its "
                f"budget ({len(excluded)} excluded)",
            )
        previous = await asyncio.to_thread(self.store.list_rounds, ctx.job_id, number=number)
        sample = attempt_sample(
            ctx.algorithm,
            ctx.spec,
            ctx.plan,
            round_number=number,
            population=population,
            previous=previous,
        )
        invited = list(sample.invited)
        record = round_record(
            ctx.plan,
            state,
            population=len(population),
            excluded_over_budget=excluded,
            **sample.record(),
        )
        rnd = await asyncio.to_thread(
            self.store.start_round, ctx.job_id, number, invited=invited, noise=record
        )
        info = {"job_id": ctx.job_id, "round": number, "attempt": rnd.attempt, "round_id": rnd.id}
        release = release_for(ctx.algorithm, ctx.spec, ctx.plan, invited=len(invited))
        if release is Release.SKIP:
            minimum = minimum_accepted(ctx.algorithm, ctx.spec, ctx.plan)
            reason = f"{len(invited)} clients sampled, a round needs {minimum}: skipped"
            rnd = await asyncio.to_thread(self.store.abort_round, rnd.id, reason=reason)
            return RoundReport(completed=False, reason=reason, round=rnd, skipped=True)
        channel = RoundChannel(
            job_id=ctx.job_id, number=number, participants=invited, limits=self.registry.limits
        )
        channel.open_stage(
            pb.STAGE_INVITATION, session_id=invitation_session_id(ctx.job_id, rnd.id)
        )
        run = _RoundRun(
            ctx,
            rnd,
            channel,
            state,
            population,
            info,
            record,
            store=self.store,
            registry=self.registry,
            deadlines=self.deadlines,
            hooks=self.hooks,
            metrics=self.metrics,
            enforce_budgets=self.enforce_budgets,
            data_dependent_budget=self.data_dependent_budget,
        )
        self.registry.add_route(channel)
        try:
            await self.hooks.at("round_started", info)
            if release is Release.NOISE_ALONE:
                return await run.noise_alone()
            return await run.execute()
        except _Aborted as exc:
            return await run.abort(exc.reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await run.abort(f"internal error: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.registry.remove_route(channel)


class _RoundRun:
    """The state of one running round (split from the engine to keep each step small); the
    keyword arguments are the engine's, documented there."""

    def __init__(
        self,
        ctx: JobContext,
        rnd: Round,
        channel: RoundChannel,
        state: CoordinatorState,
        population: list[str],
        info: dict[str, Any],
        record: dict[str, Any],
        *,
        store: Store,
        registry: SessionRegistry,
        deadlines: StageDeadlines,
        hooks: FaultHooks,
        metrics: Any,
        enforce_budgets: bool,
        data_dependent_budget: bool,
    ) -> None:
        self.store = store
        self.registry = registry
        self.deadlines = deadlines
        self.hooks = hooks
        self.metrics = metrics
        self.enforce_budgets = enforce_budgets
        self.data_dependent_budget = data_dependent_budget
        self.ctx = ctx
        self.rnd = rnd
        self.channel = channel
        self.state = state
        self.population = population
        self.info = info
        self.noise = record
        self.accepted: list[str] = []
        self.task: RoundTask | None = None
        self.committed = False
        self.loop = asyncio.get_running_loop()

    # -- helpers -------------------------------------------------------------------------------

    def invitation_seconds(self) -> float:
        """The invitation deadline of this attempt: the setting's, doubled for each earlier
        attempt of the round (at most 8×), so that agents too slow for a first invitation (a
        cold start on a busy machine) get the time on the retry instead of failing the job."""
        return self.deadlines.invitation * float(2 ** min(3, max(0, self.rnd.attempt - 1)))

    def send(self, agent_id: str, message: pb.CoordinatorMessage) -> None:
        if not self.registry.send(agent_id, message):
            self.channel.disconnected(agent_id)

    def refuse(self, agent_id: str, exc: Exception, header: pb.RoundHeader) -> None:
        if isinstance(exc, SecAggError):
            reply = error_reply(wire.error_code_to_pb(exc.code), str(exc), header=header)
        else:
            reply = error_message(exc, header=header)
        self.registry.send(agent_id, reply)

    async def record(
        self, stage: str, survivors: Collection[str], dropped: Collection[str], started: float
    ) -> None:
        seconds = max(0.0, time.monotonic() - started)
        self.rnd = await asyncio.to_thread(
            self.store.record_stage,
            self.rnd.id,
            stage,
            survivors=sorted(survivors),
            dropped=sorted(set(dropped) - set(survivors)),
            seconds=seconds,
        )
        if self.metrics is not None:
            self.metrics.stage_latency(stage, seconds)

    def deadline(self, seconds: float) -> float:
        return self.loop.time() + seconds

    # -- the sequence --------------------------------------------------------------------------

    async def execute(self) -> RoundReport:
        task = self.ctx.algorithm.round_task(
            self.ctx.spec, self.ctx.plan, self.state, round_number=self.rnd.number
        )
        self.task = task
        await self.invite(task)
        if secure_sum(self.ctx.spec, summands=len(self.accepted)):
            total, encoding, summed = await self.secure_rounds(task.vector_length)
            # the dropouts' noise shares, so that the released noise does not depend on who
            # survived (docs/accounting.md, "(b) Dropouts and the honest fraction")
            total = restore_dropped_noise(
                total,
                encoding,
                accepted=len(self.accepted),
                summed=len(summed),
                stream=SystemRandomSource().stream("dropped-noise"),
            )
        else:
            # without secure aggregation, or one agent of a sample that must be released: the
            # agent's setup then says ``num_clients = 1`` and its noise carries the whole sum's
            total, encoding, summed = await self.plain_rounds(task.vector_length)
        return await self.finish(total, encoding, summed)

    async def noise_alone(self) -> RoundReport:
        """Release the empty sample as ``M(∅)``: the round's summed noise, drawn by the
        coordinator itself (CSPRNG), charged to the population like any other round."""
        ctx = self.ctx
        task = ctx.algorithm.round_task(
            ctx.spec, ctx.plan, self.state, round_number=self.rnd.number
        )
        self.task = task
        encoding = ctx.algorithm.noise_alone_encoding(ctx.spec, ctx.plan, task)
        await self._note_setup(
            secagg={"enabled": False, "num_clients": 0, "ring_bits": encoding.ring_bits},
            encoding=encoding.to_dict(),
            noise_alone=True,
        )
        await self.record("invitation", [], [], time.monotonic())
        await self.commit([])
        stream = SystemRandomSource().stream("noise-alone")
        total = encode(np.zeros(task.vector_length), config=encoding, stream=stream)
        return await self.finish(total, encoding, [])

    async def invite(self, task: RoundTask) -> None:
        ctx, number = self.ctx, self.rnd.number
        events = ctx.algorithm.invitation_events(
            ctx.spec, ctx.plan, round_number=number, population=self.population
        )
        invitation = pb.Invitation(
            header=self.channel.header(pb.STAGE_INVITATION),
            algorithm=ctx.spec.algorithm,
            job_name=ctx.spec.name,
            params_json=task.params.model_copy(update={"job_id": ctx.job_id}).model_dump_json(
                exclude_none=True
            ),
            privacy_events_json=json.dumps([event_to_json(e) for e in events]),
            model_version=task.model_version or 0,
            deadline_unix=time.time() + self.invitation_seconds(),
            expected_participants=len(self.rnd.invited),
        )
        started = time.monotonic()
        for agent_id in self.rnd.invited:
            self.send(agent_id, pb.CoordinatorMessage(invitation=invitation))
        answers: dict[str, bool] = {}
        declines: dict[str, str] = {}

        def handle(agent_id: str, message: pb.AgentMessage) -> None:
            if agent_id in answers:
                self.refuse(
                    agent_id,
                    MalformedMessage("the invitation was already answered"),
                    message.invitation_response.header,
                )
                return
            answers[agent_id] = message.invitation_response.accept
            if not message.invitation_response.accept:
                declines[agent_id] = message.invitation_response.reason[:DECLINE_REASON_CHARS]

        await self.channel.collect(
            deadline=self.deadline(self.invitation_seconds()),
            pending=lambda: set(self.rnd.invited) - set(answers),
            handle=handle,
        )
        self.accepted = sorted(a for a, ok in answers.items() if ok and a not in self.channel.gone)
        # what each decliner said (its local policy's rule first), for operators and reports
        self.noise = {**self.noise, "declined": dict(sorted(declines.items()))}
        await self.record("invitation", self.accepted, self.rnd.invited, started)
        self.rnd = await asyncio.to_thread(
            self.store.update_round, self.rnd.id, accepted=self.accepted, noise=self.noise
        )
        await self.hooks.at("invitations_closed", self.info)
        minimum = minimum_accepted(ctx.algorithm, ctx.spec, ctx.plan)
        if len(self.accepted) < minimum:
            raise _Aborted(
                f"{len(self.accepted)} of {len(self.rnd.invited)} invited clients accepted, "
                f"a round needs {minimum}"
            )

    def _encoding(self, min_survivors: int) -> EncodingConfig:
        if self.task is None:  # pragma: no cover - execute() sets it first
            raise RuntimeError("no round task")
        return self.ctx.algorithm.encoding(
            self.ctx.spec,
            self.ctx.plan,
            self.task,
            participants=len(self.accepted),
            min_survivors=min_survivors,
        )

    async def _note_setup(self, **values: Any) -> None:
        self.noise = {**self.noise, **values}
        self.rnd = await asyncio.to_thread(self.store.update_round, self.rnd.id, noise=self.noise)

    # -- secure aggregation ----------------------------------------------------------------------

    async def secure_rounds(
        self, vector_length: int
    ) -> tuple[np.ndarray, EncodingConfig, list[str]]:
        spec = self.ctx.spec
        n = len(self.accepted)
        try:
            probe = RoundParameters.choose(
                num_clients=n,
                vector_length=vector_length,
                ring_bits=64,
                corrupt_fraction=spec.secagg.corrupt_fraction,
                dropout_fraction=spec.secagg.dropout_fraction,
                model=_threat_model(spec.secagg.threat_model),
            )
            encoding = self._encoding(probe.min_survivors)
            params = RoundParameters(
                num_clients=n,
                degree=probe.degree,
                threshold=probe.threshold,
                ring_bits=encoding.ring_bits,
                vector_length=vector_length,
                min_survivors=probe.min_survivors,
                encoding=encoding,
            )
        except SecAggError as exc:
            raise _Aborted(f"no secure-aggregation parameters for {n} clients: {exc}") from exc
        await self._note_setup(
            secagg={
                "num_clients": n,
                "degree": params.degree,
                "threshold": params.threshold,
                "ring_bits": params.ring_bits,
                "vector_length": params.vector_length,
                "min_survivors": params.min_survivors,
                "threat_model": spec.secagg.threat_model,
            },
            encoding=encoding.to_dict(),
        )
        agents = self.accepted  # index i is agents[i]
        index = {a: i for i, a in enumerate(agents)}
        state: ServerState
        state, outbound = secagg_server.start_round(
            job_id=self.ctx.job_id, round=self.rnd.number, params=params
        )
        self.channel.open_stage(pb.STAGE_ADVERTISE_KEYS, session_id=state.ctx.session_id)
        stages = (
            ("advertise_keys", self.deadlines.advertise_keys),
            ("share_keys", self.deadlines.share_keys),
            ("masked_input", self.deadlines.masked_input + self.deadlines.training),
        )
        expected_before = set(agents)
        for name, seconds in stages:
            started = time.monotonic()
            for item in outbound:
                self.send(agents[item.recipient], wire.to_coordinator_message(item.message))
            state = await self._collect_secure(state, agents, index, params, seconds)
            state, outbound = await asyncio.to_thread(secagg_server.close_stage, state)
            answered = self._answered(state, name, agents)
            await self.record(name, answered, expected_before, started)
            expected_before = set(answered)
            await self.hooks.at(f"{name}_closed", self.info)
            if isinstance(state, ServerAborted):
                raise _Aborted(f"secure aggregation aborted at {name}: {state.reason}")
            if name != "masked_input":
                nxt = pb.STAGE_SHARE_KEYS if name == "advertise_keys" else pb.STAGE_MASKED_INPUT
                self.channel.open_stage(nxt)
        assert isinstance(state, ServerReadyToUnmask)
        summed = [agents[i] for i in sorted(state.a3)]
        # fixed with the ledger: how many dropped agents' noise shares the release will carry
        await self._note_setup(restored_noise_shares=n - len(summed))
        await self.commit(summed)
        # ledger rule 1: only now may the aggregate become computable
        started = time.monotonic()
        self.channel.open_stage(pb.STAGE_UNMASK)
        unmasking, outbound = await asyncio.to_thread(secagg_server.begin_unmask, state)
        for item in outbound:
            self.send(agents[item.recipient], wire.to_coordinator_message(item.message))
        collected = await self._collect_secure(
            unmasking, agents, index, params, self.deadlines.unmask
        )
        final, _ = await asyncio.to_thread(secagg_server.close_stage, collected)
        responders = [agents[i] for i in sorted(collected.survivors.unmask)]
        await self.record("unmask", responders, summed, started)
        await self.hooks.at("unmask_closed", self.info)
        if not isinstance(final, ServerCompleted):
            reason = final.reason if isinstance(final, ServerAborted) else type(final).__name__
            raise _Aborted(f"secure aggregation aborted at unmask: {reason}")
        return final.aggregate, encoding, summed

    @staticmethod
    def _answered(state: ServerState, stage: str, agents: Sequence[str]) -> list[str]:
        s = state.survivors
        ids = {"advertise_keys": s.a1, "share_keys": s.a2, "masked_input": s.a3}[stage]
        return [agents[i] for i in sorted(ids)]

    async def _collect_secure(
        self,
        state: ServerState,
        agents: Sequence[str],
        index: Mapping[str, int],
        params: RoundParameters,
        seconds: float,
    ) -> ServerState:
        assemblers: dict[int, wire.MaskedInputAssembler] = {}
        current = [state]
        # responses are added in batches (whatever arrived since the last one): adding them one
        # by one copies the state's collections per message, O(n²) per stage
        batch: list[tuple[int, Any, str, pb.RoundHeader]] = []

        def handle(agent_id: str, message: pb.AgentMessage) -> None:
            kind = message.WhichOneof("body")
            header = getattr(message, kind).header
            sender = index[agent_id]
            try:
                if kind == "masked_input":
                    if sender not in current[0].pending:
                        raise MalformedMessage(f"client {sender} was not asked for a masked input")
                    assembler = assemblers.setdefault(
                        sender,
                        wire.MaskedInputAssembler(
                            vector_length=params.vector_length, ring_bits=params.ring_bits
                        ),
                    )
                    response: ClientMessage | None = assembler.add(message.masked_input)
                    if response is None:
                        return
                    del assemblers[sender]
                else:
                    response = wire.from_agent_message(message)
            except (wire.WireError, SecAggError, RoundMessageError) as exc:
                if kind == "masked_input":
                    assemblers.pop(sender, None)
                refused = MalformedMessage(str(exc)) if isinstance(exc, wire.WireError) else exc
                self.refuse(agent_id, refused, header)
                return
            batch.append((sender, response, agent_id, header))
            # a decoded masked input is L ring words: bound what waits in memory
            if len(batch) >= (MASKED_BATCH if kind == "masked_input" else ANSWER_BATCH):
                flush()

        def flush() -> None:
            if not batch:
                return
            items = list(batch)
            batch.clear()
            current[0], rejected = secagg_server.receive_many(
                current[0], [(sender, response) for sender, response, _, _ in items]
            )
            if rejected:
                by_sender: dict[int, list[tuple[str, pb.RoundHeader]]] = {}
                for sender, _, agent_id, header in items:
                    by_sender.setdefault(sender, []).append((agent_id, header))
                for sender, exc in rejected:
                    agent_id, header = by_sender[sender].pop(0)
                    self.refuse(agent_id, exc, header)

        await self.channel.collect(
            deadline=self.deadline(seconds),
            pending=lambda: {agents[i] for i in current[0].pending},
            handle=handle,
            flush=flush,
        )
        flush()
        return current[0]

    # -- plain summation (secure aggregation disabled) ------------------------------------------

    async def plain_rounds(
        self, vector_length: int
    ) -> tuple[np.ndarray, EncodingConfig, list[str]]:
        n = len(self.accepted)
        encoding = self._encoding(1)
        nonce = os.urandom(32)
        if secure_sum(self.ctx.spec, summands=n):  # pragma: no cover - execute() routes
            raise RuntimeError(f"a plain round of a secure job sums one agent, not {n}")
        session_id = compute_session_id(job_id=self.ctx.job_id, round=self.rnd.number, nonce=nonce)
        await self._note_setup(
            secagg={"enabled": False, "num_clients": n, "ring_bits": encoding.ring_bits},
            encoding=encoding.to_dict(),
        )
        self.channel.open_stage(pb.STAGE_ADVERTISE_KEYS, session_id=session_id)
        started = time.monotonic()
        for i, agent_id in enumerate(self.accepted):
            setup = pb.SecAggSetup(
                client_index=i,
                num_clients=n,
                degree=0,
                threshold=0,
                ring_bits=encoding.ring_bits,
                vector_length=vector_length,
                min_survivors=1,
                encoding_json=encoding.to_json(),
                session_nonce=nonce,
            )
            request = pb.AdvertiseKeysRequest(
                header=self.channel.header(pb.STAGE_ADVERTISE_KEYS), setup=setup
            )
            self.send(agent_id, pb.CoordinatorMessage(advertise_keys=request))
        acked: set[str] = set()

        def ack(agent_id: str, message: pb.AgentMessage) -> None:
            keys = message.advertise_keys
            if agent_id in acked:
                self.refuse(agent_id, MalformedMessage("already acknowledged"), keys.header)
                return
            if keys.encryption_public_key or keys.masking_public_key or keys.signature:
                # a plain round exchanges no keys: an agent sending some runs another protocol
                self.refuse(
                    agent_id,
                    MalformedMessage("a plain-summation acknowledgement carries no keys"),
                    keys.header,
                )
                return
            acked.add(agent_id)

        await self.channel.collect(
            deadline=self.deadline(self.deadlines.advertise_keys),
            pending=lambda: set(self.accepted) - acked,
            handle=ack,
        )
        a1 = sorted(acked - self.channel.gone)
        await self.record("advertise_keys", a1, self.accepted, started)
        await self.hooks.at("advertise_keys_closed", self.info)
        if not a1:
            raise _Aborted("no client acknowledged the plain-summation setup")
        # ledger rule 1 without secure aggregation: each vector is readable the moment it
        # arrives, so everyone who will be asked for one is charged before anyone is asked
        await self.commit(a1)
        charged = frozenset(a1)
        started = time.monotonic()
        self.channel.open_stage(pb.STAGE_MASKED_INPUT)
        ask = pb.MaskedInputRequest(header=self.channel.header(pb.STAGE_MASKED_INPUT))
        for agent_id in a1:
            self.send(agent_id, pb.CoordinatorMessage(masked_input=ask))
        total = np.zeros(vector_length, dtype=np.uint64)
        assemblers: dict[str, wire.MaskedInputAssembler] = {}
        received: set[str] = set()

        def vector(agent_id: str, message: pb.AgentMessage) -> None:
            nonlocal total
            header = message.masked_input.header
            if agent_id not in charged:
                self.refuse(
                    agent_id,
                    MalformedMessage("this agent was not asked for a vector in this round"),
                    header,
                )
                return
            if agent_id in received:
                self.refuse(agent_id, MalformedMessage("masked input already received"), header)
                return
            assembler = assemblers.setdefault(
                agent_id,
                wire.MaskedInputAssembler(
                    vector_length=vector_length, ring_bits=encoding.ring_bits
                ),
            )
            try:
                response = assembler.add(message.masked_input)
            except wire.WireError as exc:
                assemblers.pop(agent_id, None)
                self.refuse(agent_id, MalformedMessage(str(exc)), header)
                return
            if response is not None:
                del assemblers[agent_id]
                total = total + response.masked_input  # uint64 wraps mod 2^64
                received.add(agent_id)

        await self.channel.collect(
            deadline=self.deadline(self.deadlines.masked_input + self.deadlines.training),
            pending=lambda: set(a1) - received,
            handle=vector,
        )
        summed = sorted(received)
        await self.record("masked_input", summed, a1, started)
        await self.hooks.at("masked_input_closed", self.info)
        if not summed:
            raise _Aborted("no vector arrived")
        if encoding.ring_bits < 64:
            total &= np.uint64((1 << encoding.ring_bits) - 1)
        return total, encoding, summed

    # -- commit, finish, abort -----------------------------------------------------------------

    async def commit(self, summed: Sequence[str]) -> None:
        ctx = self.ctx
        charges = ctx.algorithm.charges(
            ctx.spec,
            ctx.plan,
            round_number=self.rnd.number,
            population=self.population,
            participants=list(summed),
        )
        ledger = [store_charge(a, c) for a, c in sorted(charges.items())]
        try:
            result = await asyncio.to_thread(
                self.store.commit_round,
                self.rnd.id,
                ledger,
                enforce_budget=self.enforce_budgets,
                data_dependent_budget=self.data_dependent_budget,
            )
        except BudgetExceeded as exc:
            raise _Aborted(f"ledger commit refused: {exc}") from exc
        self.rnd = result.round
        self.committed = True
        await self.hooks.at("after_ledger_commit", self.info)

    async def finish(
        self, total: np.ndarray, encoding: EncodingConfig, summed: Sequence[str]
    ) -> RoundReport:
        ctx = self.ctx
        started = time.monotonic()
        aggregate = decode(total, config=encoding)
        outcome = await asyncio.to_thread(
            ctx.algorithm.finish_round,
            ctx.spec,
            ctx.plan,
            self.state,
            ctx.data,
            round_number=self.rnd.number,
            aggregate=aggregate,
            survivors=len(summed),
        )
        accuracy = outcome.metrics.get("accuracy")
        model = outcome.state.model if outcome.state.model != self.state.model else None
        await self.record("decode", summed, summed, started)
        self.rnd = await asyncio.to_thread(
            self.store.complete_round,
            self.rnd.id,
            accuracy=None if accuracy is None else min(1.0, max(0.0, float(accuracy))),
            model=model,
        )
        new_state = outcome.state
        if self.rnd.model_version is not None:
            new_state = CoordinatorState(
                model=outcome.state.model,
                model_version=self.rnd.model_version,
                details=outcome.state.details,
                blobs=outcome.state.blobs,
            )
        self._result(True, "round completed", self.rnd.model_version or 0)
        if self.metrics is not None:
            self.metrics.round_finished(ctx.job_id, True)
        await self.hooks.at("round_completed", self.info)
        return RoundReport(
            completed=True,
            round=self.rnd,
            state=new_state,
            metrics=dict(outcome.metrics),
            done=outcome.done,
        )

    def _result(self, completed: bool, message: str, version: int) -> None:
        result = pb.RoundResult(
            header=self.channel.header(pb.STAGE_RESULT),
            completed=completed,
            message=message,
            model_version=version,
        )
        for agent_id in self.accepted or self.rnd.invited:
            self.registry.send(agent_id, pb.CoordinatorMessage(result=result))

    async def abort(self, reason: str) -> RoundReport:
        rnd = await asyncio.to_thread(self.store.abort_round, self.rnd.id, reason=reason)
        self.rnd = rnd
        self._result(False, rnd.abort_reason or reason, 0)
        if self.metrics is not None:
            self.metrics.round_finished(self.ctx.job_id, False)
        return RoundReport(completed=False, reason=rnd.abort_reason or reason, round=rnd)
