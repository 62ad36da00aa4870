"""The round engine: the coordinator's adapter of the round driver (:mod:`dpfl.learning.rounds`)
to its agents' streams and its store, in the sequence of docs/architecture.md#a-round-over-the-wire.

The driver owns the steps and their order; this module carries them: invitations and stage
messages over the agents' streams, deadlines, and every step recorded in the store. Nothing that
makes the aggregate computable (an unmask request; without secure aggregation, any vector
request) happens before the ledger commit is durable (ledger rule 1); an abort before the commit
charges nothing, after it the charge stays. A cancelled engine writes nothing more. Rounds
without secure aggregation are docs/architecture.md#without-secure-aggregation-secaggenabled-false;
where the charge credits client sampling every sample is released
(docs/accounting.md#client-sampling-every-sample-is-released).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpfl.accounting import event_to_json
from dpfl.learning.algorithms.base import CoordinatorState
from dpfl.learning.rounds import (
    Acceptance,
    Commit,
    Invitation,
    RoundAborted,
    RoundEnd,
    RoundJob,
    Summation,
    Summed,
    SumSetup,
    run_round,
)
from dpfl.learning.rounds.state import Commitment
from dpfl.protos import secagg_wire as wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg.errors import SecAggError
from dpfl.secagg.randomness import SystemRandomSource
from dpfl.server.agent_protocol import MalformedMessage, error_message, error_reply
from dpfl.server.errors import BudgetExceeded
from dpfl.server.ledger_charges import store_charge
from dpfl.server.orchestrator.channel import RoundChannel, invitation_session_id
from dpfl.server.orchestrator.hooks import NO_HOOKS, FaultHooks, RoundPoint
from dpfl.server.orchestrator.sampling import attempt_sample
from dpfl.server.orchestrator.state import round_record, with_summation
from dpfl.server.orchestrator.wire_sum import sum_plainly, sum_securely
from dpfl.server.sessions import SessionRegistry
from dpfl.server.settings import StageDeadlines
from dpfl.server.store import AgentStatus, ProtectedUnit, Round, RoundSetup, Store

__all__ = ["RoundEngine", "RoundReport"]


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


#: Characters kept of an agent's decline reason (the agent's text, bounded in the round record).
DECLINE_REASON_CHARS = 300


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

    def _population(self, ctx: RoundJob, number: int) -> tuple[list[str], list[str]]:
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
        charge = ctx.coordinator.round_charge(round_number=number, population=members)
        charges = charge.charges(members)
        events = {a: c.event for a, c in charges.items()}
        units = {c.unit for c in charges.values()}
        checks = self.store.check_budgets(
            events,
            data_dependent=self.data_dependent_budget,
            job_id=ctx.job_id,
            unit=ProtectedUnit(units.pop()) if len(units) == 1 else ProtectedUnit.AGENT,
        )
        excluded = sorted(a for a, c in checks.items() if not c.allowed)
        return [a for a in members if a not in excluded], excluded

    async def run(self, ctx: RoundJob, *, number: int, state: CoordinatorState) -> RoundReport:
        """Run one attempt at round ``number`` from ``state``: sample, record the attempt, then
        the driver's steps over this coordinator's streams.

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
            ctx.coordinator,
            round_number=number,
            population=population,
            previous=previous,
        )
        record = round_record(ctx.plan, state, sample, population, excluded)
        rnd = await asyncio.to_thread(
            self.store.start_round, ctx.job_id, number, invited=list(sample.invited), setup=record
        )
        run = WireRound(self, ctx, rnd, record)
        self.registry.add_route(run.channel)
        try:
            await self.hooks.at("round_started", run.info)
            return await run.drive(state, population)
        except RoundAborted as exc:
            return await run.abort(exc.reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await run.abort(f"internal error: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.registry.remove_route(run.channel)


class WireRound:
    """One attempt in flight, as the driver's cohort and ledger: the invitation and the
    summation carried over the round's channel, every step recorded in the store."""

    def __init__(self, engine: RoundEngine, ctx: RoundJob, rnd: Round, record: RoundSetup):
        self.engine, self.store, self.registry = engine, engine.store, engine.registry
        self.deadlines, self.hooks = engine.deadlines, engine.hooks
        self.ctx, self.rnd, self.setup = ctx, rnd, record
        self.info = RoundPoint(
            job_id=ctx.job_id, round=rnd.number, attempt=rnd.attempt, round_id=rnd.id
        )
        self.accepted: tuple[str, ...] = ()
        self.channel = RoundChannel(
            job_id=ctx.job_id,
            number=rnd.number,
            participants=list(rnd.invited),
            limits=self.registry.limits,
        )
        self.channel.open_stage(
            pb.STAGE_INVITATION, session_id=invitation_session_id(ctx.job_id, rnd.id)
        )
        self.loop = asyncio.get_running_loop()

    async def drive(self, state: CoordinatorState, population: Sequence[str]) -> RoundReport:
        """The driver's steps over this attempt's channel, and how they ended."""
        end = await run_round(
            self.ctx,
            number=self.rnd.number,
            state=state,
            population=population,
            invited=self.rnd.invited,
            cohort=self,
            ledger=self,
            noise=SystemRandomSource().stream,
        )
        if end.outcome is None:
            return await self.skipped(end.reason)
        return await self.finish(end, state)

    # -- transport helpers ---------------------------------------------------------------------

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

    def deadline(self, seconds: float) -> float:
        return self.loop.time() + seconds

    async def record(
        self, stage: str, survivors: Collection[str], expected: Collection[str], started: float
    ) -> None:
        """Record a closed stage: who answered, who of ``expected`` dropped, how long it took."""
        seconds = max(0.0, time.monotonic() - started)
        self.rnd = await asyncio.to_thread(
            self.store.record_stage,
            self.rnd.id,
            stage,
            survivors=sorted(survivors),
            dropped=sorted(set(expected) - set(survivors)),
            seconds=seconds,
        )
        if self.engine.metrics is not None:
            self.engine.metrics.stage_latency(stage, seconds)

    async def _save(self, record: RoundSetup) -> None:
        self.setup = record
        self.rnd = await asyncio.to_thread(self.store.update_round, self.rnd.id, setup=record)

    # -- the driver's cohort and ledger --------------------------------------------------------

    async def invite(self, invitation: Invitation) -> Acceptance:
        ctx, task = self.ctx, invitation.task
        message = pb.Invitation(
            header=self.channel.header(pb.STAGE_INVITATION),
            algorithm=ctx.spec.algorithm,
            job_name=ctx.spec.name,
            params_json=task.params.model_copy(update={"job_id": ctx.job_id}).model_dump_json(
                exclude_none=True
            ),
            privacy_events_json=json.dumps([event_to_json(e) for e in invitation.events]),
            model_version=task.model_version or 0,
            deadline_unix=time.time() + self.invitation_seconds(),
            expected_participants=len(invitation.invited),
        )
        started = time.monotonic()
        for agent_id in invitation.invited:
            self.send(agent_id, pb.CoordinatorMessage(invitation=message))
        answers: dict[str, bool] = {}
        declines: dict[str, str] = {}

        def handle(agent_id: str, message: pb.AgentMessage) -> None:
            response = message.invitation_response
            if agent_id in answers:
                refused = MalformedMessage("the invitation was already answered")
                self.refuse(agent_id, refused, response.header)
                return
            answers[agent_id] = response.accept
            if not response.accept:
                declines[agent_id] = response.reason[:DECLINE_REASON_CHARS]

        await self.channel.collect(
            deadline=self.deadline(self.invitation_seconds()),
            pending=lambda: set(invitation.invited) - set(answers),
            handle=handle,
        )
        gone = self.channel.gone
        self.accepted = tuple(sorted(a for a, ok in answers.items() if ok and a not in gone))
        # what each decliner said (its local policy's rule first), for operators and reports
        self.setup = self.setup.model_copy(update={"declined": dict(sorted(declines.items()))})
        await self.record("invitation", self.accepted, invitation.invited, started)
        self.rnd = await asyncio.to_thread(
            self.store.update_round, self.rnd.id, accepted=list(self.accepted), setup=self.setup
        )
        await self.hooks.at("invitations_closed", self.info)
        return Acceptance(self.accepted)

    async def set_up(self, setup: SumSetup) -> None:
        await self._save(with_summation(self.setup, setup))
        if setup.kind is Summation.NOISE_ALONE:
            await self.record("invitation", [], [], time.monotonic())  # nobody was invited

    async def sum(self, setup: SumSetup, commit: Commit) -> Summed:
        if setup.kind is Summation.SECURE:
            return await sum_securely(self, setup, commit)
        return await sum_plainly(self, setup, commit)

    async def commit(self, commitment: Commitment) -> None:
        if commitment.restored_noise_shares is not None:
            restored = commitment.restored_noise_shares
            await self._save(self.setup.model_copy(update={"restored_noise_shares": restored}))
        own = commitment.own_noise_fraction
        ledger = [
            store_charge(a, c, own_noise_fraction=own)
            for a, c in sorted(commitment.charges.items())
        ]
        try:
            result = await asyncio.to_thread(
                self.store.commit_round,
                self.rnd.id,
                ledger,
                enforce_budget=self.engine.enforce_budgets,
                data_dependent_budget=self.engine.data_dependent_budget,
            )
        except BudgetExceeded as exc:
            raise RoundAborted(f"ledger commit refused: {exc}") from exc
        self.rnd = result.round
        await self.hooks.at("after_ledger_commit", self.info)

    # -- the round's end -----------------------------------------------------------------------

    async def finish(self, end: RoundEnd, before: CoordinatorState) -> RoundReport:
        """Store the released round: its decode stage, its model version, its result."""
        assert end.outcome is not None
        outcome = end.outcome
        accuracy = outcome.metrics.get("accuracy")
        model = outcome.state.model if outcome.state.model != before.model else None
        await self.record("decode", end.summed, (), time.monotonic() - end.finish_seconds)
        self.rnd = await asyncio.to_thread(
            self.store.complete_round,
            self.rnd.id,
            accuracy=None if accuracy is None else min(1.0, max(0.0, float(accuracy))),
            model=model,
        )
        state = outcome.state
        if self.rnd.model_version is not None:
            state = CoordinatorState(
                model=state.model,
                model_version=self.rnd.model_version,
                details=state.details,
                blobs=state.blobs,
            )
        self._result(True, "round completed", self.rnd.model_version or 0)
        if self.engine.metrics is not None:
            self.engine.metrics.round_finished(self.ctx.job_id, True)
        await self.hooks.at("round_completed", self.info)
        return RoundReport(
            completed=True,
            round=self.rnd,
            state=state,
            metrics=dict(outcome.metrics),
            done=outcome.done,
        )

    async def skipped(self, reason: str) -> RoundReport:
        """A sample too small to release: nothing was sent or charged."""
        rnd = await asyncio.to_thread(self.store.abort_round, self.rnd.id, reason=reason)
        return RoundReport(completed=False, reason=reason, round=rnd, skipped=True)

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
        if self.engine.metrics is not None:
            self.engine.metrics.round_finished(self.ctx.job_id, False)
        return RoundReport(completed=False, reason=rnd.abort_reason or reason, round=rnd)
