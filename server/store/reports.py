"""Reading the ledger: ε per client and per job, budget checks, and verification.

Every ε is recomputed on demand, never stored, and ``verify_ledger`` recomputes every cached curve
and running sum. A client's ε in one job is the smaller of its RDP figure and, where every event
has one, its tight figure; totals, budgets and history stay RDP
(docs/accounting.md#which-bound-each-ledger-figure-is). Budgets use the guaranteed curves only.
A figure that adds up at least one approximate entry (``Charge.approximate``: not a proven upper
bound for the noise used) is itself flagged ``approximate``, whichever method gave it.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from dpfl.accounting import (
    AccountingError,
    ComposedEvent,
    DpEvent,
    EpsilonReport,
    SelfComposedEvent,
    compute_epsilon,
    event_from_json,
    supports_tight,
)
from dpfl.server.errors import LedgerIntegrityError
from dpfl.server.store.core import StoreCore
from dpfl.server.store.ledger import (
    Curve,
    CurveSum,
    canonical_json,
    check_delta,
    epsilon_of,
    evaluate_budget,
    orders_fingerprint,
    prepare_charges,
    recompute,
    same_curve,
    total,
)
from dpfl.server.store.records import (
    Agent,
    BudgetCheck,
    Charge,
    ClientBudget,
    EventReport,
    JobEpsilon,
    LedgerEntry,
    Mismatch,
    ProtectedUnit,
    VerifyReport,
)
from dpfl.server.store.relations import replace_one_curve
from dpfl.server.store.tx import EntryKey, StoreTx

__all__ = ["DEFAULT_REPORT_DELTA", "ORDERS_META_KEY", "ReportsMixin"]

#: δ of a report when neither the caller nor the client's budget gives one.
DEFAULT_REPORT_DELTA = 1e-5
#: Metadata key holding the fingerprint of the order grid the cached curves are on.
ORDERS_META_KEY = "rdp_orders_sha256"
RDP_METHOD = "rdp"


def _array(values: Sequence[float]) -> Curve:
    return np.asarray(values, dtype=np.float64)


#: A multiset of stored events: (canonical event JSON, count), sorted.
Composition = tuple[tuple[str, int], ...]


def _composition(entries: Iterable[LedgerEntry]) -> Composition:
    counts: dict[str, int] = defaultdict(int)
    for e in entries:
        counts[canonical_json(e.event)] += 1
    return tuple(sorted(counts.items()))


@functools.lru_cache(maxsize=1024)
def _tight_report(composition: Composition, delta: float) -> EpsilonReport | None:
    """``compute_epsilon`` of the events composed, or None when one of them has no tight path.

    Identical events become one self-composition, which the PLD composes by repeated squaring.
    """
    if not composition:
        return None
    try:
        events = tuple(SelfComposedEvent(event_from_json(json.loads(k)), n) for k, n in composition)
        event: DpEvent = events[0] if len(events) == 1 else ComposedEvent(events)
        if not supports_tight(event):
            return None
        return compute_epsilon(event, delta=delta, tight=True)
    except AccountingError:
        return None


def _job_epsilon(
    job_id: str,
    s: CurveSum,
    entries: Sequence[LedgerEntry] | None,
    delta: float,
    approximate: bool,
) -> JobEpsilon:
    """One job's figure: min(RDP of the summed curve, tight of the same events) when given;
    ``approximate``: whether one of the job's entries (for this client) is."""
    rdp_eps, order = epsilon_of(s.curve, delta)
    dd_eps = epsilon_of(s.data_dependent_curve, delta)[0] if s.data_dependent_entries else None
    eps, method = rdp_eps, RDP_METHOD
    if entries:
        report = _tight_report(_composition(entries), delta)
        if report is not None and report.epsilon < eps:
            eps, method = float(report.epsilon), str(report.method)
    return JobEpsilon(job_id, eps, order, s.entries, dd_eps, method, rdp_eps, approximate)


def _approximate_rounds(keys: Sequence[EntryKey]) -> set[int]:
    """The rounds (of one job, ``keys`` being all its entries) whose ε figure adds up an
    approximate entry: a round's ε is its charged clients' job totals right after the charge,
    so it is approximate when one of those clients had an approximate entry in the job up to
    and including this round (entry ids grow with each commit of a client)."""
    first_approximate: dict[str, int] = {}
    by_round: dict[int, list[EntryKey]] = defaultdict(list)
    for k in keys:
        by_round[k.round_id].append(k)
        if k.approximate and k.agent_id not in first_approximate:
            first_approximate[k.agent_id] = k.id
    out = set()
    for round_id, charged in by_round.items():
        last = max(k.id for k in charged)
        if any(first_approximate.get(k.agent_id, last + 1) <= last for k in charged):
            out.add(round_id)
    return out


def _check_entry(e: LedgerEntry) -> tuple[list[Mismatch], tuple[Curve, Curve | None] | None]:
    """Compare an entry's cached curves with a recomputation from its stored event; returns the
    disagreements and the cached curves (None when the event itself cannot be recomputed)."""
    try:
        curve, dd = recompute(e.event, e.data_dependent_event)
    except LedgerIntegrityError as exc:
        return [Mismatch("event", str(exc), e.agent_id, e.job_id, e.id)], None
    out = []
    cached = _array(e.curve)
    cached_dd = None if e.data_dependent_curve is None else _array(e.data_dependent_curve)
    if not same_curve(curve, cached):
        out.append(
            Mismatch(
                "curve", "cached curve differs from the recomputed one", e.agent_id, e.job_id, e.id
            )
        )
    if (dd is None) != (cached_dd is None) or (
        dd is not None and cached_dd is not None and not same_curve(dd, cached_dd)
    ):
        out.append(
            Mismatch(
                "data_dependent_curve",
                "cached data-dependent curve differs from the recomputed one",
                e.agent_id,
                e.job_id,
                e.id,
            )
        )
    return out, (cached, cached_dd)


class ReportsMixin(StoreCore):
    def ledger_entries(
        self,
        *,
        agent_id: str | None = None,
        job_id: str | None = None,
        round_id: int | None = None,
    ) -> list[LedgerEntry]:
        """Ledger entries matching every given filter, oldest first."""
        with self._transaction(write=False) as tx:
            return tx.entries(agent_id=agent_id, job_id=job_id, round_id=round_id)

    def client_budget(
        self,
        agent_id: str,
        *,
        delta: float | None = None,
        include_events: bool = True,
        tight: bool = False,
    ) -> ClientBudget:
        """What one client has spent, in total and per job, and what remains.

        Args:
            agent_id: the client.
            delta: the δ to report ε at (default: the client's budget δ, else 1e-5).
            include_events: list every entry with its own ε (one conversion each).
            tight: also compose all the client's events, across jobs, and ask
                ``compute_epsilon`` for its tightest valid bound; the reported total is the
                smaller of that and the RDP figure, and ``method`` says which. Budgets are
                always enforced on the RDP figure. (``by_job`` always carries each job's tight
                figure where one applies.)

        Raises:
            NotFound: no such client.
            InvalidInput: δ outside (0, 1).
        """
        with self._transaction(write=False) as tx:
            agent = self._agent_of(tx, agent_id)
            sums = tx.curve_sums([agent_id])
            entries = tx.entries(agent_id=agent_id)
        approximate = {e.job_id for e in entries if e.approximate}
        return self._client_budget(agent, sums, entries, approximate, delta, include_events, tight)

    def list_client_budgets(self, *, delta: float | None = None) -> list[ClientBudget]:
        """Every client's totals (without events), oldest client first.

        ``by_job`` here is the RDP figure of each job (method ``"rdp"``): the tight one needs the
        entries, which :meth:`client_budget` reads for one client.
        """
        with self._transaction(write=False) as tx:
            agents = tx.list_agents()
            by_agent: dict[str, list[CurveSum]] = defaultdict(list)
            for s in tx.curve_sums(None):
                by_agent[s.agent_id].append(s)
            approximate: dict[str, set[str]] = defaultdict(set)
            for k in tx.entry_keys(approximate=True):
                approximate[k.agent_id].add(k.job_id)
        return [
            self._client_budget(a, by_agent[a.id], None, approximate[a.id], delta, False, False)
            for a in agents
        ]

    def _client_budget(
        self,
        agent: Agent,
        sums: Sequence[CurveSum],
        entries: Sequence[LedgerEntry] | None,
        approximate: set[str],
        delta: float | None,
        include_events: bool,
        tight: bool,
    ) -> ClientBudget:
        """``approximate``: the jobs in which the client has an approximate entry."""
        if delta is None:
            delta = agent.budget.delta if agent.budget is not None else DEFAULT_REPORT_DELTA
        delta = check_delta(delta)
        curve, dd_curve, _, dd_entries = total(sums)
        epsilon, order = epsilon_of(curve, delta)
        # valid whatever relations the client's jobs mixed (relations.py); a looser bound than
        # the plain total is still a bound, so it is reported as at least ``epsilon``
        replace_one, _ = epsilon_of(replace_one_curve(curve), delta)
        method = RDP_METHOD
        if tight and entries:
            # across jobs: valid under the same one-relation condition as the RDP sum
            report = _tight_report(_composition(entries), delta)
            if report is not None and report.epsilon < epsilon:
                epsilon, method = float(report.epsilon), str(report.method)
        per_job: dict[str, list[LedgerEntry]] = defaultdict(list)
        for e in entries or ():
            per_job[e.job_id].append(e)
        by_job = {
            s.job_id: _job_epsilon(
                s.job_id,
                s,
                None if entries is None else per_job[s.job_id],
                delta,
                s.job_id in approximate,
            )
            for s in sums
        }
        reports: tuple[EventReport, ...] = ()
        if include_events:
            reports = tuple(
                EventReport(
                    e,
                    epsilon_of(_array(e.curve), delta)[0],
                    None
                    if e.data_dependent_curve is None
                    else epsilon_of(_array(e.data_dependent_curve), delta)[0],
                )
                for e in entries or ()
            )
        at_budget = remaining = None
        exceeded = False
        if agent.budget is not None:
            at_budget = epsilon_of(curve, agent.budget.delta)[0]
            remaining = max(0.0, agent.budget.epsilon - at_budget)
            exceeded = at_budget > agent.budget.epsilon
        return ClientBudget(
            agent_id=agent.id,
            delta=delta,
            epsilon=epsilon,
            order=order,
            method=method,
            data_dependent_epsilon=epsilon_of(dd_curve, delta)[0] if dd_entries else None,
            budget=agent.budget,
            epsilon_at_budget_delta=at_budget,
            remaining_epsilon=remaining,
            exceeded=exceeded,
            by_job=by_job,
            events=reports,
            replace_one_epsilon=max(replace_one, epsilon),
            approximate=any(s.job_id in approximate for s in sums),
        )

    def job_epsilons(self, job_id: str, *, delta: float | None = None) -> dict[str, float]:
        """Each charged client's ε in this job alone, at ``delta`` (default: the job's δ): the
        min of the RDP figure and the tight one of the same events (see :class:`JobEpsilon`).
        :meth:`job_epsilon_reports` says which of them are approximate.

        Raises:
            NotFound: no such job.
        """
        return {a: j.epsilon for a, j in self.job_epsilon_reports(job_id, delta=delta).items()}

    def job_epsilon_reports(
        self, job_id: str, *, delta: float | None = None
    ) -> dict[str, JobEpsilon]:
        """:meth:`job_epsilons` with each figure's method, RDP figure, entry count and
        ``approximate`` flag.

        Raises:
            NotFound: no such job.
        """
        with self._transaction(write=False) as tx:
            job = self._job_of(tx, job_id)
            sums = tx.curve_sums(None, job_id)
            entries = tx.entries(job_id=job_id)
        at = check_delta(job.delta if delta is None else delta)
        per_agent: dict[str, list[LedgerEntry]] = defaultdict(list)
        for e in entries:
            per_agent[e.agent_id].append(e)
        return {
            s.agent_id: _job_epsilon(
                job_id,
                s,
                per_agent[s.agent_id],
                at,
                any(e.approximate for e in per_agent[s.agent_id]),
            )
            for s in sums
        }

    def approximate_rounds(self, job_id: str) -> set[int]:
        """The ids of the job's committed rounds whose ``epsilon`` (the largest job ε among the
        clients it charged, after the charge) adds up at least one approximate entry.

        Raises:
            NotFound: no such job.
        """
        with self._transaction(write=False) as tx:
            self._job_of(tx, job_id)
            if not tx.entry_keys(job_id=job_id, approximate=True):
                return set()
            keys = tx.entry_keys(job_id=job_id)
        return _approximate_rounds(keys)

    def check_budgets(
        self, events: Mapping[str, DpEvent], *, data_dependent: bool = False
    ) -> dict[str, BudgetCheck]:
        """Would charging each client its event keep it within budget? (before invitation)

        Args:
            events: client id → the event the next round would charge it (its guaranteed part is
                what counts).
            data_dependent: measure existing spending with the data-dependent curves.

        Raises:
            NotFound: an unknown client.
            InvalidInput: an event the accountant rejects.
        """
        ids = sorted(events)
        prepared = {
            p.agent_id: p
            for p in prepare_charges(
                [Charge(a, events[a], ProtectedUnit.AGENT) for a in ids]  # unit is irrelevant
            )
        }
        with self._transaction(write=False) as tx:
            agents = self._existing_agents(tx, ids)
            by_agent: dict[str, list[CurveSum]] = defaultdict(list)
            for s in tx.curve_sums(ids):
                by_agent[s.agent_id].append(s)
        out = {}
        for a in ids:
            curve, dd_curve, _, _ = total(by_agent[a])
            current = dd_curve if data_dependent else curve
            out[a] = evaluate_budget(agents[a], current, prepared[a].curve)
        return out

    def check_budget(
        self, agent_id: str, event: DpEvent, *, data_dependent: bool = False
    ) -> BudgetCheck:
        """:meth:`check_budgets` for one client."""
        return self.check_budgets({agent_id: event}, data_dependent=data_dependent)[agent_id]

    # ------------------------------------------------------------------------------------------
    def verify_ledger(self) -> VerifyReport:
        """Recompute every entry's curves from its stored event, and every running sum from the
        entries, and report each disagreement (an empty report proves the cache right)."""
        with self._transaction(write=False) as tx:
            entries = tx.entries()
            sums = tx.curve_sums(None)
            fingerprint = tx.get_meta(ORDERS_META_KEY)
        mismatches: list[Mismatch] = []
        if entries and fingerprint != orders_fingerprint():
            mismatches.append(
                Mismatch("orders", "the cached curves are on another order grid than ORDERS")
            )
        expected: dict[tuple[str, str], CurveSum] = {}
        for e in entries:
            problems, curves = _check_entry(e)
            mismatches.extend(problems)
            if curves is not None:
                key = (e.agent_id, e.job_id)
                expected[key] = (expected.get(key) or CurveSum.zero(*key)).add(*curves)
        stored = {(s.agent_id, s.job_id): s for s in sums}
        for key in sorted(set(stored) | set(expected)):
            want, have = expected.get(key), stored.get(key)
            detail = None
            if have is None:
                detail = "entries without a running sum"
            elif want is None:
                detail = "a running sum without entries"
            elif (
                want.entries != have.entries
                or want.data_dependent_entries != have.data_dependent_entries
                or not same_curve(want.curve, have.curve)
                or not same_curve(want.data_dependent_curve, have.data_dependent_curve)
            ):
                detail = "running sum differs from the sum of entries"
            if detail is not None:
                mismatches.append(Mismatch("running_sum", detail, agent_id=key[0], job_id=key[1]))
        return VerifyReport(len(entries), len(stored), tuple(mismatches))

    def rebuild_curve_cache(self) -> int:
        """Recompute every cached curve and running sum from the stored events, in one
        transaction (after the order grid changed, or to repair a cache ``verify_ledger``
        found wrong). Returns the number of entries recomputed.

        Raises:
            LedgerIntegrityError: a stored event cannot be recomputed (nothing is changed).
        """
        with self._transaction(write=True) as tx:
            return self._rebuild(tx)

    @staticmethod
    def _rebuild(tx: StoreTx) -> int:
        sums: dict[tuple[str, str], CurveSum] = {}
        entries = tx.entries()
        for e in entries:
            curve, dd = recompute(e.event, e.data_dependent_event)
            tx.replace_entry_curves(e.id, curve, dd)
            key = (e.agent_id, e.job_id)
            sums[key] = (sums.get(key) or CurveSum.zero(*key)).add(curve, dd)
        tx.delete_curve_sums()
        tx.put_curve_sums(list(sums.values()))
        tx.set_meta(ORDERS_META_KEY, orders_fingerprint())
        return len(entries)

    def _ensure_orders(self) -> None:
        """Bring the cache onto the current order grid if it was built on another one."""
        with self._transaction(write=True) as tx:
            fingerprint = tx.get_meta(ORDERS_META_KEY)
            if fingerprint == orders_fingerprint():
                return
            if fingerprint is None and not tx.entries():
                tx.set_meta(ORDERS_META_KEY, orders_fingerprint())
                return
            self._rebuild(tx)
