"""Private-kNN-FL: nearest neighbours and their tie-break, votes summing to one, the one-swap
sensitivity (also after the encoder's rounding), calibration, charges, agent checks, a job."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_pate_job, run_job

from dpfl.accounting import (
    ComposedEvent,
    DataDependentVotingEvent,
    GaussianEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
    event_from_json,
)
from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData, JobPlan
from dpfl.learning.algorithms.private_knn_fl import (
    ALGORITHM,
    knn_sensitivities,
    knn_votes,
    neighbour_count,
    neighbours_of,
)
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.mechanisms import EncodingConfig, NoiseSpec, centre, encode
from dpfl.secagg import SeededRandomSource

AGENTS = [f"agent-{i}" for i in range(10)]


def knn_job(**overrides: Any) -> Any:
    params = {"queries": 60, "k": 5, "sigma": 2.0, "student_epochs": 10}
    params.update(overrides.pop("params", {}))
    doc = {
        "algorithm": "private-knn-fl",
        "name": "knn",
        "rounds": 1,
        "privacy": {"unit": "record"},
        **overrides,
    }
    return make_pate_job(params=params, **doc)


@pytest.fixture(scope="module")
def setup(digits_public: tuple[CoordinatorData, list[AgentData]]) -> tuple[Any, JobPlan, Any]:
    data, _ = digits_public
    job = knn_job()
    plan = ALGORITHM.plan(job, population=10, data=data)
    return job, plan, ALGORITHM.bind(job, plan).initial_state(data)


def test_neighbours_match_brute_force_and_break_ties_by_index() -> None:
    rng = np.random.default_rng(0)
    records, queries = rng.normal(size=(50, 6)), rng.normal(size=(7, 6))
    found = neighbours_of(records, queries, 4)
    for q, row in zip(queries, found, strict=True):
        distances = [float(np.sum((r - q) ** 2)) for r in records]
        assert list(row) == sorted(range(50), key=lambda j: (distances[j], j))[:4]
    tied = np.zeros((6, 2))  # every record at the same distance: the lowest indices win
    assert neighbours_of(tied, np.ones((1, 2)), 3).tolist() == [[0, 1, 2]]
    assert neighbours_of(records[:3], queries, 10).shape == (7, 3)  # min(k, M)
    with pytest.raises(AlgorithmError, match="do not match"):
        neighbours_of(records, rng.normal(size=(2, 5)), 3)


def test_replacing_one_record_swaps_at_most_one_neighbour() -> None:
    rng = np.random.default_rng(1)
    k = 5
    worst = 0.0
    for trial in range(200):
        records = rng.integers(0, 3, size=(30, 2)).astype(float)  # many exact ties
        labels = rng.integers(0, 4, size=30)
        queries = rng.integers(0, 3, size=(5, 2)).astype(float)
        j = int(rng.integers(30))
        other, other_labels = records.copy(), labels.copy()
        other[j] = rng.integers(0, 3, size=2)
        other_labels[j] = rng.integers(0, 4)
        a = neighbours_of(records, queries, k)
        b = neighbours_of(other, queries, k)
        for row_a, row_b in zip(a, b, strict=True):  # one swap at most
            assert len(set(row_a) - set(row_b)) <= 1
            assert len(set(row_b) - set(row_a)) <= 1
        va = knn_votes(labels[a], k=k, num_classes=4)
        vb = knn_votes(other_labels[b], k=k, num_classes=4)
        diff = np.linalg.norm(va - vb, axis=1)
        worst = max(worst, float(diff.max()))
        assert np.all(diff <= math.sqrt(2) / k + 1e-12), trial
        assert np.all(np.abs(va - vb).sum(axis=1) <= 2 / k + 1e-12)
    assert worst == pytest.approx(math.sqrt(2) / k)  # the bound is attained


def test_votes_sum_to_one_per_agent_and_query(
    setup: tuple[Any, JobPlan, Any], digits_public: tuple[CoordinatorData, list[AgentData]]
) -> None:
    job, plan, state = setup
    data, agents = digits_public
    params = ALGORITHM.bind(job, plan).round_task(state, round_number=1).params.to_json()
    for agent in agents:
        votes = (
            ALGORITHM.agent(ALGORITHM.parse_task(params))
            .compute(agent, model=None, public_x=data.public_x, device="cpu")
            .reshape(-1, 10)
        )
        assert votes.shape == (60, 10)
        np.testing.assert_allclose(votes.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        assert np.all(np.linalg.norm(votes, axis=1) <= 1.0)
        np.testing.assert_allclose(votes * 5, np.round(votes * 5), atol=1e-12)  # counts / k
    # a larger k for larger agents (k_i = max(k, ⌊fraction·M_i⌋)): still sums to one
    bigger = (
        ALGORITHM.agent(ALGORITHM.parse_task({**params, "k_fraction": 0.1}))
        .compute(agents[0], model=None, public_x=data.public_x, device="cpu")
        .reshape(-1, 10)
    )
    k_i = neighbour_count(5, 0.1, len(agents[0].y))
    assert k_i > 5
    np.testing.assert_allclose(bigger.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(bigger * k_i, np.round(bigger * k_i), atol=1e-9)
    # an agent with fewer records than k votes with all of them, still divided by k
    tiny = AgentData(agents[0].x[:3], agents[0].y[:3], agents[0].input_shape, 10)
    small = (
        ALGORITHM.agent(ALGORITHM.parse_task(params))
        .compute(tiny, model=None, public_x=data.public_x, device="cpu")
        .reshape(-1, 10)
    )
    np.testing.assert_allclose(small.sum(axis=1), 3 / 5)
    with pytest.raises(AlgorithmError, match="public examples"):
        ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
            agents[0], model=None, public_x=None, device="cpu"
        )


@pytest.mark.parametrize("level", ["agent", "instance"])
def test_rounded_votes_stay_within_the_charged_sensitivity(level: str) -> None:
    k, classes, bits = 4, 10, 8
    l1, l2 = knn_sensitivities(level=level, k=k, scale_bits=bits, num_classes=classes)
    source = SeededRandomSource(b"knn-rounding-seed-000")
    rng = np.random.default_rng(2)
    config = EncodingConfig(clip=1.0 + 1e-9, scale_bits=bits, ring_bits=64)
    for trial in range(300):
        counts = rng.multinomial(k, rng.dirichlet(np.ones(classes)))
        vote = counts / k
        if level == "agent":
            other = np.zeros(classes)
        else:  # one neighbour swapped for a record of another class
            other_counts = counts.copy()
            src = int(rng.choice(np.flatnonzero(counts)))
            other_counts[src] -= 1
            other_counts[int(rng.integers(classes))] += 1
            other = other_counts / k
        a = centre(encode(vote, config=config, stream=source.stream(f"a{trial}")), 64)
        b = centre(encode(other, config=config, stream=source.stream(f"b{trial}")), 64)
        assert np.abs(a - b).sum() <= l1
        assert np.linalg.norm(a - b) <= l2


def test_plan_charges_skellam_queries_with_k(setup: tuple[Any, JobPlan, Any]) -> None:
    _, plan, _ = setup
    d = plan.details
    assert get_algorithm("private-knn-fl") is ALGORITHM
    assert (d.k, d.level, d.noise) == (5, "instance", "skellam")
    u = 2.0**d.scale_bits
    assert 2 * math.sqrt(10) <= 0.001 * math.sqrt(2) * u / 5  # rounding ≤ 0.1 % of the data
    l1, l2 = knn_sensitivities(level="instance", k=5, scale_bits=d.scale_bits, num_classes=10)
    assert (d.l1_sensitivity, d.l2_sensitivity) == (l1, l2)
    event = event_from_json(plan.calibration["event"])
    assert event == SelfComposedEvent(SkellamEvent((2.0 * u) ** 2 / 2, l1, l2, 10), 60)
    # the instance-level charge with k is the Gaussian α/(k²σ²) per query up to rounding
    # (the closed form α/(kσ²) is k times more conservative)
    eps = compute_epsilon(event, delta=1e-5, tight=False).epsilon
    gaussian = compute_epsilon(  # RDP alone on both sides
        SelfComposedEvent(GaussianEvent(2.0, math.sqrt(2) / 5), 60), delta=1e-5, tight=False
    ).epsilon
    assert gaussian <= eps <= 1.05 * gaussian


def test_plan_calibrates_both_levels_and_the_gaussian_option(digits_public: Any) -> None:
    data, _ = digits_public
    for unit, noise in (("agent", "skellam"), ("record", "gaussian")):
        job = knn_job(
            privacy={"unit": unit, "target_epsilon": 3.0, "noise": noise},
            params={"sigma": None},
        )
        plan = ALGORITHM.plan(job, population=10, data=data)
        event = event_from_json(plan.calibration["event"])
        assert 2.9 < compute_epsilon(event, delta=1e-5).epsilon <= 3.0
        charge = (
            ALGORITHM.bind(job, plan)
            .round_charge(round_number=1, population=AGENTS)
            .charges(AGENTS)[AGENTS[0]]
        )
        assert charge.approximate == (noise == "gaussian")
        assert charge.unit == unit
        query = charge.event.event
        assert isinstance(query, GaussianEvent if noise == "gaussian" else SkellamEvent)


def test_charges_only_voters_and_local_dp_without_secure_aggregation(
    digits_public: Any,
) -> None:
    data, _ = digits_public
    job = knn_job(secagg={"enabled": False})
    plan = ALGORITHM.plan(job, population=10, data=data)
    charges = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=AGENTS)
        .charges(AGENTS[:4])
    )
    assert set(charges) == set(AGENTS[:4])
    charge = charges[AGENTS[0]]
    assert (charge.secure_aggregation, charge.honest_fraction) == (False, 1.0)
    assert charge.event.count == 60


def _round(setup: tuple[Any, JobPlan, Any], survivors: int = 9) -> tuple[dict, list, Any]:
    job, plan, state = setup
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    config = ALGORITHM.bind(job, plan).encoding(task, participants=10, min_survivors=survivors)
    events = list(ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=AGENTS))
    return task.params.to_json(), events, config


def test_per_agent_noise_sums_to_the_target_over_honest_survivors(
    setup: tuple[Any, JobPlan, Any],
) -> None:
    job, plan, state = setup
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    target = plan.details.noise_total
    for honest, survivors in ((1.0, 9), (0.5, 8), (0.8, 10)):
        p = JobPlan(
            plan.noise_multiplier,
            plan.calibration,
            plan.population,
            plan.details.model_copy(update={"honest_fraction": honest}),
        )
        config = ALGORITHM.bind(job, p).encoding(task, participants=10, min_survivors=survivors)
        share = config.noise.parameter
        assert share * (honest * survivors) >= target
        # split over t·N(1−δ) = t·9.5 of the 10 voters (default dropout 0.05), never below what
        # the t·m_s guaranteed honest survivors need (m_s = 9 < 9.5)
        count = honest * min(10 * (1 - 0.05), survivors)
        assert share * count == pytest.approx(target, rel=1e-12)
        # variance: those honest agents' Skellam shares add to the charged 2μ
        assert config.noise.variance * count == pytest.approx(2 * target, rel=1e-12)


def test_agent_check_accepts_and_refuses(setup: tuple[Any, JobPlan, Any]) -> None:
    params, events, config = _round(setup)

    def check(p: Any = params, e: Any = events, c: Any = config, **kw: Any) -> None:
        args = {"num_clients": 10, "min_survivors": 9, "honest_fraction": 1.0, **kw}
        ALGORITHM.agent(ALGORITHM.parse_task(p)).check(e, c, **args)

    check()
    inner = events[0].event
    with pytest.raises(AlgorithmError, match="L1 sensitivity"):
        check(p={**params, "k": 10})  # the claim was made for k = 5
    with pytest.raises(AlgorithmError, match="L1"):
        check(p={**params, "level": "agent", "unit": "agent"})
    with pytest.raises(AlgorithmError, match="per-query events"):
        check(e=[SelfComposedEvent(inner, 30)])
    with pytest.raises(AlgorithmError, match="below"):
        check(min_survivors=4)
    weak = EncodingConfig(
        clip=config.clip,
        scale_bits=config.scale_bits,
        ring_bits=config.ring_bits,
        noise=NoiseSpec.skellam(mu=config.noise.parameter / 2),
    )
    with pytest.raises(AlgorithmError, match="below"):
        check(c=weak)
    with pytest.raises(AlgorithmError, match=r"params\.k"):
        check(p={**params, "k": 0})


def test_whole_job_labels_public_digits() -> None:
    job = knn_job(
        rounds=2, privacy={"unit": "record", "target_epsilon": 4.0}, params={"sigma": None}
    )
    result = run_job(job, num_agents=10)
    metrics = result.final_metrics
    assert metrics["answered_queries"] == 60
    assert metrics["pseudo_label_accuracy"] >= 0.6, metrics
    planned = compute_epsilon(event_from_json(result.plan.calibration["event"]), delta=1e-5)
    for client in result.population:
        assert sum(c.event.count for c in result.ledger[client]) == 60
        assert all(c.unit == "record" and not c.approximate for c in result.ledger[client])
        assert result.epsilon(client) == pytest.approx(planned.epsilon, rel=1e-9)
        assert result.agent_epsilon(client) == pytest.approx(result.epsilon(client))
    informational = ALGORITHM.bind(job, result.plan).informational_data_dependent_event(
        result.state
    )
    assert isinstance(informational, ComposedEvent)
    assert all(isinstance(e, DataDependentVotingEvent) and e.k == 5 for e in informational.events)
