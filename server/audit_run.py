"""Store an audited run with the job it ran: its rounds through the ledger, then the audit.

``dpfl audit JOB --database-url URL`` runs the job in simulation with canaries
(:func:`dpfl.learning.audit.run_audit`) and hands the report here. The run becomes a job of the
store like any other: every client the run charged (the simulated agents, and canary agents
where the canaries are agents) is an agent of the store, each round is started, charged through
``commit_round`` (the ledger's own composition and checks) and completed, and the job completes.
The audit is then attached with ``epsilon_upper`` read back from the ledger: the largest per-job
ε (at the job's δ) of the canaries' units, the figure the job view shows as the job's ε, so the
two numbers side by side are about the same run and the same δ.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dpfl.learning.audit import AuditReport
from dpfl.learning.jobs import JobSpec
from dpfl.server.ledger_charges import store_charge
from dpfl.server.store import Job, JobStatus, PrivacyAudit, PrivacyAuditFigures, Store
from dpfl.server.store.records import JsonObject
from dpfl.server.store.round_setup import ROUND_SETUP_VERSION, RoundSetup

__all__ = ["RecordedAudit", "record_audited_run"]


@dataclass(frozen=True, slots=True)
class RecordedAudit:
    """The stored job of the audited run and its audit."""

    job: Job
    audit: PrivacyAudit


def record_audited_run(store: Store, job: JobSpec, report: AuditReport) -> RecordedAudit:
    """Write the audited run as a completed job with its ledger, and attach the audit.

    Client ids of the run are prefixed with the new job's id, so that several audits share one
    store without mixing ledgers.

    Raises:
        StoreError: the store refused a write (each step is its own transaction; a failure
            leaves a job that is not completed and carries no audit).
        ValueError: a report without a trace of its rounds.
    """
    trace = report.trace
    if not trace.rounds:
        raise ValueError("the audit report carries no rounds to record")
    stored = store.create_job(job)
    prefix = f"{stored.id}."

    def ident(client: str) -> str:
        return prefix + client

    clients: set[str] = set(trace.units)
    for rnd in trace.rounds:
        clients.update(rnd.invited)
        clients.update(rnd.participants)
        clients.update(rnd.charges)
    for client in sorted(clients):
        kind = "canary" if client in trace.units and client.startswith("canary-") else "agent"
        store.create_agent(name=client, agent_id=ident(client), labels={"audit": kind})
    store.add_job_members(stored.id, [ident(c) for c in sorted(clients)])
    store.set_job_status(stored.id, JobStatus.RUNNING)
    for rnd in trace.rounds:
        started = store.start_round(
            stored.id,
            rnd.number,
            invited=[ident(c) for c in rnd.invited],
            setup=RoundSetup(version=ROUND_SETUP_VERSION, audit=True),
        )
        store.update_round(started.id, accepted=[ident(c) for c in rnd.participants])
        own = rnd.own_noise_fraction
        charges = [
            store_charge(ident(c), ch, own_noise_fraction=own)
            for c, ch in sorted(rnd.charges.items())
        ]
        store.commit_round(started.id, charges, enforce_budget=False)
        store.complete_round(started.id)
    finished = store.set_job_status(stored.id, JobStatus.COMPLETED)
    ledger = store.job_epsilons(stored.id)
    upper = max((ledger.get(ident(u), 0.0) for u in trace.units), default=0.0)
    figures = _figures(report, epsilon_upper=upper)
    return RecordedAudit(finished, store.add_privacy_audit(stored.id, figures))


def _figures(report: AuditReport, *, epsilon_upper: float) -> PrivacyAuditFigures:
    """The audit as stored: the report's figures with the ledger's ε as the upper bound, and the
    run's own upper bound kept among the details."""
    details: JsonObject = {
        "job": report.job,
        "algorithm": report.algorithm,
        "included": report.included,
        "rounds": report.rounds,
        "design": report.design,
        "seconds": report.seconds,
        "epsilon_upper_run": report.epsilon_upper,
        "gdp_guesses": report.gdp_guesses,
        "gdp_correct": report.gdp_correct,
    }
    # every other figure is the report's own, under the same name
    measured = {
        f.name: getattr(report, f.name)
        for f in fields(PrivacyAuditFigures)
        if f.name not in ("epsilon_upper", "details")
    }
    return PrivacyAuditFigures(**measured, epsilon_upper=epsilon_upper, details=details)
