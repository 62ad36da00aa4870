"""Capped votes: an agent votes on at most ``params.vote_share`` of a round's queries and is
charged only those (docs/accounting.md#capped-votes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_pate_job

from dpfl.accounting import SelfComposedEvent, VotingEvent, compute_epsilon, gaussian_epsilon
from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.algorithms.parts import teachers
from dpfl.learning.algorithms.parts.abstain import own_share
from dpfl.learning.algorithms.pate_fl import ALGORITHM as PATE
from dpfl.learning.algorithms.private_knn_fl import ALGORITHM as KNN
from dpfl.learning.algorithms.voting import capped, vote_cap
from dpfl.learning.jobs import JobSpecError

AGENTS = [f"agent-{i}" for i in range(10)]
KW = {"num_clients": 10, "min_survivors": 10, "honest_fraction": 1.0}


def test_the_cap_is_the_rounded_up_share_of_the_round() -> None:
    assert vote_cap(100, 0.3) == 30  # 0.3·100 is 30.000000000000004 in floats
    assert vote_cap(50, 0.3) == 15
    assert vote_cap(3, 0.5) == 2
    assert vote_cap(7, 0.01) == 1  # never zero: an agent may always vote once
    assert vote_cap(10, 1.0) == 10


def test_capped_keeps_the_cast_rows_ranked_first() -> None:
    votes = np.eye(4)[[0, 1, 2, 3, 0, 1]].astype(np.float64)
    votes[5] = 0.0  # an abstention never takes a place
    first = np.array([0.5, 0.9, 0.5, 0.1, 0.5, 1.0])
    second = np.array([0.0, 0.0, 0.7, 0.0, 0.7, 0.0])
    out = capped(votes, (first, second), 3)
    # row 1 (0.9), then rows 2 and 4 (0.5, second key 0.7) before row 0 (0.5, 0.0)
    assert np.flatnonzero(out.any(axis=1)).tolist() == [1, 2, 4]
    np.testing.assert_array_equal(out[[1, 2, 4]], votes[[1, 2, 4]])
    # equal keys: the lower row wins
    assert np.flatnonzero(capped(votes, (np.zeros(6),), 2).any(axis=1)).tolist() == [0, 1]
    # no more cast rows than the cap: unchanged
    assert capped(votes, (first,), 5) is votes


def test_the_plan_calibrates_and_charges_only_the_capped_releases(digits_public: Any) -> None:
    data, _ = digits_public
    privacy = {"unit": "agent", "delta": 1e-5, "noise": "skellam", "target_epsilon": 4.0}

    def plan(queries: int, share: float) -> Any:
        params = {"queries": queries, "sigma": None, "vote_share": share}
        job = make_pate_job(params=params, privacy=privacy)
        return job, PATE.plan(job, population=10, data=data)

    job, capped_plan = plan(100, 0.3)  # two rounds of 50: 15 votes each
    _, thirty = plan(30, 1.0)  # two rounds of 15, every vote cast
    _, hundred = plan(100, 1.0)
    assert capped_plan.noise_multiplier == pytest.approx(thirty.noise_multiplier, rel=1e-9)
    assert capped_plan.noise_multiplier < 0.6 * hundred.noise_multiplier
    (event,) = PATE.bind(job, capped_plan).invitation_events(round_number=1, population=AGENTS)
    assert isinstance(event, SelfComposedEvent)
    assert event.count == 15
    charge = PATE.bind(job, capped_plan).round_charge(round_number=2, population=AGENTS)
    assert charge.charge.event == event


def test_capped_votes_are_refused_below_agent_level(digits_public: Any) -> None:
    with pytest.raises(JobSpecError, match=r"params\.vote_share 0\.5: capped votes need"):
        make_pate_job(params={"vote_share": 0.5}, privacy={"unit": "record"})
    with pytest.raises(JobSpecError, match=r"params\.vote_share"):
        make_pate_job(params={"vote_share": 0.0})
    data, _ = digits_public
    job = make_pate_job(params={"vote_share": 0.5})
    plan = PATE.plan(job, population=10, data=data)
    bound = PATE.bind(job, plan)
    task = bound.round_task(bound.initial_state(data), round_number=1).params.to_json()
    assert task["vote_share"] == 0.5
    # a coordinator that asks for capped votes at record level is refused by the agent's parser
    forged = {**task, "level": "instance", "unit": "record"}
    with pytest.raises(AlgorithmError, match="only defined at agent level"):
        PATE.parse_task(forged)


def _round(data: Any, **params: Any) -> tuple[Any, Any, Any, Any]:
    """A one-round PATE-FL job of 40 queries: (task JSON, encoding, claimed event, bound)."""
    job = make_pate_job(rounds=1, params={"queries": 40, "teacher_epochs": 2, **params})
    plan = PATE.plan(job, population=10, data=data)
    bound = PATE.bind(job, plan)
    task = bound.round_task(bound.initial_state(data), round_number=1)
    config = bound.encoding(task, participants=10, min_survivors=10)
    (event,) = bound.invitation_events(round_number=1, population=AGENTS)
    return task.params.to_json(), config, event, plan


@pytest.mark.slow
def test_a_capped_teacher_keeps_its_most_familiar_queries_and_checks_the_claim(
    digits_public: Any,
) -> None:
    data, agents = digits_public
    abstain = {"method": "public-share", "share": 0.05, "dim": 20}
    votes = {}
    for share in (1.0, 0.25):
        task, config, event, _ = _round(data, vote_share=share, teacher_abstain=abstain)
        teachers.clear_teacher_cache()
        agent = PATE.agent(PATE.parse_task(task))
        agent.check([event], config, **KW)
        votes[share] = agent.compute(
            agents[0], model=None, public_x=data.public_x, device="cpu"
        ).reshape(40, 10)
    full, kept = votes[1.0], votes[0.25]
    cast, chosen = full.any(axis=1), kept.any(axis=1)
    assert cast.sum() > 10
    assert chosen.sum() == 10
    np.testing.assert_array_equal(kept[chosen], full[chosen])  # the same votes where kept
    shares = own_share(
        agents[0].x, data.public_x, np.asarray(task["queries"]), neighbours=20, dim=20
    )
    # the cap drops the cast votes with the lowest own share first
    assert shares[chosen].min() >= shares[cast & ~chosen].max()
    # the claim must state exactly the capped releases: 40 (uncapped) or fewer are refused
    agent = PATE.agent(PATE.parse_task(task))
    with pytest.raises(AlgorithmError, match="expected 10 per-query"):
        agent.check([SelfComposedEvent(event.event, 40)], config, **KW)
    with pytest.raises(AlgorithmError, match="expected 10 per-query"):
        agent.check([SelfComposedEvent(event.event, 9)], config, **KW)


@pytest.mark.slow
def test_the_charge_covers_the_release_of_the_capped_votes_and_only_because_of_the_cap(
    digits_public: Any,
) -> None:
    """Gaussian one-hot votes: the exact ε of the noisy sum's shift by this agent's capped vote
    vector is within the charged event's ε; its uncapped vector's ε is not (a coordinate-wise
    Gaussian release of a shift v has the ε of one Gaussian with ratio ‖v‖₂/σ)."""
    data, agents = digits_public
    privacy = {"unit": "agent", "noise": "gaussian"}
    job = make_pate_job(
        rounds=1, privacy=privacy, params={"queries": 40, "teacher_epochs": 2, "vote_share": 0.1}
    )
    plan = PATE.plan(job, population=10, data=data)
    bound = PATE.bind(job, plan)
    task = bound.round_task(bound.initial_state(data), round_number=1)
    (event,) = bound.invitation_events(round_number=1, population=AGENTS)
    assert event == VotingEvent(queries=4, sigma=plan.noise_multiplier, level="agent")
    charged = compute_epsilon(event, delta=1e-5).epsilon
    agent = PATE.agent(PATE.parse_task(task.params.to_json()))
    teachers.clear_teacher_cache()
    v = agent.compute(agents[1], model=None, public_x=data.public_x, device="cpu")
    sigma = plan.noise_multiplier
    assert gaussian_epsilon(float(np.linalg.norm(v)) / sigma, 1e-5) <= charged
    uncapped = np.sqrt(40.0)  # a one-hot vote on every query
    assert gaussian_epsilon(uncapped / sigma, 1e-5) > 2.0 * charged


def test_a_knn_agent_keeps_the_queries_its_neighbours_agree_on(digits_public: Any) -> None:
    data, agents = digits_public
    votes = {}
    for share in (1.0, 0.2):
        params = {"queries": 60, "k": 5, "sigma": 2.0, "vote_share": share}
        job = make_pate_job(algorithm="private-knn-fl", name="knn", rounds=1, params=params)
        plan = KNN.plan(job, population=10, data=data)
        bound = KNN.bind(job, plan)
        task = bound.round_task(bound.initial_state(data), round_number=1)
        config = bound.encoding(task, participants=10, min_survivors=10)
        (event,) = bound.invitation_events(round_number=1, population=AGENTS)
        assert isinstance(event, SelfComposedEvent)
        assert event.count == vote_cap(60, share)
        agent = KNN.agent(KNN.parse_task(task.params.to_json()))
        agent.check([event], config, **KW)
        votes[share] = agent.compute(
            agents[2], model=None, public_x=data.public_x, device="cpu"
        ).reshape(60, 10)
    full, kept = votes[1.0], votes[0.2]
    chosen = kept.any(axis=1)
    assert chosen.sum() == 12
    np.testing.assert_array_equal(kept[chosen], full[chosen])
    agreement = full.max(axis=1)
    assert agreement[chosen].min() >= agreement[~chosen].max()
