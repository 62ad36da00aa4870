"""PATE-FL: query batches, vote sensitivities, calibration, argmax, student, charges, agent side."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_pate_job

from dpfl.accounting import (
    ORDERS,
    ComposedEvent,
    DataDependentVotingEvent,
    GaussianEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    compute_epsilon,
    event_from_json,
    rdp_curve,
)
from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData, JobPlan
from dpfl.learning.algorithms.parts import teachers
from dpfl.learning.algorithms.pate_fl import ALGORITHM, batch_sizes, vote_sensitivities
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.mechanisms import EncodingConfig, NoiseSpec

AGENTS = [f"agent-{i}" for i in range(10)]


@pytest.fixture(scope="module")
def setup(digits_public: tuple[CoordinatorData, list[AgentData]]) -> tuple[Any, JobPlan, Any]:
    data, _ = digits_public
    job = make_pate_job()
    plan = ALGORITHM.plan(job, population=10, data=data)
    return job, plan, ALGORITHM.bind(job, plan).initial_state(data)


def test_registered_and_batches_split_evenly() -> None:
    assert get_algorithm("pate-fl") is ALGORITHM
    assert batch_sizes(200, 2) == [100, 100]
    assert batch_sizes(10, 3) == [4, 3, 3]
    assert sum(batch_sizes(1001, 7)) == 1001


def test_vote_sensitivities_per_query() -> None:
    assert vote_sensitivities(level="agent", vote="one-hot", scale_bits=0, num_classes=10) == (
        1.0,
        1.0,
    )
    l1, l2 = vote_sensitivities(level="instance", vote="one-hot", scale_bits=3, num_classes=10)
    assert (l1, l2) == (16.0, pytest.approx(8 * math.sqrt(2)))
    # soft votes: rounding of C coordinates adds at most √C (L2) and C (L1) per vote
    rng = np.random.default_rng(1)
    u = 2.0**6
    for level in ("agent", "instance"):
        l1, l2 = vote_sensitivities(level=level, vote="soft", scale_bits=6, num_classes=10)
        for _ in range(500):
            p, q = rng.dirichlet(np.ones(10) * 0.3), rng.dirichlet(np.ones(10) * 0.3)
            rp = np.floor(p * u) + (rng.random(10) < p * u - np.floor(p * u))
            rq = np.floor(q * u) + (rng.random(10) < q * u - np.floor(q * u))
            diff = rp if level == "agent" else rp - rq
            assert np.abs(diff).sum() <= l1
            assert np.linalg.norm(diff) <= l2


def test_plan_skellam_per_query_events(setup: tuple[Any, JobPlan, Any]) -> None:
    _job, plan, _ = setup
    d = plan.details
    assert plan.noise_multiplier == 3.0
    assert d.scale_bits == 10  # one-hot votes, Skellam: fine-grained noise
    assert d.noise_total == pytest.approx((3.0 * 1024) ** 2 / 2)
    event = event_from_json(plan.calibration["event"])
    # one coordinate per query: adding or removing an agent moves only the class it voted for
    assert event == SelfComposedEvent(SkellamEvent(d.noise_total, 1024.0, 1024.0, 1), 200)
    # at integer orders (where the Skellam bound is stated) it is within a fraction of a percent
    # of the Gaussian votes' RDP at this scale
    integer = np.array([float(a).is_integer() for a in ORDERS])
    gaussian = VotingEvent(queries=200, sigma=3.0, level="agent")
    voting = rdp_curve(gaussian)[integer]
    skellam = rdp_curve(event)[integer]
    assert np.all(skellam <= voting * 1.001)
    assert np.all(skellam >= voting)
    # and its (ε, δ) comes from the PLD of that coordinate: within 1 % of the Gaussian votes'
    # exact figure, well under its own RDP conversion
    report = compute_epsilon(event, delta=1e-5)
    assert report.method == "pld"
    exact = compute_epsilon(gaussian, delta=1e-5).epsilon
    assert exact * 0.99 <= report.epsilon <= exact * 1.01
    assert report.rdp_epsilon is not None
    assert report.epsilon < 0.95 * report.rdp_epsilon


def test_plan_calibrates_sigma_for_the_target(digits_public: Any) -> None:
    data, _ = digits_public
    for unit, noise in (("agent", "skellam"), ("record", "skellam"), ("record", "gaussian")):
        job = make_pate_job(
            privacy={"unit": unit, "target_epsilon": 8.0, "noise": noise},
            params={"queries": 100, "sigma": None},
        )
        plan = ALGORITHM.plan(job, population=10, data=data)
        event = event_from_json(plan.calibration["event"])
        assert compute_epsilon(event, delta=1e-5).epsilon <= 8.0
        assert plan.calibration["epsilon"] > 7.9
        if noise == "gaussian":
            assert event == VotingEvent(queries=100, sigma=plan.noise_multiplier, level="instance")
            assert plan.details.scale_bits == 0
    soft = ALGORITHM.plan(
        make_pate_job(params={"vote": "soft"}, privacy={"unit": "record"}), population=10, data=data
    )
    bits = soft.details.scale_bits
    ideal = math.sqrt(2) * 2.0**bits
    assert soft.details.l2_sensitivity <= 1.001 * ideal
    assert soft.details.l1_sensitivity == 2 * 2.0**bits + 20


def test_round_tasks_cover_the_queries_once(setup: tuple[Any, JobPlan, Any]) -> None:
    job, plan, state = setup
    t1 = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    t2 = ALGORITHM.bind(job, plan).round_task(state, round_number=2)
    q1, q2 = t1.params.queries, t2.params.queries
    assert len(q1) == len(q2) == 100
    assert not set(q1) & set(q2)
    assert set(q1) | set(q2) == set(state.details["query_order"])
    assert t1.vector_length == 100 * 10
    assert t1.needs_public_data
    assert t1.model_version is None
    json.loads(t1.params.model_dump_json())
    with pytest.raises(AlgorithmError, match="outside"):
        ALGORITHM.bind(job, plan).round_task(state, round_number=3)


def test_charges_exactly_the_answered_queries_to_participants(
    setup: tuple[Any, JobPlan, Any], digits_public: Any
) -> None:
    job, plan, _ = setup
    charges = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=AGENTS)
        .charges(AGENTS[:7])
    )
    assert set(charges) == set(AGENTS[:7])
    charge = charges[AGENTS[0]]
    assert isinstance(charge.event, SelfComposedEvent)
    assert charge.event.count == 100
    assert (charge.unit, charge.approximate, charge.secure_aggregation) == ("agent", False, True)
    assert charge.data_dependent_event is None
    data, _ = digits_public
    odd = make_pate_job(rounds=3, params={"queries": 10})
    odd_plan = ALGORITHM.plan(odd, population=10, data=data)
    counts = [
        ALGORITHM.bind(odd, odd_plan)
        .round_charge(round_number=r, population=AGENTS)
        .charges(AGENTS)[AGENTS[0]]
        .event.count
        for r in (1, 2, 3)
    ]
    assert counts == [4, 3, 3]
    gauss = make_pate_job(
        privacy={"noise": "gaussian", "unit": "record"}, secagg={"enabled": False}
    )
    gauss_plan = ALGORITHM.plan(gauss, population=10, data=data)
    one = (
        ALGORITHM.bind(gauss, gauss_plan)
        .round_charge(round_number=2, population=AGENTS)
        .charges(AGENTS)
    )
    assert one[AGENTS[3]].event == VotingEvent(queries=100, sigma=3.0, level="instance")
    assert (one[AGENTS[3]].approximate, one[AGENTS[3]].secure_aggregation) == (True, False)
    assert one[AGENTS[3]].unit == "record"


def test_finish_round_takes_the_argmax_and_trains_the_student(
    setup: tuple[Any, JobPlan, Any], digits_public: Any
) -> None:
    job, plan, state = setup
    data, _ = digits_public
    outcome = None
    for r in (1, 2):
        batch = list(ALGORITHM.bind(job, plan).round_task(state, round_number=r).params.queries)
        truth = np.asarray(data.public_y)[batch]
        votes = np.zeros((len(batch), 10))
        votes[np.arange(len(batch)), truth] = 9.0  # the teachers agree on the true label
        votes += np.random.default_rng(r).normal(0, 0.5, size=votes.shape)
        wrong = np.arange(len(batch)) % 10 == 0  # ... except on every tenth query
        votes[wrong, (truth[wrong] + 1) % 10] = 20.0
        outcome = ALGORITHM.bind(job, plan).finish_round(
            state, data, round_number=r, aggregate=votes.reshape(-1), survivors=10
        )
        state = outcome.state
        assert outcome.metrics["pseudo_label_accuracy"] == pytest.approx(0.9)
    assert outcome is not None
    assert outcome.done
    assert outcome.state.model is not None
    assert outcome.state.model_version == 1
    assert outcome.metrics["answered_queries"] == 200
    assert outcome.metrics["accuracy"] > 0.7
    informational = ALGORITHM.bind(job, plan).informational_data_dependent_event(state)
    assert isinstance(informational, ComposedEvent)
    assert all(isinstance(e, DataDependentVotingEvent) for e in informational.events)
    with pytest.raises(AlgorithmError, match="shape"):
        ALGORITHM.bind(job, plan).finish_round(
            state, data, round_number=1, aggregate=np.zeros(7), survivors=10
        )


def _round(setup: tuple[Any, JobPlan, Any], survivors: int = 10) -> tuple[dict, list, Any]:
    job, plan, state = setup
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    config = ALGORITHM.bind(job, plan).encoding(task, participants=10, min_survivors=survivors)
    events = list(ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=AGENTS))
    return task.params.to_json(), events, config


def test_agent_votes_with_a_cached_teacher(
    setup: tuple[Any, JobPlan, Any], digits_public: Any
) -> None:
    params, _, _ = _round(setup)
    data, agents = digits_public
    teachers.clear_teacher_cache()
    votes = ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
        agents[0], model=None, public_x=data.public_x, device="cpu"
    )
    assert teachers.teacher_cache_size() == 1
    block = votes.reshape(100, 10)
    assert set(np.unique(block)) <= {0.0, 1.0}
    assert np.all(block.sum(axis=1) == 1.0)
    # the next round reuses the teacher; another job (or other data) trains its own
    again = ALGORITHM.agent(ALGORITHM.parse_task({**params, "round": 2})).compute(
        agents[0], model=None, public_x=data.public_x, device="cpu"
    )
    np.testing.assert_array_equal(votes, again)
    assert teachers.teacher_cache_size() == 1
    ALGORITHM.agent(ALGORITHM.parse_task({**params, "job_id": "other"})).compute(
        agents[0], model=None, public_x=data.public_x, device="cpu"
    )
    ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
        agents[1], model=None, public_x=data.public_x, device="cpu"
    )
    assert teachers.teacher_cache_size() == 3
    soft = (
        ALGORITHM.agent(ALGORITHM.parse_task({**params, "vote": "soft"}))
        .compute(agents[0], model=None, public_x=data.public_x, device="cpu")
        .reshape(100, 10)
    )
    assert np.all(soft >= 0)
    assert np.all(soft.sum(axis=1) <= 1.0)
    assert np.all(np.linalg.norm(soft, axis=1) <= 1.0)
    with pytest.raises(AlgorithmError, match="public examples"):
        ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
            agents[0], model=None, public_x=None, device="cpu"
        )
    with pytest.raises(AlgorithmError, match=r"params\.queries: every index must lie in"):
        ALGORITHM.agent(ALGORITHM.parse_task({**params, "queries": [10**6]})).compute(
            agents[0], model=None, public_x=data.public_x, device="cpu"
        )


def test_agent_check_accepts_and_refuses(setup: tuple[Any, JobPlan, Any]) -> None:
    params, events, config = _round(setup, survivors=9)

    def check(p: Any = params, e: Any = events, c: Any = config, **kw: Any) -> None:
        args = {"num_clients": 10, "min_survivors": 9, "honest_fraction": 1.0, **kw}
        ALGORITHM.agent(ALGORITHM.parse_task(p)).check(e, c, **args)

    check()
    inner = events[0].event
    with pytest.raises(AlgorithmError, match="expected 100 per-query"):
        check(e=[SelfComposedEvent(inner, 50)])
    with pytest.raises(AlgorithmError, match="L2"):
        check(e=[SelfComposedEvent(SkellamEvent(inner.mu, inner.l1_sensitivity, 1.0, 1), 100)])
    whole = SkellamEvent(inner.mu, inner.l1_sensitivity, inner.l2_sensitivity, 10)
    with pytest.raises(AlgorithmError, match="dimension 10, the task 1"):
        check(e=[SelfComposedEvent(whole, 100)])
    with pytest.raises(AlgorithmError, match="below"):
        check(min_survivors=5)
    stronger = SkellamEvent(inner.mu * 2, inner.l1_sensitivity, inner.l2_sensitivity, 1)
    with pytest.raises(AlgorithmError, match="below"):
        check(e=[SelfComposedEvent(stronger, 100)])
    with pytest.raises(AlgorithmError, match="only describes Gaussian"):
        check(e=[VotingEvent(queries=100, sigma=3.0, level="agent")])
    with pytest.raises(AlgorithmError, match="Skellam noise but a GaussianEvent is claimed"):
        check(e=[SelfComposedEvent(GaussianEvent(3.0, 1.0), 100)])
    # a record-level task moves two classes of a query: every class is the release's dimension
    with pytest.raises(AlgorithmError, match="dimension 1, the task 10"):
        check(p={**params, "level": "instance", "unit": "record"})
    with pytest.raises(AlgorithmError, match="L1"):
        check(
            p={**params, "level": "instance", "unit": "record"}, e=[SelfComposedEvent(whole, 100)]
        )
    other_scale = EncodingConfig(
        clip=config.clip, scale_bits=0, ring_bits=config.ring_bits, noise=config.noise
    )
    with pytest.raises(AlgorithmError, match="scale"):
        check(c=other_scale)
    wrong_clip = EncodingConfig(
        clip=3.0, scale_bits=config.scale_bits, ring_bits=config.ring_bits, noise=config.noise
    )
    with pytest.raises(AlgorithmError, match="clip"):
        check(c=wrong_clip)
    with pytest.raises(AlgorithmError, match="teacher"):
        check(p={**params, "teacher": None})
    with pytest.raises(AlgorithmError, match="epochs"):
        check(p={**params, "teacher": {**params["teacher"], "epochs": 0}})


def test_agent_check_gaussian_votes(digits_public: Any) -> None:
    data, _ = digits_public
    job = make_pate_job(privacy={"noise": "gaussian", "unit": "record"})
    plan = ALGORITHM.plan(job, population=10, data=data)
    state = ALGORITHM.bind(job, plan).initial_state(data)
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=2)
    config = ALGORITHM.bind(job, plan).encoding(task, participants=10, min_survivors=10)
    (event,) = ALGORITHM.bind(job, plan).invitation_events(round_number=2, population=AGENTS)
    assert event == VotingEvent(queries=100, sigma=3.0, level="instance")
    kw = {"num_clients": 10, "min_survivors": 10, "honest_fraction": 1.0}
    ALGORITHM.agent(ALGORITHM.parse_task(task.params.to_json())).check([event], config, **kw)
    assert config.noise.parameter**2 * 10 >= 9.0
    with pytest.raises(AlgorithmError, match="level"):
        ALGORITHM.agent(ALGORITHM.parse_task(task.params.to_json())).check(
            [VotingEvent(queries=100, sigma=3.0, level="agent")], config, **kw
        )
    weak = EncodingConfig(
        clip=config.clip,
        scale_bits=0,
        ring_bits=config.ring_bits,
        noise=NoiseSpec.discrete_gaussian(sigma=0.5),
    )
    with pytest.raises(AlgorithmError, match="below"):
        ALGORITHM.agent(ALGORITHM.parse_task(task.params.to_json())).check([event], weak, **kw)


def test_initial_state_needs_enough_public_examples(digits_public: Any) -> None:
    data, _ = digits_public
    job = make_pate_job(params={"queries": 5000})
    plan = ALGORITHM.plan(job, population=10, data=data)
    with pytest.raises(AlgorithmError, match="exceeds"):
        ALGORITHM.bind(job, plan).initial_state(data)
    no_public = CoordinatorData(input_shape=data.input_shape, num_classes=10)
    with pytest.raises(AlgorithmError, match="public pool"):
        ALGORITHM.bind(make_pate_job(), plan).initial_state(no_public)


def test_a_task_whose_unit_does_not_fit_its_vote_level_is_refused(
    setup: tuple[Any, JobPlan, Any],
) -> None:
    # a coordinator that sends agent-level votes (add/remove sensitivities) under a record unit
    # would have the agent's ledger compose them as replace-one releases, below their true cost
    job, plan, state = setup
    raw = ALGORITHM.bind(job, plan).round_task(state, round_number=1).params.to_json()
    assert ALGORITHM.parse_task(raw).level == "agent"
    for unit, level in (("record", "agent"), ("agent", "instance")):
        with pytest.raises(AlgorithmError, match="does not fit privacy unit"):
            ALGORITHM.parse_task({**raw, "unit": unit, "level": level})
    assert ALGORITHM.parse_task({**raw, "unit": "record", "level": "instance"}).unit == "record"
