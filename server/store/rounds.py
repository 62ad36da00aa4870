"""Rounds and the ledger commit: the part of the store the orchestrator drives.

An attempt goes ``running → committed → completed``, or to ``aborted``. ``commit_round`` charges
every client whose input was received, in one transaction, before the aggregate can be computed;
a committed charge is never undone; a repeated commit with the same charges is a no-op; a
restarted round is a new attempt, charged again. The rules and why:
docs/architecture.md#round-attempts-in-the-store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpfl.accounting.history import ONE_JOB, EventMultiset, history_figure, history_figures
from dpfl.server.errors import (
    AlreadyExists,
    BudgetExceeded,
    Conflict,
    InvalidInput,
    InvalidTransition,
)
from dpfl.server.store.core import (
    StoreCore,
    check_count,
    check_id,
    check_ids,
    check_json_object,
    check_number,
    check_text,
)
from dpfl.server.store.ledger import (
    CurveSum,
    HistoryGroup,
    PreparedCharge,
    canonical_json,
    evaluate_budget,
    history_of,
    prepare_charges,
    total,
)
from dpfl.server.store.records import (
    Agent,
    Budget,
    BudgetCheck,
    Charge,
    CommitResult,
    Job,
    JobStatus,
    LedgerEntry,
    Round,
    RoundStatus,
)
from dpfl.server.store.round_setup import RoundSetup
from dpfl.server.store.tx import NewRound, StoreTx

__all__ = ["CHARGED_STAGES", "STAGES", "RoundsMixin"]

#: The stage names of a round, in order (the wire protocol's stages plus local work).
STAGES = (
    "invitation",
    "download",
    "training",
    "advertise_keys",
    "share_keys",
    "masked_input",
    "consistency",  # malicious-secure rounds only
    "unmask",
    "decode",
)
#: Stages whose survivors contributed to the aggregate: they must have been charged.
CHARGED_STAGES = ("masked_input", "unmask")
_UNFINISHED = (RoundStatus.RUNNING, RoundStatus.COMMITTED)


def _checked(setup: RoundSetup) -> RoundSetup:
    """Raises InvalidInput: a record that is not JSON with finite numbers (a NaN in a plan)."""
    check_json_object(setup.to_json(), "round setup")
    return setup


def _identity(entry: LedgerEntry) -> tuple[Any, ...]:
    dd = entry.data_dependent_event
    return (
        entry.agent_id,
        entry.unit.value,
        entry.approximate,
        entry.secure_aggregation,
        entry.honest_fraction,
        canonical_json(entry.event),
        None if dd is None else canonical_json(dd),
        entry.own_noise_fraction,
    )


#: How often a commit recomputes its candidate figures outside the transaction when a charged
#: client's ledger moved between reading it and writing (another commit charged it meanwhile);
#: after that it computes them inside, under the clients' row locks, which always completes.
COMMIT_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The state of the charged clients that a commit's figures depend on: the job, their
    budgets, their running sums and their history groups (compared again inside the write)."""

    job_id: str
    algorithm: str
    delta: float
    budgets: tuple[tuple[str, Budget | None], ...]
    groups: dict[str, list[HistoryGroup]]
    #: the running sums by value: each is read by its own statement, and on a database that
    #: gives every statement a fresh view (PostgreSQL's READ COMMITTED) a commit landing
    #: between two reads leaves the groups new and the sums old
    sum_keys: tuple[tuple[str, str, int, int, bytes, bytes], ...]
    sums: dict[str, list[CurveSum]] = field(compare=False)
    agents: dict[str, Agent] = field(compare=False)


def _snapshot(tx: StoreTx, job: Job, ids: Sequence[str]) -> _Snapshot:
    agents = tx.get_agents(ids)
    sums: dict[str, list[CurveSum]] = {a: [] for a in ids}
    for s in tx.curve_sums(ids):
        sums[s.agent_id].append(s)
    groups: dict[str, list[HistoryGroup]] = {a: [] for a in ids}
    for g in tx.history_groups(ids):
        groups[g.agent_id].append(g)
    budgets = tuple((a, agents[a].budget if a in agents else None) for a in ids)
    keys = tuple(
        (
            s.agent_id,
            s.job_id,
            s.entries,
            s.data_dependent_entries,
            np.asarray(s.curve).tobytes(),
            np.asarray(s.data_dependent_curve).tobytes(),
        )
        for a in ids
        for s in sums[a]
    )
    return _Snapshot(job.id, job.algorithm, job.delta, budgets, groups, keys, sums, agents)


@dataclass(frozen=True, slots=True)
class _Figures:
    """A commit's candidate figures: each charged client's budget check and the round's ε (the
    largest job figure among the charged clients after the charge)."""

    checks: dict[str, BudgetCheck]
    round_epsilon: float


def _candidates(
    seen: _Snapshot, prepared: Sequence[PreparedCharge], enforce: bool, data_dependent: bool
) -> _Figures:
    """The figures of every charged client with its new entry, computed outside any
    transaction (a PLD takes far longer than a write should hold locks); clients that share a
    history and charge share one computation (``history_figure`` is cached)."""
    _prefetch(seen, prepared, enforce)
    checks: dict[str, BudgetCheck] = {}
    worst = 0.0
    for p in prepared:
        relation = p.relation(seen.algorithm)
        groups = seen.groups.get(p.agent_id, [])
        if enforce:
            dd = (total(seen.sums[p.agent_id])[1], p.curve) if data_dependent else None
            agent = seen.agents.get(p.agent_id)
            if agent is None:
                continue  # an unknown client: the write refuses the commit, naming it
            checks[p.agent_id] = evaluate_budget(
                agent,
                history_of(groups),
                (relation, p.event_text),
                data_dependent=dd,
            )
        own = [g for g in groups if g.job_id == seen.job_id]
        job_history = history_of(own, relation=ONE_JOB).plus(ONE_JOB, p.event_text)
        worst = max(worst, history_figure(job_history, seen.delta).epsilon)
    return _Figures(checks, worst)


def _prefetch(seen: _Snapshot, prepared: Sequence[PreparedCharge], enforce: bool) -> None:
    """Compute the distinct figures that :func:`_candidates` will ask for, two at a time."""
    wanted: set[tuple[EventMultiset, float]] = set()
    for p in prepared:
        relation = p.relation(seen.algorithm)
        groups = seen.groups.get(p.agent_id, [])
        agent = seen.agents.get(p.agent_id)
        if enforce and agent is not None and agent.budget is not None:
            history = history_of(groups)
            wanted.add((history, agent.budget.delta))
            wanted.add((history.plus(relation, p.event_text), agent.budget.delta))
        own = [g for g in groups if g.job_id == seen.job_id]
        job_history = history_of(own, relation=ONE_JOB).plus(ONE_JOB, p.event_text)
        wanted.add((job_history, seen.delta))
    history_figures(wanted)


def _refuse(over: Sequence[BudgetCheck]) -> None:
    """Raises BudgetExceeded naming every client over its budget."""
    detail = ", ".join(
        f"{c.agent_id!r} (ε {c.epsilon_after:.4g} > {c.budget.epsilon:g} at δ "
        f"{c.budget.delta:g}, {c.method})"
        for c in over
        if c.budget is not None and c.epsilon_after is not None
    )
    raise BudgetExceeded(
        f"charging this round would exceed the budget of {detail}",
        clients=tuple(c.agent_id for c in over),
    )


class RoundsMixin(StoreCore):
    def start_round(
        self,
        job_id: str,
        number: int,
        *,
        invited: Iterable[str] = (),
        setup: RoundSetup | None = None,
    ) -> Round:
        """Begin an attempt at round ``number`` of a running job.

        The first attempt of a number is attempt 1; after an aborted attempt the next one is
        numbered on. Call :meth:`abort_interrupted_rounds` at start-up before redoing a round.

        Raises:
            NotFound: no such job.
            InvalidTransition: the job is not running.
            Conflict: an attempt of this round is still running or committed.
            AlreadyExists: this round number was already completed.
        """
        number = check_count(number, "round number")
        invited_ids = check_ids(invited, "invited")
        record = _checked(setup or RoundSetup.empty())
        with self._transaction(write=True) as tx:
            job = self._job_of(tx, job_id, lock=True)
            if job.status != JobStatus.RUNNING:
                raise InvalidTransition(
                    f"job {job_id!r} is {job.status.value}; rounds start only while it runs"
                )
            self._existing_agents(tx, invited_ids)
            previous = tx.rounds_of_job(job_id, number)
            for rnd in previous:
                if rnd.status in _UNFINISHED:
                    raise Conflict(
                        f"round {number} of job {job_id!r} has an unfinished attempt "
                        f"{rnd.attempt} ({rnd.status.value}); abort it first"
                    )
                if rnd.status == RoundStatus.COMPLETED:
                    raise AlreadyExists(f"round {number} of job {job_id!r} is already completed")
            attempt = max((r.attempt for r in previous), default=0) + 1
            return tx.insert_round(
                NewRound(job_id, number, attempt, self._now(), invited_ids, record)
            )

    def get_round(self, round_id: int) -> Round:
        """Raises: NotFound."""
        with self._transaction(write=False) as tx:
            return self._round_of(tx, round_id)

    def list_rounds(self, job_id: str, *, number: int | None = None) -> list[Round]:
        """Every attempt of every round of a job, by (number, attempt).

        Raises:
            NotFound: no such job.
            InvalidInput: a number that is not an integer in [0, 2**31 - 1].
        """
        if number is not None:
            number = check_count(number, "round number")
        with self._transaction(write=False) as tx:
            self._job_of(tx, job_id)
            return tx.rounds_of_job(job_id, number)

    def update_round(
        self,
        round_id: int,
        *,
        invited: Iterable[str] | None = None,
        accepted: Iterable[str] | None = None,
        setup: RoundSetup | None = None,
    ) -> Round:
        """Record who was invited and who accepted, and the attempt's setup, before the commit.

        Raises:
            NotFound: no such round or agent.
            InvalidTransition: the round is no longer running.
            InvalidInput: ``accepted`` not a subset of ``invited``.
        """
        with self._transaction(write=True) as tx:
            rnd = self._round_of(tx, round_id, lock=True)
            if rnd.status != RoundStatus.RUNNING:
                raise InvalidTransition(
                    f"round {round_id} is {rnd.status.value}; participants and setup are fixed "
                    "at the ledger commit"
                )
            new_invited = rnd.invited if invited is None else check_ids(invited, "invited")
            new_accepted = rnd.accepted if accepted is None else check_ids(accepted, "accepted")
            self._existing_agents(tx, (*new_invited, *new_accepted))
            stray = set(new_accepted) - set(new_invited)
            if stray:
                raise InvalidInput(f"accepted agents that were not invited: {sorted(stray)}")
            rnd = replace(
                rnd,
                invited=new_invited,
                accepted=new_accepted,
                setup=rnd.setup if setup is None else _checked(setup),
            )
            tx.update_round(rnd)
        return rnd

    def record_stage(
        self,
        round_id: int,
        stage: str,
        *,
        survivors: Iterable[str],
        dropped: Iterable[str] = (),
        seconds: float,
    ) -> Round:
        """Record a stage's outcome: who answered, who dropped, how long it took.

        Raises:
            NotFound: no such round.
            InvalidInput: an unknown stage, a client both surviving and dropped.
            InvalidTransition: the round is completed or aborted.
            Conflict: after the commit, a survivor of a charged stage that was not charged.
        """
        if stage not in STAGES:
            raise InvalidInput(f"unknown stage {stage!r} (expected one of {', '.join(STAGES)})")
        alive = check_ids(survivors, "survivors")
        gone = check_ids(dropped, "dropped")
        if set(alive) & set(gone):
            raise InvalidInput(
                f"clients both surviving and dropped: {sorted(set(alive) & set(gone))}"
            )
        seconds = check_number(seconds, "seconds", minimum=0.0)
        with self._transaction(write=True) as tx:
            rnd = self._round_of(tx, round_id, lock=True)
            if rnd.status not in _UNFINISHED:
                raise InvalidTransition(f"round {round_id} is {rnd.status.value}")
            if rnd.status == RoundStatus.COMMITTED and stage in CHARGED_STAGES:
                charged = tx.charged_agents(round_id)
                uncharged = sorted(set(alive) - charged)
                if uncharged:
                    raise Conflict(
                        f"round {round_id}: {stage} survivors {uncharged} were not charged at "
                        "the ledger commit"
                    )
            rnd = replace(
                rnd,
                survivors={**rnd.survivors, stage: alive},
                dropped={**rnd.dropped, stage: gone},
                stage_seconds={**rnd.stage_seconds, stage: seconds},
            )
            tx.update_round(rnd)
        return rnd

    def commit_round(
        self,
        round_id: int,
        charges: Sequence[Charge],
        *,
        enforce_budget: bool = True,
        data_dependent_budget: bool = False,
    ) -> CommitResult:
        """Charge a round to the ledger and mark it committed, atomically (see the module doc).

        Args:
            round_id: a running round (or one already committed with these same charges).
            charges: one per affected client (DP-FedAvg: every member of the population; voting
                and DP-FedSGD: the participants), at least one.
            enforce_budget: refuse the whole commit when a client would exceed its budget; the
                coordinator then aborts the round without unmasking. False charges anyway.
            data_dependent_budget: measure existing spending with the data-dependent curves
                (the operator's opt-in); new charges always count with their guaranteed curve.

        Returns:
            The committed round (its ``epsilon`` is the largest per-job ε at the job's δ among
            the charged clients) and the entries; ``replayed`` when nothing new was written.

        Raises:
            InvalidInput: a bad or duplicated charge, none at all, or one missing for a client
                whose masked input was received.
            NotFound: no such round or agent.
            InvalidTransition: the round is completed/aborted without a commit.
            Conflict: the round was already committed with different charges.
            BudgetExceeded: (with ``enforce_budget``) ``clients`` names who would exceed.
        """
        if not isinstance(charges, Sequence) or not charges:
            raise InvalidInput("a round that releases an aggregate charges at least one client")
        prepared = prepare_charges(charges)
        rule = (enforce_budget, data_dependent_budget)
        for _ in range(COMMIT_ATTEMPTS):
            seen = self._commit_snapshot(round_id, prepared)
            figures = _candidates(seen, prepared, *rule)
            result = self._commit_write(round_id, prepared, rule, (seen, figures))
            if result is not None:
                return result
        # the clients' ledgers kept moving (other jobs charging them): compute under the locks
        result = self._commit_write(round_id, prepared, rule, None)
        assert result is not None
        return result

    def _commit_snapshot(self, round_id: int, prepared: Sequence[PreparedCharge]) -> _Snapshot:
        """What the candidate figures are computed from, read in its own transaction."""
        ids = sorted(p.agent_id for p in prepared)
        with self._transaction(write=False) as tx:
            rnd = self._round_of(tx, round_id)
            job = self._job_of(tx, rnd.job_id)
            return _snapshot(tx, job, ids)

    def _commit_write(
        self,
        round_id: int,
        prepared: Sequence[PreparedCharge],
        rule: tuple[bool, bool],
        candidate: tuple[_Snapshot, _Figures] | None,
    ) -> CommitResult | None:
        """The commit's transaction: check the candidate figures against the budgets and write,
        or None (nothing written) when a charged client's state moved since the candidate's
        snapshot. Without a candidate the figures are computed here, under the clients' locks.
        ``rule``: (enforce the budgets, with the data-dependent curves)."""
        with self._transaction(write=True) as tx:
            rnd = self._round_of(tx, round_id, lock=True)
            if rnd.committed_at is not None:
                return self._replay(tx, rnd, prepared)
            if rnd.status != RoundStatus.RUNNING:
                raise InvalidTransition(
                    f"round {round_id} is {rnd.status.value}; only a running round is committed"
                )
            contributed = rnd.survivors.get("masked_input")
            if contributed is None:
                # a round without secure aggregation commits before it asks anyone for a vector:
                # those who acknowledged its setup are the ones who will be asked
                contributed = rnd.survivors.get("advertise_keys", rnd.accepted)
            missing = sorted(set(contributed) - {p.agent_id for p in prepared})
            if missing:
                raise InvalidInput(
                    f"round {round_id}: no charge for clients whose input was received: {missing}"
                )
            job = self._job_of(tx, rnd.job_id)
            ids = sorted(p.agent_id for p in prepared)
            agents = tx.get_agents(ids, lock=True)  # serialises concurrent charges per client
            absent = [a for a in ids if a not in agents]
            if absent:
                raise InvalidInput(f"charges for unknown agents: {absent}")
            now_seen = _snapshot(tx, job, ids)
            if candidate is None:
                figures = _candidates(now_seen, prepared, *rule)
            elif now_seen != candidate[0]:
                return None  # another commit charged one of them (or a budget changed): retry
            else:
                figures = candidate[1]
            over = [c for c in figures.checks.values() if not c.allowed]
            if over:
                _refuse(over)
            # the sums read under the clients' locks: the ones this write adds to
            own = {s.agent_id: s for a in ids for s in now_seen.sums[a] if s.job_id == job.id}
            updated = [
                own.get(p.agent_id, CurveSum.zero(p.agent_id, job.id)).plus(p) for p in prepared
            ]
            now = self._now()
            entries = tx.insert_entries(rnd, job.algorithm, prepared, now)
            tx.put_curve_sums(updated)
            tx.add_history(
                [
                    HistoryGroup(p.agent_id, job.id, p.relation(job.algorithm), p.event_text, 1)
                    for p in prepared
                ]
            )
            rnd = replace(
                rnd, status=RoundStatus.COMMITTED, committed_at=now, epsilon=figures.round_epsilon
            )
            tx.update_round(rnd)
        return CommitResult(rnd, tuple(entries), replayed=False)

    @staticmethod
    def _replay(tx: StoreTx, rnd: Round, prepared: Sequence[PreparedCharge]) -> CommitResult:
        existing = tx.entries(round_id=rnd.id)
        if sorted(map(_identity, existing)) != sorted(p.identity() for p in prepared):
            raise Conflict(
                f"round {rnd.id} (round {rnd.number}, attempt {rnd.attempt} of job "
                f"{rnd.job_id!r}) is already committed with different charges"
            )
        return CommitResult(rnd, tuple(existing), replayed=True)

    def complete_round(
        self, round_id: int, *, accuracy: float | None = None, model: bytes | None = None
    ) -> Round:
        """Finish a committed round, storing the new model version in the same transaction.

        Raises:
            NotFound: no such round.
            InvalidTransition: the round is not committed (a round is charged before it ends).
            InvalidInput: an accuracy outside [0, 1].
        """
        if accuracy is not None:
            accuracy = check_number(accuracy, "accuracy", minimum=0.0)
            if accuracy > 1:
                raise InvalidInput(f"accuracy must be in [0, 1], got {accuracy!r}")
        with self._transaction(write=True) as tx:
            rnd = self._round_of(tx, round_id, lock=True)
            if rnd.status != RoundStatus.COMMITTED:
                raise InvalidTransition(
                    f"round {round_id} is {rnd.status.value}; only a committed round completes"
                )
            version = None
            if model is not None:
                self._job_of(tx, rnd.job_id, lock=True)
                version = self._insert_model(tx, rnd.job_id, model, rnd.id).version
            rnd = replace(
                rnd,
                status=RoundStatus.COMPLETED,
                finished_at=self._now(),
                accuracy=accuracy,
                model_version=version,
            )
            tx.update_round(rnd)
        return rnd

    def abort_round(self, round_id: int, *, reason: str) -> Round:
        """Give a round up. A committed round keeps its charge; aborting twice is a no-op.

        Raises:
            NotFound: no such round.
            InvalidTransition: the round is completed.
        """
        reason = check_text(reason, "reason")
        with self._transaction(write=True) as tx:
            rnd = self._round_of(tx, round_id, lock=True)
            if rnd.status == RoundStatus.ABORTED:
                return rnd
            if rnd.status == RoundStatus.COMPLETED:
                raise InvalidTransition(f"round {round_id} is completed and cannot be aborted")
            rnd = self._aborted(rnd, reason)
            tx.update_round(rnd)
        return rnd

    def _aborted(self, rnd: Round, reason: str) -> Round:
        if rnd.status == RoundStatus.COMMITTED:
            reason = f"{reason} (aborted after the ledger commit: the charge stays)"
        return replace(
            rnd, status=RoundStatus.ABORTED, finished_at=self._now(), abort_reason=reason
        )

    def interrupted_rounds(self, *, job_id: str | None = None) -> list[Round]:
        """Rounds left running or committed (after a crash, before recovery)."""
        if job_id is not None:
            check_id(job_id, "job id")
        with self._transaction(write=False) as tx:
            rounds = tx.rounds_with_status(_UNFINISHED)
        return [r for r in rounds if job_id is None or r.job_id == job_id]

    def abort_interrupted_rounds(self, *, reason: str = "coordinator restarted") -> list[Round]:
        """Abort every unfinished round in one transaction (call once at coordinator start-up).

        Running attempts were never charged and are dropped; committed ones keep their charge.
        """
        reason = check_text(reason, "reason")
        with self._transaction(write=True) as tx:
            out = []
            for rnd in tx.rounds_with_status(_UNFINISHED):
                locked = self._round_of(tx, rnd.id, lock=True)
                if locked.status in _UNFINISHED:
                    aborted = self._aborted(locked, reason)
                    tx.update_round(aborted)
                    out.append(aborted)
        return out
