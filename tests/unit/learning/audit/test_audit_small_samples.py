"""The audit releases every sample the way the coordinator does
(``dpfl.learning.algorithms.parts.sample_release``): for DP-FedAvg, whose charge credits client
sampling, a round of one real agent is summed with that agent carrying the whole noise and a round
without real agents releases the noise alone, so no round is skipped and the audit's ledger is the
one the coordinator's round engine commits. Its client sample is drawn from the audit's seed."""

from __future__ import annotations

from typing import Any

import pytest
from support.algorithm_harness import make_job

from dpfl.learning.algorithms.dp_fedavg import DpFedAvg
from dpfl.learning.algorithms.parts.sample_release import Release, release_for
from dpfl.learning.audit import run_audit
from dpfl.secagg import SeededRandomSource

SEED = b"dpfl-audit-small-samples-seed"
REAL = {f"agent-{i:04d}" for i in range(4)}

pytestmark = pytest.mark.slow


def _real(invited: tuple[str, ...]) -> int:
    return sum(a in REAL for a in invited)


def test_rounds_with_fewer_than_two_real_agents_are_released_and_charged() -> None:
    job = make_job(name="audit-small-samples", rounds=4, data={"partition": {"scheme": "iid"}})
    algorithm = DpFedAvg(random_source=SeededRandomSource(b"audit-small-samples-select-4"))
    report = run_audit(job, agents=4, canaries=12, seed=SEED, algorithm=algorithm)
    rounds = report.trace.rounds
    # this seed samples one real agent, the empty sample, two, and canaries alone: all but the
    # third round have fewer than two real agents
    assert [(len(r.invited), _real(r.invited)) for r in rounds] == [(3, 1), (0, 0), (4, 2), (2, 0)]
    assert [r.number for r in rounds] == [1, 2, 3, 4]
    assert report.rounds == 4
    population = set(rounds[0].charges)
    assert population >= REAL
    for r in rounds:
        # the sampled event to the whole population, as the coordinator commits every round
        assert set(r.charges) == population
        assert set(r.participants) == set(r.invited)
        plan = algorithm.plan(job, population=len(population))
        assert release_for(algorithm.bind(job, plan), invited=len(r.invited)) is not Release.SKIP
    assert 0.0 <= report.epsilon_lower <= report.epsilon_upper


def _samples(seed: bytes) -> list[tuple[str, ...]]:
    job: Any = make_job(
        name="audit-seeded-samples", rounds=3, data={"partition": {"scheme": "iid"}}
    )
    report = run_audit(job, agents=4, canaries=10, seed=seed)
    return [r.invited for r in report.trace.rounds]


def test_the_client_sample_is_drawn_from_the_audit_seed() -> None:
    first = _samples(SEED)
    assert len(first) == 3
    assert _samples(SEED) == first
    assert _samples(SEED + b"-other") != first
