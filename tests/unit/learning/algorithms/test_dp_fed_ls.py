"""DP-Fed-LS: FFT smoothing against a dense solve, fixed-size client sampling with replace-one
accounting, the closed forms beside the exact calibration, charges, agent checks, a whole job."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_job, run_job

from dpfl.accounting import (
    GaussianEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
    event_from_json,
    rdp_curve,
)
from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData, JobPlan
from dpfl.learning.algorithms.dp_fed_ls import ALGORITHM, DpFedLs, sample_size, uniform_sample
from dpfl.learning.algorithms.parts.smoothing import laplacian_smooth, smooth_pieces
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters, model_from_bytes, model_signature
from dpfl.secagg import SeededRandomSource

POPULATION = [f"agent-{i:03d}" for i in range(40)]


def chain_laplacian(d: int) -> np.ndarray:
    """2I − P − Pᵀ for the cyclic shift P (diagonal 2, off-diagonals and corners −1)."""
    shift = np.roll(np.eye(d), 1, axis=1)
    return 2.0 * np.eye(d) - shift - shift.T


def ls_job(**overrides: Any) -> Any:
    params = {"sigma_ls": 1.0, "client_sampling": "uniform", **overrides.pop("params", {})}
    doc = {"algorithm": "dp-fed-ls", "name": "ls", "rounds": 5, **overrides}
    return make_job(params=params, **doc)


@pytest.fixture(scope="module")
def uniform_plan(digits_coordinator: CoordinatorData) -> tuple[Any, JobPlan]:
    job = ls_job()
    return job, ALGORITHM.plan(job, population=40, data=digits_coordinator)


# -- smoothing -------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 2, 3, 8, 65, 650])
@pytest.mark.parametrize("sigma", [0.0, 0.3, 1.0, 7.5])
def test_fft_smoothing_solves_the_dense_system(d: int, sigma: float) -> None:
    v = np.random.default_rng(d).normal(size=d)
    dense = np.eye(d) + sigma * chain_laplacian(d)
    x = laplacian_smooth(v, sigma)
    np.testing.assert_allclose(x, np.linalg.solve(dense, v), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dense @ x, v, rtol=1e-10, atol=1e-12)
    assert x.mean() == pytest.approx(v.mean(), abs=1e-12)  # the k = 0 eigenvalue is 1


def test_zero_sigma_is_the_identity_and_smoothing_damps_high_frequencies() -> None:
    v = np.random.default_rng(0).normal(size=100)
    out = laplacian_smooth(v, 0.0)
    assert out is not v
    np.testing.assert_array_equal(out, v)
    np.testing.assert_array_equal(smooth_pieces(v, 0.0, [30, 70]), v)
    alternating = np.array([1.0, -1.0] * 50)  # the highest frequency: eigenvalue 1 + 4σ
    np.testing.assert_allclose(laplacian_smooth(alternating, 2.0), alternating / 9.0)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(AlgorithmError, match="sigma_ls"):
            laplacian_smooth(v, bad)
    with pytest.raises(AlgorithmError, match="1-D"):
        laplacian_smooth(np.ones((2, 2)), 1.0)


def test_per_tensor_smoothing_solves_one_system_per_tensor() -> None:
    sizes = [640, 10]  # the logreg's weight and bias
    v = np.random.default_rng(1).normal(size=650)
    per_tensor = smooth_pieces(v, 1.5, sizes)
    expected = np.concatenate(
        [
            np.linalg.solve(np.eye(640) + 1.5 * chain_laplacian(640), v[:640]),
            np.linalg.solve(np.eye(10) + 1.5 * chain_laplacian(10), v[640:]),
        ]
    )
    np.testing.assert_allclose(per_tensor, expected, rtol=1e-10, atol=1e-12)
    whole = smooth_pieces(v, 1.5, None)
    np.testing.assert_allclose(
        whole, np.linalg.solve(np.eye(650) + 1.5 * chain_laplacian(650), v), rtol=1e-10
    )
    assert not np.allclose(whole, per_tensor)
    with pytest.raises(AlgorithmError, match="do not split"):
        smooth_pieces(v, 1.0, [600, 10])


# -- plan and sampling -----------------------------------------------------------------------


def test_registered_under_its_tag() -> None:
    assert get_algorithm("dp-fed-ls") is ALGORITHM


def test_uniform_plan_accounts_replace_one_without_replacement(
    uniform_plan: tuple[Any, JobPlan],
) -> None:
    _, plan = uniform_plan
    d = plan.details
    assert d.sample_size == 12 == sample_size(0.3, 40)
    assert d.expected_participants == 12.0
    event = event_from_json(plan.calibration["event"])
    inner = SkellamEvent(d.noise_total, 2 * d.l1_sensitivity, 2 * d.l2_sensitivity, d.dimension)
    assert event == SelfComposedEvent(SampledWithoutReplacementEvent(40, 12, inner), 5)
    assert plan.calibration["epsilon"] <= 4.0
    assert compute_epsilon(event, delta=1e-5).epsilon <= 4.0
    assert plan.details.round_event(plan.population) == event.event
    assert ALGORITHM.parse_plan(json.loads(json.dumps(plan.to_json()))) == plan


@pytest.mark.slow
def test_plan_reports_the_closed_forms_for_both_samplings(
    uniform_plan: tuple[Any, JobPlan], digits_coordinator: CoordinatorData
) -> None:
    _, plan = uniform_plan
    closed = plan.calibration["closed_form"]
    assert closed["target_epsilon"] == 4.0
    for sampling, c in (("uniform", 14), ("poisson", 8)):
        entry = closed[sampling]
        assert entry["noise_multiplier"] > 0
        assert f"c = {c}" in entry["note"]
        assert 0 < entry["parameter"] < 1  # the optimised λ
        assert entry["accountant_epsilon"] > 0  # the exact ε at the closed form's ν
    # uniform sampling needs more noise than Poisson in the closed form (14 vs 8)
    assert closed["uniform"]["noise_multiplier"] > closed["poisson"]["noise_multiplier"]
    poisson = ALGORITHM.plan(
        ls_job(params={"client_sampling": "poisson"}), population=40, data=digits_coordinator
    )
    event = event_from_json(poisson.calibration["event"])
    assert isinstance(event, SelfComposedEvent)
    assert isinstance(event.event, PoissonSampledEvent)
    assert poisson.calibration["closed_form"]["poisson"]["noise_multiplier"] == pytest.approx(
        closed["poisson"]["noise_multiplier"]
    )
    # a given noise: the closed forms are computed for the ε the plan reaches
    given = ALGORITHM.plan(
        ls_job(privacy={"target_epsilon": None, "noise_multiplier": 8.0}),
        population=40,
        data=digits_coordinator,
    )
    assert given.calibration["closed_form"]["target_epsilon"] == given.calibration["epsilon"]


def test_uniform_sample_draws_exactly_m_uniformly() -> None:
    stream_source = SeededRandomSource(b"uniform-sample-seed-0")
    counts: Counter[str] = Counter()
    for r in range(400):
        chosen = uniform_sample(POPULATION, 12, stream_source.stream(str(r)))
        assert len(chosen) == len(set(chosen)) == 12
        counts.update(chosen)
    expected = 400 * 12 / 40  # 120 per member, sd ≈ 9.2
    assert max(abs(counts[m] - expected) for m in POPULATION) < 6 * math.sqrt(expected * 0.7)
    assert sorted(uniform_sample(POPULATION[:5], 12, stream_source.stream("x"))) == POPULATION[:5]
    with pytest.raises(AlgorithmError, match="sample size"):
        uniform_sample(POPULATION, 0, stream_source.stream("y"))


def test_select_uses_the_plans_sample_size(uniform_plan: tuple[Any, JobPlan]) -> None:
    job, plan = uniform_plan
    alg = DpFedLs(random_source=SeededRandomSource(b"fed-ls-select-seed-00"))
    first = alg.bind(job, plan).select(round_number=1, population=POPULATION)
    assert len(first) == 12
    assert first != alg.bind(job, plan).select(round_number=2, population=POPULATION)
    again = DpFedLs(random_source=SeededRandomSource(b"fed-ls-select-seed-00"))
    assert again.bind(job, plan).select(round_number=1, population=POPULATION) == first


def test_charges_every_member_with_the_round_population(uniform_plan: tuple[Any, JobPlan]) -> None:
    job, plan = uniform_plan
    charges = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=POPULATION[:30])
        .charges(POPULATION[:12])
    )
    assert set(charges) == set(POPULATION[:30])
    event = charges[POPULATION[29]].event
    # a smaller population than planned raises the sampling ratio: charged, never below
    assert isinstance(event, SampledWithoutReplacementEvent)
    assert (event.population, event.sample_size) == (30, 12)
    assert np.all(rdp_curve(event) >= rdp_curve(plan.details.round_event(plan.population)) - 1e-12)
    # everybody sampled: no amplification, still replace-one sensitivities
    few = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=POPULATION[:10])
        .charges(POPULATION[:10])
    )
    bare = few[POPULATION[0]].event
    assert isinstance(bare, SkellamEvent)
    assert bare.l2_sensitivity == 2 * plan.details.l2_sensitivity


def test_without_secure_aggregation_participants_pay_the_local_event(
    digits_coordinator: CoordinatorData,
) -> None:
    job = ls_job(secagg={"enabled": False}, privacy={"noise": "gaussian"})
    plan = ALGORITHM.plan(job, population=40, data=digits_coordinator)
    charges = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=POPULATION)
        .charges(POPULATION[:3])
    )
    assert set(charges) == set(POPULATION[:3])
    charge = charges[POPULATION[0]]
    assert isinstance(charge.event, GaussianEvent)
    assert charge.event.sensitivity == 2 * plan.details.l2_sensitivity
    assert (charge.secure_aggregation, charge.approximate) == (False, True)


# -- agent side ------------------------------------------------------------------------------


def _round(job: Any, plan: JobPlan) -> tuple[dict, list, Any]:
    state = ALGORITHM.bind(job, plan).initial_state(CoordinatorData((1, 8, 8), 10))
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    config = ALGORITHM.bind(job, plan).encoding(task, participants=12, min_survivors=11)
    events = list(
        ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=POPULATION)
    )
    return task.params.to_json(), events, config


def test_agent_checks_the_fixed_size_claim(uniform_plan: tuple[Any, JobPlan]) -> None:
    job, plan = uniform_plan
    params, events, config = _round(job, plan)
    assert params["client_sampling"] == "uniform"
    assert params["sample_size"] == 12

    def check(p: Any = params, e: Any = events, **kw: Any) -> None:
        args = {"num_clients": 12, "min_survivors": 11, "honest_fraction": 1.0, **kw}
        ALGORITHM.agent(ALGORITHM.parse_task(p)).check(e, config, **args)

    check()
    inner = events[0].event
    check(e=[inner])  # no amplification claimed: more conservative, accepted
    with pytest.raises(AlgorithmError, match="not Poisson"):
        check(e=[PoissonSampledEvent(0.3, inner)])
    with pytest.raises(AlgorithmError, match="13 of 40"):
        check(e=[SampledWithoutReplacementEvent(40, 13, inner)])
    add_remove = SkellamEvent(
        inner.mu, inner.l1_sensitivity / 2, inner.l2_sensitivity / 2, inner.dimension
    )
    with pytest.raises(AlgorithmError, match="L2 sensitivity"):
        check(e=[SampledWithoutReplacementEvent(40, 12, add_remove)])
    with pytest.raises(AlgorithmError, match="below"):
        check(min_survivors=5)
    with pytest.raises(AlgorithmError, match="client_sampling"):
        check(p={**params, "client_sampling": "both"})
    (recorded,) = ALGORITHM.agent(ALGORITHM.parse_task(params)).charge(events)
    assert recorded == inner  # the agent keeps no client-sampling amplification


def test_finish_round_smooths_the_averaged_update(digits_coordinator: CoordinatorData) -> None:
    job = ls_job(params={"server_momentum": 0.0, "sigma_ls": 2.0})
    plan = ALGORITHM.plan(job, population=40, data=digits_coordinator)
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    theta0 = flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64)
    aggregate = np.random.default_rng(3).normal(size=650)
    out = ALGORITHM.bind(job, plan).finish_round(
        state, digits_coordinator, round_number=1, aggregate=aggregate, survivors=11
    )
    theta1 = flatten_parameters(model_from_bytes(out.state.model, model=net), dtype=np.float64)
    sizes = [t.size for t in model_signature(net).tensors]
    expected = theta0 + smooth_pieces(aggregate / 12.0, 2.0, sizes)  # divided by m = 12
    np.testing.assert_allclose(theta1, expected, rtol=1e-5, atol=1e-6)
    vector = ls_job(params={"server_momentum": 0.0, "sigma_ls": 2.0, "smoothing_scope": "vector"})
    out = ALGORITHM.bind(vector, plan).finish_round(
        state, digits_coordinator, round_number=1, aggregate=aggregate, survivors=11
    )
    theta1 = flatten_parameters(model_from_bytes(out.state.model, model=net), dtype=np.float64)
    np.testing.assert_allclose(
        theta1, theta0 + laplacian_smooth(aggregate / 12.0, 2.0), rtol=1e-5, atol=1e-6
    )


def test_whole_job_with_fixed_size_sampling() -> None:
    job = ls_job(rounds=3, params={"sampling_rate": 0.5})
    result = run_job(
        job,
        num_agents=10,
        algorithm=DpFedLs(random_source=SeededRandomSource(b"fed-ls-whole-job-seed")),
    )
    assert [len(r.invited) for r in result.rounds] == [5, 5, 5]
    planned = compute_epsilon(event_from_json(result.plan.calibration["event"]), delta=1e-5)
    for client in result.population:
        assert len(result.ledger[client]) == 3  # every member, every round
        assert result.epsilon(client) == pytest.approx(planned.epsilon, rel=1e-9)
    for client, events in result.agent_ledgers.items():
        assert all(isinstance(e, SkellamEvent) for e in events)
        assert len(events) == sum(client in r.participants for r in result.rounds)
    assert 0.0 <= result.final_metrics["accuracy"] <= 1.0
