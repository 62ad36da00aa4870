"""An audited run stored with its job (``dpfl.server.audit_run``), on SQLite and PostgreSQL:
the run's rounds go through the ledger's own commit, and the audit's ε_upper is the ledger's ε
of the canaries' units for the same run."""

from __future__ import annotations

from typing import Any

import pytest
from support.algorithm_harness import make_job
from support.databases import fresh_postgres_url

from dpfl.learning.audit import run_audit
from dpfl.learning.jobs import parse_job
from dpfl.server.audit_run import record_audited_run
from dpfl.server.store import JobStatus, RoundStatus, open_store

SEED = b"dpfl-audit-store-test-seed"

# the ledger's tight ε of the run's compositions (PLD) takes a few seconds the first time
pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dpfl.db'}"
    return fresh_postgres_url(request)


def _fedsgd() -> Any:
    return parse_job(
        {
            "name": "audit-store-fedsgd",
            "algorithm": "dp-fedsgd",
            "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
            "model": "logreg",
            "rounds": 2,
            "privacy": {"unit": "record", "target_epsilon": 4.0, "delta": 1e-5},
            "params": {"clip": 1.0, "local_steps": 1, "batch_sampling_rate": 0.5},
        }
    )


def _fedavg() -> Any:
    return make_job(name="audit-store-fedavg", rounds=3)


def test_record_canaries_run_is_stored_with_its_ledger_and_audit(db_url: str) -> None:
    job = _fedsgd()
    report = run_audit(job, agents=3, canaries=60, seed=SEED)
    with open_store(db_url) as store:
        recorded = record_audited_run(store, job, report)
        stored = store.get_job(recorded.job.id)
        assert stored.status == JobStatus.COMPLETED
        assert stored.name == job.name
        rounds = store.list_rounds(stored.id)
        assert [r.status for r in rounds] == [RoundStatus.COMPLETED] * report.rounds
        ledger = store.job_epsilons(stored.id)
        units = [f"{stored.id}.{u}" for u in report.trace.units]
        expected_upper = max(ledger[u] for u in units)
        (audit,) = store.list_privacy_audits(stored.id)
        assert audit == recorded.audit
        figures = audit.figures
        assert figures.epsilon_upper == pytest.approx(expected_upper, rel=1e-12)
        # the ledger's ε is min(RDP, tight): never above the run's own RDP composition
        assert figures.epsilon_upper <= report.epsilon_upper * (1 + 1e-9)
        assert figures.epsilon_lower == report.epsilon_lower
        assert figures.epsilon_lower_gdp == report.epsilon_lower_gdp
        assert figures.epsilon_lower <= figures.epsilon_upper
        assert (figures.canaries, figures.guesses, figures.correct) == (
            60,
            report.guesses,
            report.correct,
        )
        assert figures.details["rounds"] == report.rounds
        # a second audit of the same job file is a new job: ledgers never mix
        again = record_audited_run(store, job, report)
        assert again.job.id != stored.id
        assert store.job_epsilons(stored.id) == ledger


def test_canary_agents_are_charged_in_the_stored_ledger(db_url: str) -> None:
    job = _fedavg()
    report = run_audit(job, agents=6, canaries=20, seed=SEED)
    with open_store(db_url) as store:
        recorded = record_audited_run(store, job, report)
        ledger = store.job_epsilons(recorded.job.id)
        canaries = [c for c in report.trace.units if c.startswith("canary-")]
        assert canaries  # included canary agents exist in the population
        assert all(f"{recorded.job.id}.{c}" in ledger for c in canaries)
        agent = store.get_agent(f"{recorded.job.id}.{canaries[0]}")
        assert agent.labels == {"audit": "canary"}
        assert recorded.audit.figures.unit == "agent"
