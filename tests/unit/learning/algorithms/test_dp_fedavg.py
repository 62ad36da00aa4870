"""DP-FedAvg: calibration, sampling, update rule, clipping, noise split, charges, agent checks."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_job

from dpfl.accounting import (
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
    event_from_json,
    rdp_curve,
)
from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData, JobPlan
from dpfl.learning.algorithms.dp_fedavg import ALGORITHM, DpFedAvg
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters, model_from_bytes
from dpfl.learning.training import local_update
from dpfl.mechanisms import EncodingConfig, NoiseKind, NoiseSpec
from dpfl.secagg import SeededRandomSource

POPULATION = [f"agent-{i:03d}" for i in range(100)]


@pytest.fixture(scope="module")
def job() -> Any:
    return make_job()


@pytest.fixture(scope="module")
def plan(job: Any, digits_coordinator: CoordinatorData) -> JobPlan:
    return ALGORITHM.plan(job, population=100, data=digits_coordinator)


def test_registered_under_its_tag() -> None:
    assert get_algorithm("dp-fedavg") is ALGORITHM
    assert ALGORITHM.name == "dp-fedavg"


def test_plan_calibrates_the_skellam_event_directly(plan: JobPlan) -> None:
    d = plan.details
    assert d.dimension == 8 * 8 * 10 + 10
    assert d.expected_participants == pytest.approx(30.0)
    config = EncodingConfig(clip=1.0, scale_bits=d.scale_bits, ring_bits=64)
    assert d.l2_sensitivity == config.rounded_l2_bound(650)
    assert d.l1_sensitivity == config.rounded_l1_bound(650)
    assert d.l2_sensitivity <= 1.001 * config.scaled_clip  # the automatic scale rule
    # μ from z: √(2μ) = z·Δ₂, and the whole job meets the target at δ
    assert math.sqrt(2 * d.noise_total) == pytest.approx(plan.noise_multiplier * d.l2_sensitivity)
    event = event_from_json(plan.calibration["event"])
    assert event == SelfComposedEvent(
        PoissonSampledEvent(
            0.3, SkellamEvent(d.noise_total, d.l1_sensitivity, d.l2_sensitivity, 650)
        ),
        10,
    )
    eps = compute_epsilon(event, delta=1e-5).epsilon
    assert eps <= 4.0
    assert eps > 3.9  # calibrated, not wasteful
    assert ALGORITHM.parse_plan(json.loads(json.dumps(plan.to_json()))) == plan


@pytest.mark.slow
def test_plan_variants(job: Any, digits_coordinator: CoordinatorData) -> None:
    gaussian = ALGORITHM.plan(
        make_job(privacy={"noise": "gaussian"}), population=100, data=digits_coordinator
    )
    event = event_from_json(gaussian.calibration["event"])
    assert isinstance(event, SelfComposedEvent)
    assert isinstance(event.event, PoissonSampledEvent)
    assert isinstance(event.event.event, GaussianEvent)
    assert event.event.event.sigma == gaussian.details.noise_total
    # the tight (PLD) path applies to Gaussians: less noise than Skellam's RDP-only bound
    skellam = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    # Skellam's tight path is a Gaussian domination at the same variance (docs/accounting.md), so
    # at this μ both calibrate to the same multiplier; Skellam never needs less noise
    assert gaussian.noise_multiplier <= skellam.noise_multiplier
    given = ALGORITHM.plan(
        make_job(
            privacy={"target_epsilon": None, "noise_multiplier": 3.0}, secagg={"scale_bits": 12}
        ),
        population=100,
        data=digits_coordinator,
    )
    assert given.noise_multiplier == 3.0
    assert given.details.scale_bits == 12
    assert given.calibration["mode"] == "given"
    with pytest.raises(AlgorithmError, match="at least 1 is needed"):
        ALGORITHM.plan(job, population=3, data=digits_coordinator)
    with pytest.raises(AlgorithmError, match="cannot run"):
        ALGORITHM.plan(
            make_job(algorithm="dp-fedsgd", params=None, privacy={"unit": "record"}), population=100
        )


def test_plan_without_data_loads_the_job_data_set(job: Any, plan: JobPlan) -> None:
    assert ALGORITHM.plan(job, population=100).details == plan.details


def test_without_secure_aggregation_the_local_event_is_calibrated(
    digits_coordinator: CoordinatorData, plan: JobPlan
) -> None:
    local = ALGORITHM.plan(
        make_job(secagg={"enabled": False}), population=100, data=digits_coordinator
    )
    event = event_from_json(local.calibration["event"])
    # no amplification: T rounds of the plain Skellam mechanism meet the target
    assert isinstance(event, SelfComposedEvent)
    assert isinstance(event.event, SkellamEvent)
    assert local.noise_multiplier > plan.noise_multiplier
    assert compute_epsilon(event, delta=1e-5).epsilon <= 4.0


def test_select_samples_each_client_at_the_rate(job: Any, plan: JobPlan) -> None:
    alg = DpFedAvg(random_source=SeededRandomSource(b"select-test-seed-000"))
    counts: Counter[str] = Counter()
    sizes = []
    rounds = 200
    for r in range(1, rounds + 1):
        chosen = alg.bind(job, plan).select(round_number=r, population=POPULATION)
        sizes.append(len(chosen))
        counts.update(chosen)
    n, q = len(POPULATION), 0.3
    total = sum(sizes)
    assert abs(total - q * n * rounds) <= 5 * math.sqrt(n * rounds * q * (1 - q))
    assert len(set(map(tuple, [sorted(counts)]))) == 1
    # no client is favoured: per-client counts ~ Binomial(200, 0.3), sd ≈ 6.5
    assert max(counts.values()) - q * rounds < 6 * math.sqrt(rounds * q * (1 - q))
    assert min(counts[c] for c in POPULATION) - q * rounds > -6 * math.sqrt(rounds * q * (1 - q))
    # reproducible under a seeded CSPRNG, different from round to round
    again = DpFedAvg(random_source=SeededRandomSource(b"select-test-seed-000"))
    assert again.bind(job, plan).select(round_number=1, population=POPULATION) == alg.bind(
        job, plan
    ).select(round_number=1, population=POPULATION)
    assert alg.bind(job, plan).select(round_number=1, population=POPULATION) != alg.bind(
        job, plan
    ).select(round_number=2, population=POPULATION)


@pytest.mark.parametrize(
    ("participants", "survivors", "honest"),
    [(30, 29, 1.0), (37, 30, 0.8), (2, 2, 0.5), (5, 1, 1.0)],
)
def test_encoding_noise_over_honest_survivors_reaches_the_charge(
    job: Any, plan: JobPlan, participants: int, survivors: int, honest: float
) -> None:
    details = plan.details.model_copy(update={"honest_fraction": honest})
    p = JobPlan(plan.noise_multiplier, plan.calibration, plan.population, details)
    task = ALGORITHM.bind(job, p).round_task(
        ALGORITHM.bind(job, p).initial_state(_data()), round_number=1
    )
    config = ALGORITHM.bind(job, p).encoding(
        task, participants=participants, min_survivors=survivors
    )
    assert config.noise.kind is NoiseKind.SKELLAM
    assert config.clip == 1.0
    assert config.scale_bits == plan.details.scale_bits
    charged = plan.details.round_event(plan.population)
    assert isinstance(charged, PoissonSampledEvent)
    assert isinstance(charged.event, SkellamEvent)
    # the fewest honest survivors (⌈t·m_s⌉) alone add at least the charged μ
    assert config.noise.parameter * math.ceil(honest * survivors - 1e-12) >= charged.event.mu
    config.check_no_wrap(participants)


def _data() -> CoordinatorData:
    return CoordinatorData(input_shape=(1, 8, 8), num_classes=10)


def test_charges_the_whole_population_or_only_participants(job: Any, plan: JobPlan) -> None:
    charges = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=POPULATION)
        .charges(POPULATION[:25])
    )
    assert set(charges) == set(POPULATION)
    charge = charges[POPULATION[-1]]
    assert charge.event == plan.details.round_event(plan.population)
    assert (charge.unit, charge.approximate, charge.secure_aggregation) == ("agent", False, True)
    outsider = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=POPULATION[:5])
        .charges(["late-agent"])
    )
    assert "late-agent" in outsider  # never under-count a participant
    assert ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=POPULATION) == (
        charge.event,
    )

    local_job = make_job(secagg={"enabled": False}, privacy={"noise": "gaussian"})
    local_plan = ALGORITHM.plan(local_job, population=100, data=_data())
    local = (
        ALGORITHM.bind(local_job, local_plan)
        .round_charge(round_number=1, population=POPULATION)
        .charges(POPULATION[:3])
    )
    assert set(local) == set(POPULATION[:3])
    one = local[POPULATION[0]]
    assert isinstance(one.event, GaussianEvent)  # not amplified: the coordinator sees who took part
    assert (one.secure_aggregation, one.approximate, one.honest_fraction) == (False, True, 1.0)


def test_update_rule_divides_by_the_expected_count_and_applies_momentum(
    digits_coordinator: CoordinatorData,
) -> None:
    job = make_job(params={"server_learning_rate": 2.0, "server_momentum": 0.5})
    plan = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    theta0 = flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64)
    rng = np.random.default_rng(0)
    a1, a2 = rng.normal(size=650), rng.normal(size=650)
    out1 = ALGORITHM.bind(job, plan).finish_round(
        state, digits_coordinator, round_number=1, aggregate=a1, survivors=17
    )
    out2 = ALGORITHM.bind(job, plan).finish_round(
        out1.state, digits_coordinator, round_number=2, aggregate=a2, survivors=40
    )
    theta1 = flatten_parameters(model_from_bytes(out1.state.model, model=net), dtype=np.float64)
    theta2 = flatten_parameters(model_from_bytes(out2.state.model, model=net), dtype=np.float64)
    m = 30.0  # q·n, whatever the realised count
    v1 = a1 / m
    v2 = 0.5 * v1 + a2 / m
    np.testing.assert_allclose(theta1, theta0 + 2.0 * v1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(theta2, theta1 + 2.0 * v2, rtol=1e-5, atol=1e-6)
    assert out2.state.model_version == 2
    assert 0.0 <= out2.metrics["accuracy"] <= 1.0
    assert out2.metrics["survivors"] == 40
    assert not out2.done
    with pytest.raises(AlgorithmError, match="shape"):
        ALGORITHM.bind(job, plan).finish_round(
            state, digits_coordinator, round_number=1, aggregate=a1[:5], survivors=3
        )
    with pytest.raises(AlgorithmError, match="NaN"):
        ALGORITHM.bind(job, plan).finish_round(
            state, digits_coordinator, round_number=1, aggregate=np.full(650, np.nan), survivors=3
        )


def test_agent_computes_the_clipped_local_delta(
    job: Any, plan: JobPlan, digits_coordinator: CoordinatorData, digits_agents: list[Any]
) -> None:
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=3)
    params = task.params.to_json()
    agent = digits_agents[0]
    vector = ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
        agent, model=state.model, public_x=None, device="cpu"
    )
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    model_from_bytes(state.model, model=net)
    raw = local_update(
        net,
        agent.x,
        agent.y,
        steps=5,
        batch_size=32,
        learning_rate=0.5,
        seed=params["train_seed"],
        device="cpu",
    ).delta.astype(np.float64)
    assert np.linalg.norm(raw) > 1.0  # the clip binds here
    np.testing.assert_allclose(vector, raw / np.linalg.norm(raw))
    assert np.linalg.norm(vector) <= 1.0 + 1e-12
    small = ALGORITHM.agent(ALGORITHM.parse_task({**params, "clip": 100.0})).compute(
        agent, model=state.model, public_x=None, device="cpu"
    )
    np.testing.assert_allclose(small, raw)  # under the clip: unchanged
    with pytest.raises(AlgorithmError, match="needs the global model"):
        ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
            agent, model=None, public_x=None, device="cpu"
        )
    with pytest.raises(AlgorithmError, match="learning_rate"):
        ALGORITHM.agent(ALGORITHM.parse_task({**params, "learning_rate": -1})).compute(
            agent, model=state.model, public_x=None, device="cpu"
        )


def _round(job: Any, plan: JobPlan, participants: int = 30, survivors: int = 29) -> tuple:
    state = ALGORITHM.bind(job, plan).initial_state(_data())
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    config = ALGORITHM.bind(job, plan).encoding(
        task, participants=participants, min_survivors=survivors
    )
    events = list(
        ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=POPULATION)
    )
    return task.params.to_json(), events, config


def test_agent_check_accepts_the_honest_round(job: Any, plan: JobPlan) -> None:
    params, events, config = _round(job, plan)
    ALGORITHM.agent(ALGORITHM.parse_task(params)).check(
        events, config, num_clients=30, min_survivors=29, honest_fraction=1.0
    )


def test_agent_check_refuses_thin_noise_and_wrong_claims(job: Any, plan: JobPlan) -> None:
    params, events, config = _round(job, plan)

    def check(p: Any = params, e: Any = events, c: Any = config, **kw: Any) -> None:
        args = {"num_clients": 30, "min_survivors": 29, "honest_fraction": 1.0, **kw}
        ALGORITHM.agent(ALGORITHM.parse_task(p)).check(e, c, **args)

    # noise split over more agents than are guaranteed to survive
    thin = EncodingConfig(
        clip=1.0,
        scale_bits=config.scale_bits,
        ring_bits=config.ring_bits,
        noise=NoiseSpec.skellam(mu=config.noise.parameter * 29 / 30),
    )
    with pytest.raises(AlgorithmError, match="below"):
        check(c=thin)
    with pytest.raises(AlgorithmError, match="below"):
        check(min_survivors=20)  # fewer guaranteed survivors than the share assumed
    wrong_clip = EncodingConfig(
        clip=2.0, scale_bits=config.scale_bits, ring_bits=config.ring_bits, noise=config.noise
    )
    with pytest.raises(AlgorithmError, match="clip"):
        check(c=wrong_clip)
    with pytest.raises(AlgorithmError, match="clip"):
        check(p={**params, "clip": 2.0})
    coarse = EncodingConfig(clip=1.0, scale_bits=4, ring_bits=config.ring_bits, noise=config.noise)
    with pytest.raises(AlgorithmError, match="scale"):
        check(c=coarse)
    inner = events[0].event
    low_sensitivity = SkellamEvent(inner.mu, inner.l1_sensitivity, inner.l2_sensitivity / 2, 650)
    with pytest.raises(AlgorithmError, match="L2 sensitivity"):
        check(e=[PoissonSampledEvent(0.3, low_sensitivity)])
    with pytest.raises(AlgorithmError, match="does not say so"):
        check(e=[inner])
    with pytest.raises(AlgorithmError, match=r"rate 0\.1"):
        check(e=[PoissonSampledEvent(0.1, inner)])
    with pytest.raises(AlgorithmError, match="one event"):
        check(e=[*events, *events])
    with pytest.raises(AlgorithmError, match="GaussianEvent is claimed"):
        check(e=[PoissonSampledEvent(0.3, GaussianEvent(1e6, inner.l2_sensitivity))])
    with pytest.raises(AlgorithmError, match="honest fraction"):
        check(honest_fraction=0.5)
    with pytest.raises(AlgorithmError, match="would wrap"):
        check(num_clients=10**6, min_survivors=29)
    for key, bad in (("dimension", "650"), ("noise", "laplace"), ("secure_aggregation", 1)):
        with pytest.raises(AlgorithmError, match=key):
            check(p={**params, key: bad})
    with pytest.raises(AlgorithmError, match=r"params: the task must give exactly one of local_st"):
        check(p={k: v for k, v in params.items() if k != "local_steps"})


def test_agent_charge_drops_client_sampling_amplification(job: Any, plan: JobPlan) -> None:
    params, events, _ = _round(job, plan)
    (recorded,) = ALGORITHM.agent(ALGORITHM.parse_task(params)).charge(events)
    assert recorded == events[0].event
    # conservative: the conditional (non-amplified) cost is at least the amplified one
    assert np.all(rdp_curve(recorded) >= rdp_curve(events[0]) - 1e-12)
    local_job = make_job(secagg={"enabled": False})
    local_plan = ALGORITHM.plan(local_job, population=100, data=_data())
    p2, e2, _ = _round(local_job, local_plan)
    assert ALGORITHM.agent(ALGORITHM.parse_task(p2)).charge(e2) == tuple(e2)
    with pytest.raises(AlgorithmError):
        ALGORITHM.agent(ALGORITHM.parse_task({"algorithm": "pate-fl"})).charge(events)
