"""A ledger mixing exact and approximate entries, built through the store's public API.

``add_approximate_job(store, mixed, exact)`` runs a DP-FedAvg job with discrete Gaussian noise
(``privacy.noise: gaussian``) over two clients that were already charged exactly elsewhere:
round 1 charges both exactly (as if the noise had been Skellam), round 2 charges ``mixed``
with an approximate entry and ``exact`` with an exact one. So ``mixed`` has exact entries and
one approximate entry (its total, its figure in this job and round 2's ε are approximate; its
other jobs and round 1 are not) and ``exact`` has exact entries only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpfl.accounting import GaussianEvent, PoissonSampledEvent
from dpfl.learning.jobs import parse_job
from dpfl.server.store import Charge, Job, JobStatus, ProtectedUnit, Round, Store

APPROX_YAML = """\
name: approximate-dpfedavg
algorithm: dp-fedavg
data: {dataset: digits, partition: iid, public_fraction: 0.0}
model: logreg
rounds: 2
privacy: {unit: agent, delta: 1.0e-5, noise_multiplier: 2.0, honest_fraction: 1.0, noise: gaussian}
secagg: {enabled: true, corrupt_fraction: 0.05, dropout_fraction: 0.05}
params: {clip: 1.0, sampling_rate: 0.5, local_steps: 1, learning_rate: 0.5}
"""
#: Each round's charge (the continuous Gaussian the discrete one is charged as).
APPROX_EVENT = PoissonSampledEvent(0.5, GaussianEvent(sigma=2.0))


@dataclass(frozen=True)
class ApproximateJob:
    job: Job
    mixed: str
    exact: str
    exact_round: Round
    approximate_round: Round


def add_approximate_job(
    store: Store, mixed: str, exact: str, *, complete: bool = True
) -> ApproximateJob:
    """The job of the module docstring, completed (else left running)."""
    clients = [mixed, exact]
    job = store.create_job(parse_job(APPROX_YAML), members=clients)
    store.set_job_status(job.id, JobStatus.RUNNING)
    rounds = []
    for number, approximate in ((1, False), (2, True)):
        rnd = store.start_round(job.id, number, invited=clients)
        store.update_round(rnd.id, accepted=clients)
        store.commit_round(
            rnd.id,
            [
                Charge(mixed, APPROX_EVENT, ProtectedUnit.AGENT, approximate=approximate),
                Charge(exact, APPROX_EVENT, ProtectedUnit.AGENT),
            ],
            enforce_budget=False,
        )
        rounds.append(store.complete_round(rnd.id, accuracy=0.5))
    if complete:
        store.set_job_status(job.id, JobStatus.COMPLETED)
    return ApproximateJob(store.get_job(job.id), mixed, exact, rounds[0], rounds[1])
