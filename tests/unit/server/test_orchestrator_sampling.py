"""The coordinator's client-sampling policy (``server/orchestrator/sampling.py``) against the
charge it must match: the released rounds' samples are exactly the charged draw.

docs/accounting.md, "Client sampling: every sample is released". The engine calls
``attempt_sample`` and ``release_for`` for every attempt; driving them directly runs thousands of
rounds of the real selection (the algorithm's CSPRNG draw), skip and retry policy in a second.
With n = 10 and q = 0.3 a policy that skips samples below two clients releases rounds whose
inclusion probability is 0.338, not 0.3; the empirical rate over 4000 rounds (40 000 draws) has a
standard deviation of 0.0023, so the 4σ margin below (0.009) separates the two.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_job

from dpfl.learning.algorithms.base import CoordinatorData, CoordinatorState, JobPlan
from dpfl.learning.algorithms.dp_fed_ls import DpFedLs
from dpfl.learning.algorithms.dp_fedavg import (
    DpFedAvg,
    DpFedAvgJob,
    DpFedAvgPlan,
    DpFedAvgTask,
    FedAvgCoordinator,
)
from dpfl.learning.jobs import JobSpec
from dpfl.secagg import SeededRandomSource
from dpfl.server.orchestrator.sampling import AttemptSample, Release, attempt_sample, release_for
from dpfl.server.orchestrator.state import round_record
from dpfl.server.store import ROUND_SETUP_VERSION, Round, RoundSetup, RoundStatus

N, Q, ROUNDS = 10, 0.3, 4000
POPULATION = [f"agent-{i:02d}" for i in range(N)]
DIGITS = CoordinatorData(input_shape=(64,), num_classes=10)
MAX_ATTEMPTS = 3


class SkipsSmallSamplesCoordinator(FedAvgCoordinator[DpFedAvgJob, DpFedAvgPlan, DpFedAvgTask]):
    """DP-FedAvg's coordinator side skipping a sample of fewer than two clients."""

    @property
    def releases_every_sample(self) -> bool:
        return False


class SkipsSmallSamples(DpFedAvg):
    """DP-FedAvg as the coordinator ran it before: a sample of fewer than two clients skipped."""

    coordinator_type = SkipsSmallSamplesCoordinator


def _plan(algorithm: DpFedAvg, job: JobSpec) -> JobPlan:
    return algorithm.plan(job, population=N, data=DIGITS)


def _record(plan: JobPlan, sample: AttemptSample) -> RoundSetup:
    """The record the coordinator stores for an attempt that invited ``sample``."""
    state = CoordinatorState(model=None, model_version=0, details={}, blobs={})
    return round_record(plan, state, sample, POPULATION, [])


def _attempt(number: int, attempt: int, record: RoundSetup, *, committed: bool) -> Round:
    now = datetime.now(UTC)
    return Round(
        id=number * 10 + attempt,
        job_id="job",
        number=number,
        attempt=attempt,
        status=RoundStatus.ABORTED,
        started_at=now,
        committed_at=now if committed else None,
        finished_at=now,
        invited=tuple(record.sample or ()),
        accepted=(),
        survivors={},
        dropped={},
        stage_seconds={},
        setup=record,
        accuracy=None,
        epsilon=None,
        model_version=None,
        abort_reason="aborted",
    )


def _released_inclusion(
    algorithm: DpFedAvg, job: JobSpec, *, abort_rate: float = 0.0
) -> tuple[dict[str, int], int, int]:
    """Run ROUNDS rounds of the policy: per agent, how many released rounds sampled it; the
    number of released rounds; the number of attempts. An attempt aborts before its commit with
    probability ``abort_rate`` (independent of the sample: a coordinator failure), retried up to
    MAX_ATTEMPTS times on the round's kept sample."""
    plan = _plan(algorithm, job)
    coin = np.random.default_rng(7)
    counts = dict.fromkeys(POPULATION, 0)
    released = attempts = 0
    for number in range(1, ROUNDS + 1):
        previous: list[Round] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            attempts += 1
            sample = attempt_sample(
                algorithm.bind(job, plan),
                round_number=number,
                population=POPULATION,
                previous=previous,
            )
            if previous:
                assert sample.kept
                assert sample.invited == previous[0].invited  # the same sample, every attempt
            mode = release_for(algorithm.bind(job, plan), invited=len(sample.invited))
            if mode is Release.SKIP:
                break
            if coin.random() < abort_rate:
                previous.append(_attempt(number, attempt, _record(plan, sample), committed=False))
                continue
            released += 1
            for agent in sample.invited:
                counts[agent] += 1
            break
    return counts, released, attempts


def _excess(counts: dict[str, int], released: int, rate: float) -> tuple[float, float]:
    """(pooled empirical inclusion rate, its 4σ upper margin over ``rate``)."""
    pooled = sum(counts.values()) / (released * len(counts))
    return pooled, rate + 4.0 * math.sqrt(rate * (1.0 - rate) / (released * len(counts)))


@pytest.mark.parametrize("abort_rate", [0.0, 0.4])
def test_released_rounds_include_each_agent_at_the_charged_rate(abort_rate: float) -> None:
    job = make_job(name="sampling-policy", params={"sampling_rate": Q})
    counts, released, attempts = _released_inclusion(
        DpFedAvg(random_source=SeededRandomSource(b"sampling-policy-test-seed")),
        job,
        abort_rate=abort_rate,
    )
    # every round is released unless all its attempts aborted (independently of the sample)
    assert released > ROUNDS * (1 - abort_rate**MAX_ATTEMPTS) * 0.95
    pooled, limit = _excess(counts, released, Q)
    assert pooled <= limit, f"inclusion {pooled:.4f} over the charged {Q} (limit {limit:.4f})"
    per_agent_sd = math.sqrt(Q * (1 - Q) / released)
    assert max(counts.values()) / released <= Q + 4.5 * per_agent_sd
    assert attempts >= ROUNDS


def test_the_check_catches_a_policy_that_skips_small_samples() -> None:
    """The same measurement flags the former policy (skip below two sampled clients): the
    released rounds include each agent with probability 0.338 > 0.3."""
    job = make_job(name="sampling-policy", params={"sampling_rate": Q})
    counts, released, _ = _released_inclusion(
        SkipsSmallSamples(random_source=SeededRandomSource(b"sampling-policy-test-seed")), job
    )
    pooled, limit = _excess(counts, released, Q)
    conditional = Q * (1 - (1 - Q) ** (N - 1)) / (1 - (1 - Q) ** N - N * Q * (1 - Q) ** (N - 1))
    assert conditional == pytest.approx(0.3384, abs=1e-4)
    assert pooled > limit
    assert pooled == pytest.approx(conditional, abs=0.01)


def test_fixed_size_samples_of_one_are_released_at_the_charged_ratio() -> None:
    """DP-Fed-LS ``uniform`` with m = 1 of n = 10: every round is released (the former policy
    skipped all of them), each agent in a fraction m/n of them."""
    job = make_job(
        name="uniform-policy",
        algorithm="dp-fed-ls",
        params={"sampling_rate": 0.1, "client_sampling": "uniform", "sigma_ls": 1.0},
    )
    algorithm = DpFedLs(random_source=SeededRandomSource(b"uniform-policy-test-seed"))
    counts, released, _ = _released_inclusion(algorithm, job)
    assert released == ROUNDS
    pooled, limit = _excess(counts, released, 0.1)
    assert pooled <= limit


def test_a_sample_is_kept_until_an_attempt_commits_and_only_within_its_population() -> None:
    job = make_job(name="sampling-keep", params={"sampling_rate": Q})
    algorithm = DpFedAvg()  # the system CSPRNG: a new draw is a fresh one
    plan = _plan(algorithm, job)

    def draw(previous: list[Round], population: list[str] = POPULATION) -> Any:
        return attempt_sample(
            algorithm.bind(job, plan), round_number=4, population=population, previous=previous
        )

    first = draw([])
    assert not first.kept
    assert first.drawn_from == tuple(POPULATION)
    aborted = _attempt(4, 1, _record(plan, first), committed=False)
    again = draw([aborted])
    assert again.kept
    assert again.sample == first.sample
    # a member of the sample now over budget is left out; the others are invited again
    smaller = [a for a in POPULATION if a != POPULATION[0]]
    forced_sample = _record(plan, first).model_copy(update={"sample": POPULATION[:2]})
    forced = replace(aborted, setup=forced_sample)
    assert draw([forced], smaller).invited == (POPULATION[1],)
    # a committed attempt was charged as a release of its own sample: the next draws afresh
    assert not draw([aborted, _attempt(4, 2, _record(plan, first), committed=True)]).kept
    # a population that grew since the draw would lower the charged ratio: draw afresh
    grown = [*POPULATION, "agent-new"]
    assert not draw([aborted], grown).kept
    # a record without a sample (written before samples were kept) is not trusted
    assert not draw([replace(aborted, setup=RoundSetup(version=ROUND_SETUP_VERSION))]).kept


def test_small_samples_are_released_not_skipped() -> None:
    job = make_job(name="sampling-modes", params={"sampling_rate": Q})
    algorithm = DpFedAvg()
    plan = _plan(algorithm, job)
    assert release_for(algorithm.bind(job, plan), invited=0) is Release.NOISE_ALONE
    assert release_for(algorithm.bind(job, plan), invited=1) is Release.ROUND
    old = SkipsSmallSamples()
    assert release_for(old.bind(job, plan), invited=1) is Release.SKIP
    assert release_for(old.bind(job, plan), invited=2) is Release.ROUND
