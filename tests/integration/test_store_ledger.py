"""The store contract, part 2: the privacy ledger (the three rules of
docs/architecture.md#the-privacy-ledger), on every backend.

Every ε the store reports is compared with an independent recomputation by dpfl.accounting from
the events alone (``RdpAccountant``); failures are injected mid-commit and must leave nothing.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import numpy as np
import pytest
from support.databases import FakeClock, PostgresBackend, SqliteBackend

from dpfl.accounting import (
    ComposedEvent,
    DataDependentVotingEvent,
    GaussianEvent,
    NoPrivacyEvent,
    PoissonSampledEvent,
    RdpAccountant,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    compute_epsilon,
    event_from_json,
    event_to_json,
    guaranteed_event,
    rdp_curve,
)
from dpfl.accounting.relations import replace_one_curve
from dpfl.learning.jobs import parse_job
from dpfl.server.errors import (
    BudgetExceeded,
    Conflict,
    InvalidInput,
    InvalidTransition,
    NotFound,
)
from dpfl.server.store import (
    Budget,
    Charge,
    JobStatus,
    ProtectedUnit,
    RoundStatus,
    Store,
    to_json,
)
from dpfl.server.store.ledger import epsilon_of

FEDAVG = parse_job({"name": "fedavg", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4}})
PATE = parse_job(
    {
        "name": "pate",
        "algorithm": "pate-fl",
        "data": {"public_fraction": 0.2},
        "privacy": {"unit": "record", "delta": 1e-6},
        "params": {"sigma": 40.0},
    }
)
ROUND_EVENT = PoissonSampledEvent(0.3, GaussianEvent(sigma=1.1))
AGENT = ProtectedUnit.AGENT
#: The demo's DP-FedAvg round at its current noise: q = 0.3, z = 1.533, Skellam over d = 650.
DEMO_ROUND = PoissonSampledEvent(
    0.3, SkellamEvent((1.533 * 1024.6) ** 2 / 2.0, 26122.0, 1024.6, 650)
)


def accountant_epsilon(events: list, delta: float) -> float:
    """The RDP figure of the events composed (the figure shown beside the tight one)."""
    acc = RdpAccountant()
    for e in events:
        acc.compose(e)
    return acc.get_epsilon(delta)


def composed_epsilon(events: list, delta: float) -> float:
    """A client's figure recomputed from the events alone: every event composed (identical
    ones as one self-composition), the smaller of RDP and the tight path."""
    counts = Counter(events)
    parts = [
        SelfComposedEvent(e, counts[e])
        for e in sorted(counts, key=lambda e: json.dumps(event_to_json(e), sort_keys=True))
    ]
    event = parts[0] if len(parts) == 1 else ComposedEvent(tuple(parts))
    return compute_epsilon(event, delta=delta).epsilon


class LedgerContract:
    """Abstract: a subclass provides the ``store`` fixture (see support.databases)."""

    @pytest.fixture
    def population(self, store: Store) -> list[str]:
        return [store.create_agent(name=f"silo-{i}", budget=Budget(8.0, 1e-5)).id for i in range(5)]

    @pytest.fixture
    def job_id(self, store: Store, population: list[str]) -> str:
        job = store.create_job(FEDAVG, members=population)
        store.set_job_status(job.id, JobStatus.RUNNING)
        return job.id

    def charge_all(self, store: Store, job_id: str, number: int, ids: list[str], event=ROUND_EVENT):
        rnd = store.start_round(job_id, number, invited=ids)
        return store.commit_round(rnd.id, [Charge(a, event, AGENT) for a in ids])

    # rule 1 and 2: what a commit writes -------------------------------------------------------
    def test_commit_writes_every_entry_and_the_state_change(
        self, store: Store, job_id: str, population: list[str], clock: FakeClock
    ) -> None:
        rnd = store.start_round(job_id, 1, invited=population)
        clock.advance(seconds=2)
        result = store.commit_round(
            rnd.id,
            [Charge(a, ROUND_EVENT, AGENT, honest_fraction=0.8) for a in population],
        )
        assert not result.replayed
        assert result.round.status == RoundStatus.COMMITTED
        assert result.round.committed_at == clock.now
        assert store.get_round(rnd.id) == result.round
        entries = store.ledger_entries(round_id=rnd.id)
        assert list(result.entries) == entries
        assert sorted(e.agent_id for e in entries) == sorted(population)
        e = entries[0]
        assert (e.job_id, e.round_number, e.attempt, e.algorithm) == (job_id, 1, 1, "dp-fedavg")
        assert e.unit == AGENT
        assert e.honest_fraction == 0.8
        assert e.approximate is False
        assert e.secure_aggregation is True
        assert e.event == event_to_json(ROUND_EVENT)  # rule 2: the parameters are stored
        assert np.array_equal(np.array(e.curve), rdp_curve(ROUND_EVENT))
        assert e.data_dependent_event is None
        assert e.data_dependent_curve is None
        expected = composed_epsilon([ROUND_EVENT], 1e-5)  # the job's figure after the charge
        assert result.round.epsilon == pytest.approx(expected, rel=1e-12)

    def test_client_epsilon_equals_the_accountant_on_the_stored_events(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        for number in range(1, 4):
            self.charge_all(store, job_id, number, population)
        a = population[0]
        report = store.client_budget(a, delta=1e-6)
        stored_events = [
            __import__("dpfl.accounting", fromlist=["event_from_json"]).event_from_json(e.event)
            for e in store.ledger_entries(agent_id=a)
        ]
        assert stored_events == [ROUND_EVENT] * 3
        assert report.epsilon == pytest.approx(composed_epsilon(stored_events, 1e-6), rel=1e-12)
        assert report.method == "pld"
        assert report.rdp_epsilon == pytest.approx(accountant_epsilon(stored_events, 1e-6))
        assert report.epsilon < report.rdp_epsilon
        assert report.order is not None
        assert report.by_job[job_id].entries == 3
        assert report.by_job[job_id].rdp_epsilon == pytest.approx(report.rdp_epsilon, rel=1e-12)
        job_tight = compute_epsilon(SelfComposedEvent(ROUND_EVENT, 3), delta=1e-6).epsilon
        assert report.by_job[job_id].epsilon == pytest.approx(job_tight, rel=1e-12)
        assert report.by_job[job_id].method == "pld"
        assert [ev.entry.round_number for ev in report.events] == [1, 2, 3]
        single = accountant_epsilon([ROUND_EVENT], 1e-6)  # an entry's own ε is its RDP figure
        assert all(ev.epsilon == pytest.approx(single, rel=1e-12) for ev in report.events)
        job_at_its_delta = compute_epsilon(SelfComposedEvent(ROUND_EVENT, 3), delta=1e-5).epsilon
        assert job_at_its_delta < accountant_epsilon(stored_events, 1e-5)
        assert store.job_epsilons(job_id) == {
            p: pytest.approx(job_at_its_delta, rel=1e-12) for p in population
        }
        json.dumps(to_json(report))  # the REST layer can serialise it

    def test_curves_add_across_jobs(self, store: Store, job_id: str, population: list[str]) -> None:
        pate = store.create_job(PATE, members=population[:2])
        store.set_job_status(pate.id, JobStatus.RUNNING)
        voting = VotingEvent(queries=50, sigma=40.0, level="instance")
        self.charge_all(store, job_id, 1, population)
        self.charge_all(store, pate.id, 1, population[:2], event=voting)
        report = store.client_budget(population[0], delta=1e-5)
        both = accountant_epsilon([ROUND_EVENT, voting], 1e-5)
        assert report.rdp_epsilon == pytest.approx(both, rel=1e-12)
        assert set(report.by_job) == {job_id, pate.id}
        assert report.epsilon > max(j.epsilon for j in report.by_job.values())
        # agent-level add/remove (Poisson) mixed with instance-level replace-one: the plain sum
        # holds for neither relation; the figure (and the budget) is the total converted to
        # replacing one record
        mixed = replace_one_curve(rdp_curve(ROUND_EVENT) + rdp_curve(voting))
        assert report.method == "rdp_replace_one"
        assert report.epsilon == pytest.approx(epsilon_of(mixed, 1e-5)[0], rel=1e-12)
        assert report.replace_one_epsilon == pytest.approx(report.epsilon, rel=1e-12)
        assert report.epsilon > both
        other = store.client_budget(population[3], delta=1e-5)
        assert set(other.by_job) == {job_id}
        assert store.client_budget(population[4], delta=1e-5).replace_one_epsilon > 0.0
        fresh = store.create_agent(name="fresh", budget=None)
        assert store.client_budget(fresh.id, delta=1e-5).replace_one_epsilon == 0.0

    def test_commit_is_idempotent_and_never_silently_different(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rnd = store.start_round(job_id, 1)
        charges = [Charge(a, ROUND_EVENT, AGENT) for a in population]
        first = store.commit_round(rnd.id, charges)
        again = store.commit_round(rnd.id, list(reversed(charges)))  # a retried commit
        assert again.replayed
        assert again.entries == first.entries
        assert len(store.ledger_entries()) == len(population)
        with pytest.raises(Conflict, match="already committed with different charges"):
            store.commit_round(rnd.id, charges[:-1])
        stronger = [
            Charge(a, PoissonSampledEvent(0.3, GaussianEvent(0.9)), AGENT) for a in population
        ]
        with pytest.raises(Conflict):
            store.commit_round(rnd.id, stronger)
        assert store.verify_ledger().ok

    # the own-share figure (docs/accounting.md#what-the-agent-can-verify) ----------------------
    def test_the_own_share_figure_scales_each_entry_by_its_rounds_fraction(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        fractions = {1: 0.25, 2: 0.5, 3: 1.0}
        for number, f in fractions.items():
            rnd = store.start_round(job_id, number, invited=population)
            charges = [Charge(a, ROUND_EVENT, AGENT, own_noise_fraction=f) for a in population]
            result = store.commit_round(rnd.id, charges)
            assert {e.own_noise_fraction for e in result.entries} == {f}
            assert store.ledger_entries(round_id=rnd.id) == list(result.entries)
            # a retried commit must carry the same fraction
            other = [Charge(a, ROUND_EVENT, AGENT, own_noise_fraction=f / 2) for a in population]
            with pytest.raises(Conflict, match="already committed with different charges"):
                store.commit_round(rnd.id, other)
        scaled = [ROUND_EVENT.with_noise_fraction(f) for f in fractions.values()]
        for report in (store.client_budget(population[0]), store.list_client_budgets()[0]):
            assert report.epsilon == pytest.approx(composed_epsilon([ROUND_EVENT] * 3, 1e-5))
            assert report.own_share_epsilon == pytest.approx(
                composed_epsilon(scaled, 1e-5), rel=1e-9
            )
            assert report.own_share_epsilon > report.epsilon
            assert report.own_share_unknown is None
        assert store.verify_ledger().ok

    def test_the_own_share_figure_equals_the_figure_when_every_fraction_is_one(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        for number in (1, 2):
            rnd = store.start_round(job_id, number, invited=population)
            store.commit_round(
                rnd.id, [Charge(a, ROUND_EVENT, AGENT, own_noise_fraction=1.0) for a in population]
            )
        report = store.client_budget(population[0])
        assert report.own_share_epsilon == report.epsilon
        assert report.own_share_method == report.method

    def test_one_entry_of_unknown_fraction_makes_the_own_share_figure_unknown(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        empty = store.client_budget(population[0])
        assert (empty.own_share_epsilon, empty.own_share_unknown) == (0.0, None)
        rnd = store.start_round(job_id, 1, invited=population)
        store.commit_round(
            rnd.id, [Charge(a, ROUND_EVENT, AGENT, own_noise_fraction=0.5) for a in population]
        )
        rnd = store.start_round(job_id, 2, invited=population[:1])
        store.commit_round(rnd.id, [Charge(population[0], ROUND_EVENT, AGENT)])  # f₁ unknown
        unknown = store.client_budget(population[0])
        assert unknown.own_share_epsilon is None
        assert unknown.own_share_unknown is not None
        assert "1 ledger entry was written before" in unknown.own_share_unknown
        assert unknown.epsilon == pytest.approx(composed_epsilon([ROUND_EVENT] * 2, 1e-5))
        known = store.client_budget(population[1])  # charged in round 1 only
        assert known.own_share_epsilon == pytest.approx(
            composed_epsilon([ROUND_EVENT.with_noise_fraction(0.5)], 1e-5), rel=1e-9
        )

    def test_restart_after_commit_keeps_the_charge_and_charges_the_redo(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        first = self.charge_all(store, job_id, 1, population).round
        # the coordinator dies before unmasking; at start-up it aborts what was unfinished
        (aborted,) = store.abort_interrupted_rounds(reason="coordinator restarted")
        assert aborted.id == first.id
        assert aborted.status == RoundStatus.ABORTED
        assert "the charge stays" in (aborted.abort_reason or "")
        assert len(store.ledger_entries(round_id=first.id)) == len(population)
        redo = self.charge_all(store, job_id, 1, population).round
        assert redo.attempt == 2
        eps = store.client_budget(population[0], delta=1e-5).epsilon
        assert eps == pytest.approx(composed_epsilon([ROUND_EVENT] * 2, 1e-5), rel=1e-12)
        store.complete_round(redo.id, accuracy=0.7)
        with pytest.raises(Conflict):  # a completed round number is not redone
            store.start_round(job_id, 1)

    def test_aborting_before_the_commit_charges_nothing(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rnd = store.start_round(job_id, 1)
        store.abort_round(rnd.id, reason="too few survivors")
        with pytest.raises(InvalidTransition, match="only a running round is committed"):
            store.commit_round(rnd.id, [Charge(population[0], ROUND_EVENT, AGENT)])
        assert store.ledger_entries() == []
        assert store.client_budget(population[0]).epsilon == 0.0

    def test_abort_after_commit_keeps_the_charge(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rnd = self.charge_all(store, job_id, 1, population).round
        aborted = store.abort_round(rnd.id, reason="decode failed")
        assert aborted.status == RoundStatus.ABORTED
        assert len(store.ledger_entries(round_id=rnd.id)) == len(population)
        with pytest.raises(InvalidTransition):
            store.complete_round(rnd.id)

    def test_complete_round_stores_the_model_atomically(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rnd = self.charge_all(store, job_id, 1, population).round
        done = store.complete_round(rnd.id, accuracy=0.61, model=b"weights")
        assert (done.status, done.accuracy, done.model_version) == (RoundStatus.COMPLETED, 0.61, 0)
        model = store.get_model_version(job_id)
        assert (model.data, model.round_id) == (b"weights", rnd.id)
        with pytest.raises(InvalidInput, match="accuracy"):
            store.complete_round(rnd.id, accuracy=1.5)

    # rule 1: nothing half-written --------------------------------------------------------------
    def _nothing_written(self, store: Store, round_id: int, population: list[str]) -> None:
        assert store.ledger_entries() == []
        assert store.get_round(round_id).status == RoundStatus.RUNNING
        assert all(store.client_budget(a).epsilon == 0.0 for a in population)
        assert store.verify_ledger().ok

    def test_an_unknown_client_on_the_last_charge_writes_nothing(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rnd = store.start_round(job_id, 1)
        charges = [Charge(a, ROUND_EVENT, AGENT) for a in [*population, "ghost"]]
        with pytest.raises(InvalidInput, match="unknown agents"):
            store.commit_round(rnd.id, charges)
        self._nothing_written(store, rnd.id, population)

    @pytest.mark.parametrize(
        ("bad", "message"),
        [
            (Charge("X", ROUND_EVENT, AGENT, honest_fraction=0.0), "honest_fraction"),
            (Charge("X", ROUND_EVENT, "household"), "unit"),  # type: ignore[arg-type]
            (Charge("X", ROUND_EVENT, AGENT, approximate=1), "approximate"),  # type: ignore[arg-type]
            (Charge("X", "gaussian", AGENT), "charge of agent"),  # type: ignore[arg-type]
            (Charge("X", ROUND_EVENT, AGENT, own_noise_fraction=0.0), "own_noise_fraction"),
            (Charge("X", ROUND_EVENT, AGENT, own_noise_fraction=1.5), "own_noise_fraction"),
        ],
    )
    def test_a_bad_last_charge_writes_nothing(
        self, store: Store, job_id: str, population: list[str], bad: Charge, message: str
    ) -> None:
        rnd = store.start_round(job_id, 1)
        last = Charge(
            population[-1],
            bad.event,
            bad.unit,
            bad.approximate,
            bad.secure_aggregation,
            bad.honest_fraction,
            bad.own_noise_fraction,
        )
        charges = [Charge(a, ROUND_EVENT, AGENT) for a in population[:-1]] + [last]
        with pytest.raises(InvalidInput, match=message):
            store.commit_round(rnd.id, charges)
        self._nothing_written(store, rnd.id, population)

    def test_duplicate_and_empty_charges_are_refused(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rnd = store.start_round(job_id, 1)
        with pytest.raises(InvalidInput, match="one charge per client"):
            store.commit_round(rnd.id, [Charge(population[0], ROUND_EVENT, AGENT)] * 2)
        with pytest.raises(InvalidInput, match="at least one client"):
            store.commit_round(rnd.id, [])
        with pytest.raises(NotFound):
            store.commit_round(424242, [Charge(population[0], ROUND_EVENT, AGENT)])
        self._nothing_written(store, rnd.id, population)

    def test_every_received_input_must_be_charged(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        a, b, c = population[:3]
        rnd = store.start_round(job_id, 1, invited=[a, b, c])
        store.update_round(rnd.id, accepted=[a, b, c])
        with pytest.raises(InvalidInput, match="input was received"):
            store.commit_round(rnd.id, [Charge(a, ROUND_EVENT, AGENT)])
        # c dropped before sending its masked input: it need not be charged
        store.record_stage(rnd.id, "masked_input", survivors=[a, b], dropped=[c], seconds=0.1)
        with pytest.raises(InvalidInput, match=repr(b)):
            store.commit_round(rnd.id, [Charge(a, ROUND_EVENT, AGENT)])
        store.commit_round(rnd.id, [Charge(x, ROUND_EVENT, AGENT) for x in (a, b)])
        store.record_stage(rnd.id, "unmask", survivors=[a, b], seconds=0.1)
        with pytest.raises(Conflict, match="not charged"):
            store.record_stage(rnd.id, "unmask", survivors=[a, c], seconds=0.1)

    def test_a_commit_before_any_vector_covers_everyone_about_to_be_asked(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        """A round without secure aggregation commits right after its setup was acknowledged
        (before any vector is requested): the charges must cover the acknowledgers, and a vector
        stage recorded afterwards may name only charged clients."""
        a, b, c = population[:3]
        rnd = store.start_round(job_id, 1, invited=[a, b, c])
        store.update_round(rnd.id, accepted=[a, b, c])
        store.record_stage(rnd.id, "advertise_keys", survivors=[a, b], dropped=[c], seconds=0.1)
        with pytest.raises(InvalidInput, match=repr(b)):
            store.commit_round(rnd.id, [Charge(a, ROUND_EVENT, AGENT)])
        store.commit_round(rnd.id, [Charge(x, ROUND_EVENT, AGENT) for x in (a, b)])
        store.record_stage(rnd.id, "masked_input", survivors=[a], dropped=[b], seconds=0.1)
        with pytest.raises(Conflict, match="not charged"):
            store.record_stage(rnd.id, "masked_input", survivors=[a, c], seconds=0.1)

    # rule 3: budgets ----------------------------------------------------------------------------
    def test_budget_is_enforced_at_commit_with_nothing_written(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        poor = population[0]
        store.set_agent_budget(poor, Budget(0.5, 1e-5))
        rnd = store.start_round(job_id, 1)
        charges = [Charge(a, ROUND_EVENT, AGENT) for a in population]
        with pytest.raises(BudgetExceeded) as info:
            store.commit_round(rnd.id, charges)
        assert info.value.clients == (poor,)
        assert repr(poor) in str(info.value)
        self._nothing_written(store, rnd.id, population)
        forced = store.commit_round(rnd.id, charges, enforce_budget=False)
        assert not forced.replayed
        report = store.client_budget(poor)
        assert report.exceeded
        assert report.remaining_epsilon == 0.0

    def test_check_budgets_before_invitation(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        a, b = population[:2]
        store.set_agent_budget(b, None)
        for number in range(1, 3):
            self.charge_all(store, job_id, number, population)
        checks = store.check_budgets({a: ROUND_EVENT, b: ROUND_EVENT})
        spent = composed_epsilon([ROUND_EVENT] * 2, 1e-5)
        after = composed_epsilon([ROUND_EVENT] * 3, 1e-5)
        assert checks[a].allowed
        assert checks[a].epsilon_before == pytest.approx(spent, rel=1e-12)
        assert checks[a].epsilon_after == pytest.approx(after, rel=1e-12)
        assert checks[b].allowed
        assert checks[b].budget is None
        store.set_agent_budget(a, Budget(after * 0.999, 1e-5))
        assert not store.check_budget(a, ROUND_EVENT).allowed
        huge = SelfComposedEvent(GaussianEvent(sigma=0.5), count=100)
        assert not store.check_budget(population[2], huge).allowed
        with pytest.raises(NotFound):
            store.check_budgets({"ghost": ROUND_EVENT})
        remaining = store.client_budget(population[2]).remaining_epsilon
        assert remaining == pytest.approx(8.0 - spent, rel=1e-12)

    def test_tight_reports_never_exceed_the_rdp_figure(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        for number in range(1, 4):
            self.charge_all(store, job_id, number, population)
        plain = store.client_budget(population[0], delta=1e-5)
        tight = store.client_budget(population[0], delta=1e-5, tight=True)
        assert tight == plain  # every figure is the tight one
        assert tight.rdp_epsilon is not None
        assert tight.epsilon <= tight.rdp_epsilon
        assert tight.method != "rdp"  # the PLD path wins on subsampled Gaussians
        assert tight.epsilon_at_budget_delta == pytest.approx(tight.epsilon)  # budgets too
        expected = compute_epsilon(SelfComposedEvent(ROUND_EVENT, 3), delta=1e-5, tight=True)
        assert tight.epsilon == pytest.approx(expected.epsilon, rel=1e-9)

    def test_a_gaussian_job_and_its_budget_use_the_tight_figure(
        self, store: Store, population: list[str]
    ) -> None:
        """DP-FedAvg with Gaussian noise, q = 0.3, z = 1.54, 10 rounds: 3.52 (PLD), not 3.97."""
        job = store.create_job(FEDAVG, members=population[:2])
        store.set_job_status(job.id, JobStatus.RUNNING)
        gaussian = PoissonSampledEvent(0.3, GaussianEvent.from_multiplier(1.54))
        for number in range(1, 11):
            self.charge_all(store, job.id, number, population[:2], event=gaussian)
        report = store.client_budget(population[0], delta=1e-5)
        j = report.by_job[job.id]
        assert j.method == "pld"
        assert j.rdp_epsilon == pytest.approx(3.971, abs=1e-3)
        assert j.epsilon == pytest.approx(3.523, abs=2e-3)
        assert j.epsilon == pytest.approx(
            compute_epsilon(SelfComposedEvent(gaussian, 10), delta=1e-5).epsilon, rel=1e-12
        )
        assert store.job_epsilons(job.id) == {
            a: pytest.approx(j.epsilon, rel=1e-12) for a in population[:2]
        }
        # the total and the budget are the same tight figure (said so in the report's method)
        assert report.method == "pld"
        assert report.epsilon == pytest.approx(j.epsilon, rel=1e-12)
        assert report.epsilon_at_budget_delta == pytest.approx(j.epsilon, rel=1e-12)
        # an event with no tight path (a sampled composition of Skellam releases): RDP, said so
        skellam = PoissonSampledEvent(
            0.3,
            SelfComposedEvent(
                SkellamEvent(mu=1e4, l1_sensitivity=50.0, l2_sensitivity=10.0, dimension=100), 2
            ),
        )
        other = store.create_job(FEDAVG, members=population[2:3])
        store.set_job_status(other.id, JobStatus.RUNNING)
        self.charge_all(store, other.id, 1, population[2:3], event=skellam)
        sk = store.client_budget(population[2], delta=1e-5).by_job[other.id]
        assert sk.method == "rdp"
        assert sk.epsilon == sk.rdp_epsilon
        # one sampled Skellam release per round dominates a Gaussian: its job figure is tight
        single = PoissonSampledEvent(
            0.3, SkellamEvent(mu=1e4, l1_sensitivity=50.0, l2_sensitivity=10.0, dimension=100)
        )
        third = store.create_job(FEDAVG, members=population[3:4])
        store.set_job_status(third.id, JobStatus.RUNNING)
        self.charge_all(store, third.id, 1, population[3:4], event=single)
        one = store.client_budget(population[3], delta=1e-5).by_job[third.id]
        assert one.method == "pld"
        assert one.epsilon < one.rdp_epsilon
        # the summary listing shows the same figures (from the grouped history, no entries read)
        listed = {b.agent_id: b for b in store.list_client_budgets(delta=1e-5)}
        assert listed[population[0]].by_job[job.id].method == "pld"
        assert listed[population[0]].epsilon == pytest.approx(report.epsilon, rel=1e-12)

    def test_reports_at_other_deltas_and_without_budget(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        self.charge_all(store, job_id, 1, population)
        a = population[0]
        loose, strict = store.client_budget(a, delta=1e-3), store.client_budget(a, delta=1e-9)
        assert loose.epsilon < strict.epsilon
        assert loose.epsilon_at_budget_delta == strict.epsilon_at_budget_delta  # at budget δ
        store.set_agent_budget(a, None)
        free = store.client_budget(a)
        assert free.delta == 1e-5
        assert free.remaining_epsilon is None
        assert not free.exceeded
        with pytest.raises(InvalidInput, match="delta"):
            store.client_budget(a, delta=0.0)
        listed = {c.agent_id: c for c in store.list_client_budgets(delta=1e-5)}
        assert set(listed) == set(population)
        assert listed[a].events == ()
        assert listed[a].epsilon == pytest.approx(free.epsilon)

    # data-dependent, approximate and local-DP charges -------------------------------------------
    def test_data_dependent_charges_keep_both_figures(
        self, store: Store, population: list[str]
    ) -> None:
        job = store.create_job(PATE, members=population)
        store.set_job_status(job.id, JobStatus.RUNNING)
        rnd = store.start_round(job.id, 1)
        dd = DataDependentVotingEvent(
            margins=(0.9,) * 20, num_agents=500, num_classes=10, sigma=10.0, s=1.0, level="instance"
        )  # strong consensus: the data-dependent bound is far below the guaranteed one
        guaranteed = VotingEvent(queries=20, sigma=10.0, level="instance", k=1)
        store.commit_round(rnd.id, [Charge(population[0], dd, ProtectedUnit.RECORD)])
        (entry,) = store.ledger_entries(round_id=rnd.id)
        assert entry.event == event_to_json(guaranteed)
        assert entry.data_dependent_event == event_to_json(dd)
        assert entry.data_dependent_curve is not None
        assert np.all(np.array(entry.data_dependent_curve) <= np.array(entry.curve))
        report = store.client_budget(population[0], delta=1e-6)
        assert report.epsilon == pytest.approx(composed_epsilon([guaranteed], 1e-6), rel=1e-12)
        assert report.data_dependent_epsilon is not None
        assert report.data_dependent_epsilon < report.epsilon / 2
        assert report.by_job[job.id].data_dependent_epsilon == report.data_dependent_epsilon
        # budgets use the guaranteed figure unless the operator opts in
        cut = (report.data_dependent_epsilon + report.epsilon) / 2
        store.set_agent_budget(population[0], Budget(cut, 1e-6))
        free = NoPrivacyEvent()
        strict = store.check_budget(population[0], free)
        opted_in = store.check_budget(population[0], free, data_dependent=True)
        assert strict.epsilon_before == pytest.approx(report.epsilon, rel=1e-12)
        assert opted_in.epsilon_before == pytest.approx(report.data_dependent_epsilon, abs=1e-12)
        assert not strict.allowed
        assert opted_in.allowed

    def test_a_mixed_round_returns_exactly_what_it_stored(
        self, store: Store, population: list[str]
    ) -> None:
        """One commit writing entries of several events (one data-dependent) for clients with and
        without a running sum returns the entries as they read back, and the sums stay exact."""
        job = store.create_job(PATE, members=population)
        store.set_job_status(job.id, JobStatus.RUNNING)
        a, b, c, d = population[:4]
        first = store.start_round(job.id, 1)
        store.commit_round(first.id, [Charge(x, ROUND_EVENT, AGENT) for x in (a, b)])
        store.complete_round(first.id)
        dd = DataDependentVotingEvent(
            margins=(0.8,) * 10, num_agents=100, num_classes=10, sigma=12.0, s=1.0, level="agent"
        )
        other = PoissonSampledEvent(0.1, GaussianEvent(sigma=2.0))
        rnd = store.start_round(job.id, 2)
        result = store.commit_round(
            rnd.id,
            [
                Charge(a, dd, AGENT),
                Charge(b, ROUND_EVENT, AGENT, honest_fraction=0.5),
                Charge(c, dd, AGENT),  # no running sum yet
                Charge(d, other, AGENT, approximate=True),
            ],
        )
        stored = store.ledger_entries(round_id=rnd.id)
        assert sorted(result.entries, key=lambda e: e.id) == stored
        by_agent = {e.agent_id: e for e in stored}
        assert by_agent[a].data_dependent_event == event_to_json(dd)
        assert by_agent[b].data_dependent_event is None
        assert by_agent[b].honest_fraction == 0.5
        assert by_agent[d].approximate is True
        report = store.verify_ledger()
        assert report.ok, report.mismatches
        assert by_agent[a].event == event_to_json(guaranteed_event(dd))
        assert store.client_budget(a, delta=1e-5).epsilon == pytest.approx(
            composed_epsilon([ROUND_EVENT, guaranteed_event(dd)], 1e-5), rel=1e-9
        )
        assert store.client_budget(c, delta=1e-5).epsilon == pytest.approx(
            composed_epsilon([guaranteed_event(dd)], 1e-5), rel=1e-9
        )

    def test_flags_for_approximate_and_local_dp_charges(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rnd = store.start_round(job_id, 1)
        local = GaussianEvent(sigma=3.0, sensitivity=1.0)  # the local-DP charge: no amplification
        store.commit_round(
            rnd.id,
            [
                Charge(population[0], ROUND_EVENT, AGENT, approximate=True),
                Charge(population[1], local, AGENT, secure_aggregation=False),
            ],
        )
        by_agent = {e.agent_id: e for e in store.ledger_entries(round_id=rnd.id)}
        assert by_agent[population[0]].approximate
        assert by_agent[population[0]].secure_aggregation
        assert not by_agent[population[1]].secure_aggregation
        assert by_agent[population[1]].event == event_to_json(local)

    def test_skellam_curves_are_stored_exactly(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        skellam = SkellamEvent(mu=2.0, l1_sensitivity=3.0, l2_sensitivity=3.0, dimension=10)
        curve = rdp_curve(skellam)
        rnd = store.start_round(job_id, 1)
        store.commit_round(rnd.id, [Charge(population[0], skellam, AGENT)], enforce_budget=False)
        (entry,) = store.ledger_entries(round_id=rnd.id)
        assert np.array_equal(np.array(entry.curve), curve)  # bit for bit
        assert store.verify_ledger().ok

    # the cache ----------------------------------------------------------------------------------
    def test_running_sums_equal_the_sum_of_entries(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        rng = np.random.default_rng(7)
        events = [
            ROUND_EVENT,
            PoissonSampledEvent(0.1, GaussianEvent(sigma=2.0)),
            GaussianEvent(sigma=5.0, sensitivity=1.0),
            SelfComposedEvent(PoissonSampledEvent(0.05, GaussianEvent(1.0)), count=5),
        ]
        for number in range(1, 13):
            ids = [a for a in population if rng.random() < 0.6] or population[:1]
            event = events[int(rng.integers(len(events)))]
            result = self.charge_all(store, job_id, number, ids, event=event)
            if rng.random() < 0.3:
                store.abort_round(result.round.id, reason="dropped")
            else:
                store.complete_round(result.round.id)
        report = store.verify_ledger()
        assert report.ok, report.mismatches
        assert report.entries_checked == len(store.ledger_entries())
        for a in population:
            entries = store.ledger_entries(agent_id=a)
            expected = sum((np.array(e.curve) for e in entries), np.zeros(len(entries[0].curve)))
            report = store.client_budget(a, delta=1e-5)
            assert report.rdp_epsilon == pytest.approx(epsilon_of(expected, 1e-5)[0], rel=1e-9)
            stored = [event_from_json(e.event) for e in entries]
            assert report.epsilon == pytest.approx(composed_epsilon(stored, 1e-5), rel=1e-9)

    def test_concurrent_commits_to_the_same_clients_lose_nothing(
        self, store: Store, job_id: str, population: list[str]
    ) -> None:
        # four threads commit different round numbers of one job at once: every commit
        # read-modify-writes the same running sums, which the row locks must serialise
        for a in population:
            store.set_agent_budget(a, None)
        errors: list[BaseException] = []

        def run(first: int) -> None:
            try:
                for number in range(first, first + 5):
                    self.charge_all(store, job_id, number, population)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(1 + 5 * i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.verify_ledger().ok
        eps = store.client_budget(population[0], delta=1e-5).epsilon
        assert eps == pytest.approx(composed_epsilon([ROUND_EVENT] * 20, 1e-5), rel=1e-9)

    def test_a_commit_between_the_snapshot_reads_is_not_lost(
        self, store: Store, job_id: str, population: list[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # the interleaving that lost a charge on PostgreSQL: the candidate snapshot reads the
        # running sums, another commit lands, then the snapshot reads the (now newer) history
        # groups; the write must notice that the sums it would add to are stale
        ids = population[:2]
        self.charge_all(store, job_id, 1, ids)
        tx_type = type(_a_read_transaction(store))
        original = tx_type.history_groups
        landed: list[int] = []

        def history_groups(tx, agent_ids=None, job_id=None):  # type: ignore[no-untyped-def]
            if not landed:
                landed.append(1)
                thread = threading.Thread(target=self.charge_all, args=(store, job_id_, 2, ids))
                thread.start()
                thread.join()
            return original(tx, agent_ids, job_id)

        job_id_ = job_id
        monkeypatch.setattr(tx_type, "history_groups", history_groups)
        self.charge_all(store, job_id, 3, ids)
        monkeypatch.undo()
        assert landed
        report = store.verify_ledger()
        assert report.ok, report.mismatches
        for a in ids:
            assert store.client_budget(a, delta=1e-5).by_job[job_id].entries == 3
            eps = store.client_budget(a, delta=1e-5).epsilon
            assert eps == pytest.approx(composed_epsilon([ROUND_EVENT] * 3, 1e-5), rel=1e-9)

    # budgets on the tight figure ----------------------------------------------------------------
    def _demo_rounds(self, store: Store, job_id: str, agent: str, first: int) -> int:
        """Charge ``agent`` the demo's round from round ``first`` on until refused; the number
        of rounds charged."""
        number = first
        while True:
            rnd = store.start_round(job_id, number, invited=[agent])
            try:
                store.commit_round(rnd.id, [Charge(agent, DEMO_ROUND, AGENT)])
            except BudgetExceeded:
                store.abort_round(rnd.id, reason="over budget")
                return number - first
            store.complete_round(rnd.id)
            number += 1

    @pytest.mark.slow
    def test_a_budget_of_4_runs_the_rounds_the_tight_figure_allows(
        self, store: Store, population: list[str]
    ) -> None:
        """The demo's round at its current noise (z = 1.533): RDP allowed 10 rounds under
        ε = 4, the tight figure allows more (13), and the client gets exactly those."""
        a = population[0]
        store.set_agent_budget(a, Budget(4.0, 1e-5))
        job = store.create_job(FEDAVG, members=[a])
        store.set_job_status(job.id, JobStatus.RUNNING)
        rounds = self._demo_rounds(store, job.id, a, 1)
        allowed = max(n for n in range(1, 30) if composed_epsilon([DEMO_ROUND] * n, 1e-5) <= 4.0)
        by_rdp = max(n for n in range(1, 30) if accountant_epsilon([DEMO_ROUND] * n, 1e-5) <= 4.0)
        assert by_rdp == 10
        assert rounds == allowed >= 11
        report = store.client_budget(a)
        assert report.method == "pld"
        assert report.epsilon <= 4.0 < composed_epsilon([DEMO_ROUND] * (rounds + 1), 1e-5)

    @pytest.mark.slow
    def test_two_jobs_charging_one_client_at_once_never_exceed_its_budget(
        self, store: Store, population: list[str]
    ) -> None:
        """Two jobs commit rounds for the same client concurrently until refused: each commit
        computes its candidate figure outside its transaction, so one of them must notice the
        other's charge and recompute; together they stop exactly at the budget."""
        a = population[0]
        store.set_agent_budget(a, Budget(4.0, 1e-5))
        jobs = []
        for _ in range(2):
            job = store.create_job(FEDAVG, members=[a])
            store.set_job_status(job.id, JobStatus.RUNNING)
            jobs.append(job.id)
        counts: list[int] = []
        errors: list[BaseException] = []

        def run(job_id: str) -> None:
            try:
                counts.append(self._demo_rounds(store, job_id, a, 1))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        allowed = max(n for n in range(1, 30) if composed_epsilon([DEMO_ROUND] * n, 1e-5) <= 4.0)
        assert sum(counts) == allowed
        assert len(store.ledger_entries(agent_id=a)) == allowed
        assert store.client_budget(a).epsilon <= 4.0
        assert store.verify_ledger().ok


class TestSqliteLedger(SqliteBackend, LedgerContract):
    pass


class TestPostgresLedger(PostgresBackend, LedgerContract):
    pass


def _a_read_transaction(store: Store):  # type: ignore[no-untyped-def]
    """One of the store's transaction objects (its class is what the interleaving test wraps)."""
    with store._transaction(write=False) as tx:
        return tx
