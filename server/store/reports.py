"""Reading the ledger: ε per client and per job, budget checks, and verification.

Every ε is recomputed on demand, never stored, and ``verify_ledger`` recomputes every cached curve,
running sum and history group. A client's figure, in total and per job, is the tight composition
of its grouped history (:func:`dpfl.accounting.history.history_figure`: PLD or the exact Gaussian
profile where every event has a tight path, RDP otherwise, converted to replace-one where the
client's jobs mix relations); totals, budgets, remaining ε and history all use it
(docs/accounting.md#which-bound-each-ledger-figure-is). Budgets use the guaranteed events only.
A figure that adds up at least one approximate entry (``Charge.approximate``: not a proven upper
bound for the noise used) is itself flagged ``approximate``, whichever method gave it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from dpfl.accounting import AccountingError, DpEvent
from dpfl.accounting.history import ONE_JOB, canonical_event, history_figure
from dpfl.accounting.relations import replace_one_curve
from dpfl.server.errors import LedgerIntegrityError
from dpfl.server.store.core import StoreCore
from dpfl.server.store.ledger import (
    Curve,
    CurveSum,
    HistoryGroup,
    OwnShareGroup,
    check_delta,
    epsilon_of,
    evaluate_budget,
    history_of,
    orders_fingerprint,
    own_share_history,
    prepare_charges,
    recompute,
    relation_of,
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
from dpfl.server.store.tx import EntryKey, StoreTx

__all__ = [
    "DEFAULT_REPORT_DELTA",
    "HISTORY_META_KEY",
    "ORDERS_META_KEY",
    "ReportsMixin",
]

#: δ of a report when neither the caller nor the client's budget gives one.
DEFAULT_REPORT_DELTA = 1e-5
#: Metadata key holding the fingerprint of the order grid the cached curves are on.
ORDERS_META_KEY = "rdp_orders_sha256"
RDP_METHOD = "rdp"
#: Metadata key marking the history groups as built from every entry (and their format).
HISTORY_META_KEY = "history_groups"
HISTORY_VERSION = "1"


def _array(values: Sequence[float]) -> Curve:
    return np.asarray(values, dtype=np.float64)


def _job_epsilon(
    s: CurveSum, groups: Sequence[HistoryGroup], delta: float, approximate: bool
) -> JobEpsilon:
    """One job's figure (its groups composed) with the RDP figure of its summed curve beside it;
    ``approximate``: whether one of the job's entries (for this client) is."""
    rdp_eps, order = epsilon_of(s.curve, delta)
    dd_eps = epsilon_of(s.data_dependent_curve, delta)[0] if s.data_dependent_entries else None
    figure = history_figure(history_of(groups, relation=ONE_JOB), delta)
    eps, method = rdp_eps, RDP_METHOD
    if figure.epsilon < eps:
        eps, method = figure.epsilon, figure.method
    return JobEpsilon(s.job_id, eps, order, s.entries, dd_eps, method, rdp_eps, approximate)


def _groups_of(entries: Iterable[LedgerEntry]) -> list[HistoryGroup]:
    """The history groups of ``entries`` recomputed from their stored events (what the cached
    groups must equal)."""
    counts: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for e in entries:
        text = canonical_event(e.event)
        try:
            relation = relation_of(text, e.algorithm, e.unit.value)
        except AccountingError:  # verify_ledger names the entry itself
            relation = "unstated/unparseable"
        counts[(e.agent_id, e.job_id, relation, text)] += 1
    return [HistoryGroup(a, j, r, t, n) for (a, j, r, t), n in counts.items()]


def _check_groups(entries: Sequence[LedgerEntry], groups: Sequence[HistoryGroup]) -> list[Mismatch]:
    """The stored history groups against those recomputed from the entries."""
    want = {(g.agent_id, g.job_id, g.key): g.entries for g in _groups_of(entries)}
    have = {(g.agent_id, g.job_id, g.key): g.entries for g in groups}
    return [
        Mismatch(
            "history",
            "history group differs from the entries' events",
            agent_id=key[0],
            job_id=key[1],
        )
        for key in sorted(set(want) | set(have))
        if want.get(key) != have.get(key)
    ]


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


def _own_share_figure(
    own: Sequence[OwnShareGroup], delta: float
) -> tuple[float | None, str | None, str | None]:
    """(ε, method, None) of a client's entries scaled to its own share's noise, composed as the
    agent's ledger composes its records (the same history figure), or (None, None, why not)."""
    history, unknown = own_share_history(own)
    if history is None:
        return None, None, unknown
    figure = history_figure(history, delta)
    return figure.epsilon, figure.method, None


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
        tight: bool = True,
    ) -> ClientBudget:
        """What one client has spent, in total and per job, and what remains.

        Args:
            agent_id: the client.
            delta: the δ to report ε at (default: the client's budget δ, else 1e-5).
            include_events: list every entry with its own ε.
            tight: kept for callers that ask for the tight figure: every figure already is
                the client's tight composition (the module doc).

        Raises:
            NotFound: no such client.
            InvalidInput: δ outside (0, 1).
        """
        del tight
        with self._transaction(write=False) as tx:
            agent = self._agent_of(tx, agent_id)
            sums = tx.curve_sums([agent_id])
            groups = tx.history_groups([agent_id])
            entries = tx.entries(agent_id=agent_id) if include_events else None
            flagged = tx.entry_keys(approximate=True)
            own = tx.own_share_groups([agent_id])
        approximate = {k.job_id for k in flagged if k.agent_id == agent_id}
        return self._client_budget(agent, sums, groups, own, entries, approximate, delta)

    def list_client_budgets(self, *, delta: float | None = None) -> list[ClientBudget]:
        """Every client's totals (without events), oldest client first."""
        with self._transaction(write=False) as tx:
            agents = tx.list_agents()
            by_agent: dict[str, list[CurveSum]] = defaultdict(list)
            for s in tx.curve_sums(None):
                by_agent[s.agent_id].append(s)
            groups: dict[str, list[HistoryGroup]] = defaultdict(list)
            for g in tx.history_groups(None):
                groups[g.agent_id].append(g)
            approximate: dict[str, set[str]] = defaultdict(set)
            for k in tx.entry_keys(approximate=True):
                approximate[k.agent_id].add(k.job_id)
            own: dict[str, list[OwnShareGroup]] = defaultdict(list)
            for o in tx.own_share_groups(None):
                own[o.agent_id].append(o)
        return [
            self._client_budget(
                a, by_agent[a.id], groups[a.id], own[a.id], None, approximate[a.id], delta
            )
            for a in agents
        ]

    def _client_budget(
        self,
        agent: Agent,
        sums: Sequence[CurveSum],
        groups: Sequence[HistoryGroup],
        own: Sequence[OwnShareGroup],
        entries: Sequence[LedgerEntry] | None,
        approximate: set[str],
        delta: float | None,
    ) -> ClientBudget:
        """``approximate``: the jobs in which the client has an approximate entry; ``own``: the
        client's entries grouped with their f₁, for the own-share figure (composed exactly as
        the agent's ledger composes its records: the same history figure)."""
        if delta is None:
            delta = agent.budget.delta if agent.budget is not None else DEFAULT_REPORT_DELTA
        delta = check_delta(delta)
        curve, dd_curve, _, dd_entries = total(sums)
        history = history_of(groups)
        figure = history_figure(history, delta)
        _, order = epsilon_of(curve, delta)
        # valid whatever relations the client's jobs mixed; a looser bound than the figure is
        # still a bound, so it is reported as at least the figure
        replace_one, _ = epsilon_of(replace_one_curve(curve), delta)
        per_job: dict[str, list[HistoryGroup]] = defaultdict(list)
        for g in groups:
            per_job[g.job_id].append(g)
        by_job = {
            s.job_id: _job_epsilon(s, per_job[s.job_id], delta, s.job_id in approximate)
            for s in sums
        }
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
            at_budget = history_figure(history, agent.budget.delta).epsilon
            remaining = max(0.0, agent.budget.epsilon - at_budget)
            exceeded = at_budget > agent.budget.epsilon
        own_epsilon, own_method, unknown = _own_share_figure(own, delta)
        return ClientBudget(
            agent_id=agent.id,
            delta=delta,
            epsilon=figure.epsilon,
            order=order,
            method=figure.method,
            data_dependent_epsilon=epsilon_of(dd_curve, delta)[0] if dd_entries else None,
            budget=agent.budget,
            epsilon_at_budget_delta=at_budget,
            remaining_epsilon=remaining,
            exceeded=exceeded,
            by_job=by_job,
            events=reports,
            replace_one_epsilon=max(replace_one, figure.epsilon),
            approximate=any(s.job_id in approximate for s in sums),
            rdp_epsilon=figure.rdp_epsilon,
            own_share_epsilon=own_epsilon,
            own_share_method=own_method,
            own_share_unknown=unknown,
        )

    def job_epsilons(self, job_id: str, *, delta: float | None = None) -> dict[str, float]:
        """Each charged client's ε in this job alone, at ``delta`` (default: the job's δ): the
        tight composition of its events in the job (see :class:`JobEpsilon`).
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
            groups = tx.history_groups(None, job_id)
            approximate = {k.agent_id for k in tx.entry_keys(job_id=job_id, approximate=True)}
        at = check_delta(job.delta if delta is None else delta)
        per_agent: dict[str, list[HistoryGroup]] = defaultdict(list)
        for g in groups:
            per_agent[g.agent_id].append(g)
        return {
            s.agent_id: _job_epsilon(s, per_agent[s.agent_id], at, s.agent_id in approximate)
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
        self,
        events: Mapping[str, DpEvent],
        *,
        data_dependent: bool = False,
        job_id: str | None = None,
        unit: ProtectedUnit = ProtectedUnit.AGENT,
    ) -> dict[str, BudgetCheck]:
        """Would charging each client its event keep it within budget? (before invitation)

        Args:
            events: client id → the event the next round would charge it (its guaranteed part is
                what counts).
            data_dependent: measure existing spending with the data-dependent curves too.
            job_id: the job that would charge them (its algorithm states the events'
                neighbouring relation); None: the relation the events state themselves.
            unit: the unit the charges would protect (with the algorithm, it states the
                relation of a release that does not carry its own).

        Raises:
            NotFound: an unknown client or job.
            InvalidInput: an event the accountant rejects.
        """
        ids = sorted(events)
        prepared = {
            p.agent_id: p for p in prepare_charges([Charge(a, events[a], unit) for a in ids])
        }
        with self._transaction(write=False) as tx:
            algorithm = "" if job_id is None else self._job_of(tx, job_id).algorithm
            agents = self._existing_agents(tx, ids)
            by_agent: dict[str, list[CurveSum]] = defaultdict(list)
            for s in tx.curve_sums(ids):
                by_agent[s.agent_id].append(s)
            groups: dict[str, list[HistoryGroup]] = defaultdict(list)
            for g in tx.history_groups(ids):
                groups[g.agent_id].append(g)
        out = {}
        for a in ids:
            p = prepared[a]
            dd = (total(by_agent[a])[1], p.curve) if data_dependent else None
            out[a] = evaluate_budget(
                agents[a],
                history_of(groups[a]),
                (p.relation(algorithm), p.event_text),
                data_dependent=dd,
            )
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
            groups = tx.history_groups(None)
            fingerprint = tx.get_meta(ORDERS_META_KEY)
        mismatches: list[Mismatch] = _check_groups(entries, groups)
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
        tx.delete_history_groups()
        tx.add_history(_groups_of(entries))
        tx.set_meta(ORDERS_META_KEY, orders_fingerprint())
        tx.set_meta(HISTORY_META_KEY, HISTORY_VERSION)
        return len(entries)

    def _ensure_orders(self) -> None:
        """Bring the cache onto the current order grid if it was built on another one, and build
        the history groups of a ledger written before they existed."""
        with self._transaction(write=True) as tx:
            fingerprint = tx.get_meta(ORDERS_META_KEY)
            current = tx.get_meta(HISTORY_META_KEY) == HISTORY_VERSION
            if fingerprint == orders_fingerprint() and current:
                return
            if not tx.entries():
                tx.set_meta(ORDERS_META_KEY, orders_fingerprint())
                tx.set_meta(HISTORY_META_KEY, HISTORY_VERSION)
                return
            self._rebuild(tx)
