"""Figures that add up approximate ledger entries say so, on every backend.

A client with exact entries and one approximate entry (discrete Gaussian noise charged as the
continuous Gaussian: not a proven bound) has ``approximate`` set on its total, on its figure in
the job holding that entry, in the client list, in the job's per-client figures and on the
round whose ε includes it; everything built from exact entries only says ``approximate=False``.
"""

from __future__ import annotations

import pytest
from support.approximate_ledger import ApproximateJob, add_approximate_job
from support.databases import PostgresBackend, SqliteBackend

from dpfl.accounting import GaussianEvent, PoissonSampledEvent
from dpfl.learning.jobs import parse_job
from dpfl.server.store import Budget, Charge, JobStatus, ProtectedUnit, Store

EXACT_JOB = parse_job({"name": "exact", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4}})
EXACT_EVENT = PoissonSampledEvent(0.3, GaussianEvent(sigma=1.1))


class ApproximateContract:
    """Abstract: a subclass provides the ``store`` fixture (see support.databases)."""

    @pytest.fixture
    def ledger(self, store: Store) -> tuple[ApproximateJob, str, str]:
        """(the approximate job, the exact job's id, a client charged by the exact job only)."""
        mixed, exact, bystander = (
            store.create_agent(name=f"silo-{i}", budget=Budget(50.0, 1e-5)).id for i in range(3)
        )
        job = store.create_job(EXACT_JOB, members=[mixed, exact, bystander])
        store.set_job_status(job.id, JobStatus.RUNNING)
        rnd = store.start_round(job.id, 1)
        store.commit_round(
            rnd.id, [Charge(a, EXACT_EVENT, ProtectedUnit.AGENT) for a in (mixed, exact, bystander)]
        )
        store.complete_round(rnd.id)
        return add_approximate_job(store, mixed, exact), job.id, bystander

    def test_totals_and_jobs_with_an_approximate_entry_say_so(
        self, store: Store, ledger: tuple[ApproximateJob, str, str]
    ) -> None:
        approx, exact_job, bystander = ledger
        mixed = store.client_budget(approx.mixed, delta=1e-5, tight=True)
        assert mixed.approximate is True
        assert mixed.by_job[approx.job.id].approximate is True  # one exact, one approximate
        assert mixed.by_job[exact_job].approximate is False
        exact = store.client_budget(approx.exact, delta=1e-5)
        assert exact.approximate is False
        assert all(not j.approximate for j in exact.by_job.values())
        assert set(exact.by_job) == {approx.job.id, exact_job}
        assert store.client_budget(bystander).approximate is False

        listed = {b.agent_id: b for b in store.list_client_budgets(delta=1e-5)}
        assert listed[approx.mixed].approximate is True
        assert listed[approx.mixed].by_job[approx.job.id].approximate is True
        assert listed[approx.mixed].by_job[exact_job].approximate is False
        assert listed[approx.exact].approximate is False
        assert listed[bystander].approximate is False
        assert listed[approx.mixed].epsilon == pytest.approx(
            store.client_budget(approx.mixed, delta=1e-5).epsilon
        )

    def test_job_figures_and_rounds(
        self, store: Store, ledger: tuple[ApproximateJob, str, str]
    ) -> None:
        approx, exact_job, _ = ledger
        reports = store.job_epsilon_reports(approx.job.id)
        assert {a: j.approximate for a, j in reports.items()} == {
            approx.mixed: True,
            approx.exact: False,
        }
        assert {a: j.epsilon for a, j in reports.items()} == store.job_epsilons(approx.job.id)
        assert not any(j.approximate for j in store.job_epsilon_reports(exact_job).values())
        # round 1 charged exactly; round 2's ε (the largest job figure after it) includes the
        # approximate entry
        assert store.approximate_rounds(approx.job.id) == {approx.approximate_round.id}
        assert store.approximate_rounds(exact_job) == set()

    def test_a_later_exact_round_stays_approximate_for_the_tainted_client(
        self, store: Store
    ) -> None:
        mixed, exact = (store.create_agent(name=f"silo-{i}").id for i in range(2))
        approx = add_approximate_job(store, mixed, exact, complete=False)
        only_exact = store.start_round(approx.job.id, 3)
        store.commit_round(only_exact.id, [Charge(approx.exact, EXACT_EVENT, ProtectedUnit.AGENT)])
        later = store.start_round(approx.job.id, 4)
        store.commit_round(later.id, [Charge(approx.mixed, EXACT_EVENT, ProtectedUnit.AGENT)])
        assert store.approximate_rounds(approx.job.id) == {approx.approximate_round.id, later.id}


class TestSqliteApproximate(SqliteBackend, ApproximateContract):
    pass


class TestPostgresApproximate(PostgresBackend, ApproximateContract):
    pass
