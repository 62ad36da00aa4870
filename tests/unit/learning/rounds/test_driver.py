"""The round driver (``dpfl.learning.rounds``) on its own: each summation, the commit before
anything is released, and the dropouts' noise shares.

The job is the harness's DP-FedAvg on digits (q = 0.3: every sample is released); the cohorts
are scripted here or the in-process one (the real secure-aggregation state machines).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from support.algorithm_harness import federation_for, make_job
from support.local_cohort import LocalCohort

from dpfl.learning.algorithms.dp_fedavg import (
    DpFedAvg,
    DpFedAvgJob,
    DpFedAvgPlan,
    DpFedAvgTask,
    FedAvgCoordinator,
)
from dpfl.learning.algorithms.parts.sample_release import Release
from dpfl.learning.errors import AlgorithmError
from dpfl.learning.rounds import (
    Acceptance,
    Commit,
    Invitation,
    RoundAborted,
    RoundEnd,
    RoundJob,
    Summation,
    Summed,
    SumSetup,
    run_round,
)
from dpfl.learning.rounds.state import Commitment
from dpfl.mechanisms import EncodingConfig, encode
from dpfl.secagg import RoundParameters, SeededRandomSource
from dpfl.secagg import server as secagg_server
from dpfl.secagg.errors import EncodingOverflow, ParameterError
from dpfl.secagg.messages import Stage
from dpfl.secagg.randomness import RandomStream
from dpfl.secagg.server_states import ServerReadyToUnmask

AGENTS = [f"agent-{i:04d}" for i in range(6)]


@functools.cache
def _job(secagg: bool = True) -> RoundJob:
    """The job (planned once per variant: planning calibrates the noise)."""
    params = {"clip": 1.0, "sampling_rate": 0.3, "local_steps": 1, "learning_rate": 0.5}
    spec = make_job(
        name="driver",
        rounds=2,
        secagg={"enabled": secagg, "dropout_fraction": 0.3},
        params=params,
    )
    algorithm = DpFedAvg(random_source=SeededRandomSource(b"driver-test-select"))
    data, _ = federation_for(spec, len(AGENTS))
    plan = algorithm.plan(spec, population=len(AGENTS), data=data)
    return RoundJob("job-1", algorithm.bind(spec, plan), data)


def _noise(purpose: str) -> RandomStream:
    return SeededRandomSource(b"driver-test-noise").stream(purpose)


class Ledger:
    """Records every commitment, or refuses them all."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.commitments: list[Commitment] = []

    async def commit(self, commitment: Commitment) -> None:
        if self.refuse:
            raise RoundAborted("ledger commit refused: over budget")
        self.commitments.append(commitment)


class Scripted:
    """A cohort whose accepting agents each send the zero vector encoded with their noise;
    ``commit_first=False`` is a deviating transport that releases without committing."""

    def __init__(self, accept: Sequence[str] | None = None, *, commit_first: bool = True) -> None:
        self.accept = accept
        self.commit_first = commit_first
        self.setups: list[SumSetup] = []
        self.released = False

    async def invite(self, invitation: Invitation) -> Acceptance:
        accepted = invitation.invited if self.accept is None else tuple(self.accept)
        return Acceptance(tuple(accepted))

    async def set_up(self, setup: SumSetup) -> None:
        self.setups.append(setup)

    async def sum(self, setup: SumSetup, commit: Commit) -> Summed:
        if self.commit_first:
            await commit(setup.accepted)
        self.released = True
        stream = SeededRandomSource(b"driver-test-agents").stream("x")
        total = np.zeros(setup.vector_length, dtype=np.uint64)
        for _ in setup.accepted:
            vector: npt.NDArray[np.uint64] = encode(
                np.zeros(setup.vector_length), config=setup.encoding, stream=stream
            )
            total = total + vector
        return Summed(total, setup.accepted)


def _run(job: RoundJob, invited: Sequence[str], cohort: object, ledger: Ledger) -> RoundEnd:
    state = job.coordinator.initial_state(job.data)
    return asyncio.run(
        run_round(
            job,
            number=1,
            state=state,
            population=AGENTS,
            invited=invited,
            cohort=cohort,  # type: ignore[arg-type]
            ledger=ledger,
            noise=_noise,
        )
    )


def test_the_empty_sample_is_the_noise_alone_charged_to_the_population() -> None:
    job, cohort, ledger = _job(), Scripted(), Ledger()
    end = _run(job, [], cohort, ledger)
    assert end.release is Release.NOISE_ALONE
    assert [s.kind for s in cohort.setups] == [Summation.NOISE_ALONE]
    assert not cohort.released  # nobody was asked for anything
    (commitment,) = ledger.commitments
    assert commitment.participants == ()
    assert set(commitment.charges) == set(AGENTS)
    assert commitment.restored_noise_shares is None
    assert end.outcome is not None
    assert end.summed == ()
    state = job.coordinator.initial_state(job.data)
    task = job.coordinator.round_task(state, round_number=1)
    assert end.encoding == job.coordinator.noise_alone_encoding(task)


def test_two_accepting_agents_are_summed_securely_and_one_plainly() -> None:
    job = _job()
    cohort, ledger = Scripted(), Ledger()
    end = _run(job, AGENTS[:3], cohort, ledger)
    assert cohort.setups[0].kind is Summation.SECURE
    assert cohort.setups[0].params is not None
    assert end.summed == tuple(AGENTS[:3])
    assert end.outcome is not None
    assert ledger.commitments[0].restored_noise_shares == 0
    lone = Scripted()
    end = _run(job, AGENTS[:1], lone, Ledger())
    assert lone.setups[0].kind is Summation.PLAIN
    assert lone.setups[0].min_survivors == 1
    assert end.summed == (AGENTS[0],)


def test_without_secure_aggregation_every_sum_is_plain() -> None:
    job = _job(secagg=False)
    cohort = Scripted()
    end = _run(job, AGENTS[:4], cohort, Ledger())
    assert cohort.setups[0].kind is Summation.PLAIN
    assert cohort.setups[0].params is None
    assert cohort.setups[0].accepted == tuple(AGENTS[:4])
    assert end.summed == tuple(AGENTS[:4])


def test_a_refusing_ledger_releases_nothing() -> None:
    """The ledger refuses the commit: the round aborts with its reason and the summation never
    gets past its commit (nothing is released, nothing decoded)."""
    cohort = Scripted()
    with pytest.raises(RoundAborted, match="ledger commit refused"):
        _run(_job(), AGENTS[:3], cohort, Ledger(refuse=True))
    assert not cohort.released


def test_a_refusing_ledger_stops_secure_aggregation_before_the_unmasking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process secure aggregation with a refusing ledger: the masked inputs arrive, the
    commit is refused, and no unmasking ever begins (the aggregate is never computable)."""
    begun: list[object] = []
    begin_unmask = secagg_server.begin_unmask

    def spy(state: ServerReadyToUnmask) -> object:
        begun.append(state)
        return begin_unmask(state)

    monkeypatch.setattr(secagg_server, "begin_unmask", spy)
    with pytest.raises(RoundAborted, match="ledger commit refused"):
        _run(_job(), AGENTS[:3], _local(), Ledger(refuse=True))
    assert begun == []
    _run(_job(), AGENTS[:3], _local(), Ledger())
    assert len(begun) == 1  # the spy sees the unmasking of a committed round


def _local(dropouts: Mapping[Stage, Sequence[int]] | None = None) -> LocalCohort:
    return LocalCohort(
        lambda agent, invitation, setup: encode(
            np.zeros(setup.vector_length), config=setup.encoding, stream=_noise(agent)
        ),
        rng=SeededRandomSource(b"driver-test-secagg"),
        dropouts=dropouts,
        job_id="job-1",
        number=1,
    )


def test_a_summation_that_releases_before_the_commit_is_refused() -> None:
    with pytest.raises(RuntimeError, match="without committing the ledger"):
        _run(_job(), AGENTS[:3], Scripted(commit_first=False), Ledger())


def test_too_few_acceptances_abort_before_anything_is_charged() -> None:
    job, ledger = _job(), Ledger()
    with pytest.raises(RoundAborted, match="0 of 3 invited clients accepted, a round needs 1"):
        _run(job, AGENTS[:3], Scripted(accept=[]), ledger)
    assert ledger.commitments == []


def test_dropouts_are_counted_as_restored_noise_shares_before_the_commit() -> None:
    """Five accepted, one drops before its masked input: four are charged as participants, the
    commitment says one share is restored, and the release is the five shares' noise."""
    job, ledger = _job(), Ledger()
    cohort = _local({Stage.MASKED_INPUT: [4]})
    end = _run(job, AGENTS[:5], cohort, ledger)
    (commitment,) = ledger.commitments
    assert commitment.participants == tuple(AGENTS[:4])
    assert commitment.restored_noise_shares == 1
    assert end.summed == tuple(AGENTS[:4])
    assert end.accepted == tuple(AGENTS[:5])


class WithoutSamplingCreditCoordinator(FedAvgCoordinator[DpFedAvgJob, DpFedAvgPlan, DpFedAvgTask]):
    """DP-FedAvg's coordinator side as one whose charge rests on no secrecy of the sample."""

    @property
    def releases_every_sample(self) -> bool:
        return False


class WithoutSamplingCredit(DpFedAvg):
    """DP-FedAvg as an algorithm whose charge rests on no secrecy of the sample."""

    coordinator_type = WithoutSamplingCreditCoordinator


def test_a_sample_too_small_for_an_algorithm_without_sampling_credit_is_skipped() -> None:
    base = _job()
    job = dataclasses.replace(base, coordinator=WithoutSamplingCredit().bind(base.spec, base.plan))
    ledger, cohort = Ledger(), Scripted()
    end = _run(job, AGENTS[:1], cohort, ledger)
    assert end.release is Release.SKIP
    assert end.outcome is None
    assert end.reason == "1 clients sampled, a round needs 2: skipped"
    assert ledger.commitments == []
    assert cohort.setups == []


def test_a_secure_setup_holds_only_an_encoding_that_fits_its_parameters() -> None:
    """The encoding travels beside secure aggregation's parameters, which never read it: the
    round setup refuses an encoding of another ring, or one that n vectors could wrap, so no
    agent is ever set up with it."""
    params = RoundParameters(
        num_clients=3, degree=2, threshold=2, ring_bits=16, vector_length=4, min_survivors=2
    )
    fits = EncodingConfig(clip=1.0, scale_bits=4, ring_bits=16)
    agents = tuple(AGENTS[:3])
    assert SumSetup(Summation.SECURE, agents, 4, fits, params).encoding == fits
    with pytest.raises(ParameterError, match=r"encoding ring \(17 bits\) differs"):
        SumSetup(Summation.SECURE, agents, 4, dataclasses.replace(fits, ring_bits=17), params)
    with pytest.raises(EncodingOverflow, match="too small for 3 summands"):
        SumSetup(Summation.SECURE, agents, 4, dataclasses.replace(fits, scale_bits=14), params)
    # the plain summation's agents check their own share (min_survivors = 1) on receipt
    assert SumSetup(Summation.PLAIN, agents[:1], 4, fits).params is None


def test_a_malicious_secure_job_releases_what_the_semi_honest_one_does() -> None:
    """The harness's cohort runs the real malicious-secure state machines (peer certificates of
    one federation CA, the consistency stage) with the same seeds: the noise does not depend on
    the threat model, only (k, t) do, so the models, the ledgers and the encodings are equal."""
    from support.algorithm_harness import run_job

    secagg = {"corrupt_fraction": 0.2, "dropout_fraction": 0.2}
    params = {"sampling_rate": 1.0, "local_steps": 1}
    runs = {
        threat: run_job(
            make_job(rounds=2, secagg={**secagg, "threat_model": threat}, params=params),
            num_agents=6,
            dropouts={2: {Stage.MASKED_INPUT: [5]}},  # one dropout: restored noise as well
        )
        for threat in ("semi-honest", "malicious")
    }
    honest, malicious = runs["semi-honest"], runs["malicious"]
    assert [len(r.participants) for r in malicious.rounds] == [6, 5]
    assert malicious.state.model == honest.state.model
    assert malicious.ledger == honest.ledger
    assert [r.encoding for r in malicious.rounds] == [r.encoding for r in honest.rounds]


def _agent_fraction(job: RoundJob, setup: SumSetup) -> float:
    """f₁ as an agent computes it from the setup it receives (client/checks.py)."""
    side = job.coordinator
    task = side.round_task(side.initial_state(job.data), round_number=1)
    agent = side.algorithm.agent(side.algorithm.parse_task(task.params.to_json()))
    events = side.round_charge(round_number=1, population=AGENTS).events
    clients = len(setup.accepted) if setup.params is None else setup.params.num_clients
    return agent.check(
        events,
        setup.encoding,
        num_clients=max(1, clients),
        min_survivors=setup.min_survivors,
        honest_fraction=task.params.honest_fraction,
    )


def test_each_commitment_carries_the_fraction_one_agents_share_carries() -> None:
    job = _job()
    t = job.coordinator.round_task(
        job.coordinator.initial_state(job.data), round_number=1
    ).params.honest_fraction
    secure, ledger = Scripted(), Ledger()
    _run(job, AGENTS[:4], secure, ledger)
    (setup,) = secure.setups
    assert setup.kind is Summation.SECURE
    own = ledger.commitments[0].own_noise_fraction
    assert own is not None
    assert own == _agent_fraction(job, setup)
    assert 0 < own < 1  # split over the cohort...
    assert own * t * setup.min_survivors >= 1 - 1e-9  # ...and the cohort carries the claim
    # where one agent's own noise carries the whole charge: 1
    for job_, invited in ((_job(), AGENTS[:1]), (_job(), []), (_job(secagg=False), AGENTS[:4])):
        ledger = Ledger()
        _run(job_, invited, Scripted(), ledger)
        assert ledger.commitments[0].own_noise_fraction == 1.0


def test_a_setup_the_agents_check_would_refuse_aborts_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = _job()
    agent_type = job.coordinator.algorithm.agent_type

    def refuse(*args: object, **kwargs: object) -> float:
        raise AlgorithmError("per-agent noise below the claim")

    monkeypatch.setattr(agent_type, "check", refuse)
    cohort, ledger = Scripted(), Ledger()
    with pytest.raises(RoundAborted, match=r"agents' own check.*below the claim"):
        _run(job, AGENTS[:3], cohort, ledger)
    assert cohort.setups == []  # the setup was never recorded nor sent
    assert ledger.commitments == []
