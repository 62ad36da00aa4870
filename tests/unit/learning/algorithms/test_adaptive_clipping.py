"""Adaptive clipping in the DP-FedAvg family: the count's weight against its closed form, the
agent's vector (its norm bound whatever clip a coordinator sends), the clip's geometric step
read off the released sum, the charge of the bigger vector, and a federation whose clip moves
to the quantile of its agents' update norms."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_job, run_job

from dpfl.accounting import PoissonSampledEvent, SkellamEvent
from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData, CoordinatorState
from dpfl.learning.algorithms.dp_fed_ls import ALGORITHM as FEDLS
from dpfl.learning.algorithms.dp_fedavg import ALGORITHM, DpFedAvg, DpFedAvgPlan
from dpfl.learning.algorithms.parts.adaptive_clip import (
    CLIP_KEY,
    AdaptiveClippingPlan,
    AdaptiveClippingTask,
    agent_vector,
    count_weight,
    encoding_clip,
    next_clip,
    read_sum,
)
from dpfl.learning.jobs import JobSpec, JobSpecError, job_to_dict, parse_job
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters, model_from_bytes
from dpfl.secagg import SeededRandomSource

DIGITS_LOGREG = 650  # 64·10 weights + 10 biases


def _job(adaptive: dict[str, Any] | None, **params: Any) -> JobSpec:
    """The harness's DP-FedAvg job over 2 rounds at a given z = 1.5 (a calibration would take
    seconds; the ε each plan records is computed all the same)."""
    doc = job_to_dict(make_job())
    doc["params"] = {"clip": 1.0, "sampling_rate": 0.3, "learning_rate": 0.5, **params}
    doc["rounds"] = 2
    doc["privacy"] = {**doc["privacy"], "target_epsilon": None, "noise_multiplier": 1.5}
    if adaptive is not None:
        doc["params"]["adaptive_clipping"] = adaptive
    return parse_job(doc)


def _plan(job: JobSpec, data: CoordinatorData, population: int = 100) -> DpFedAvgPlan:
    details = ALGORITHM.plan(job, population=population, data=data).details
    assert isinstance(details, DpFedAvgPlan)
    return details


def test_count_weight_gives_the_asked_count_noise() -> None:
    """σ_b = z·√(C₀² + w²/4)/w for the returned w; σ_b ≤ z/2 is refused by name."""
    for z, sigma_b in ((0.8, 1.5), (1.2, 3.0), (2.0, 1.01)):
        w = count_weight(0.7, noise_multiplier=z, count_noise=sigma_b)
        assert z * encoding_clip(0.7, w) / w == pytest.approx(sigma_b, rel=1e-12)
    with pytest.raises(AlgorithmError, match=r"count_noise.*z/2 = 1"):
        count_weight(1.0, noise_multiplier=2.0, count_noise=1.0)


def test_plan_sizes_the_vector_and_its_clip_for_the_count(
    digits_coordinator: CoordinatorData,
) -> None:
    reference = ALGORITHM.plan(_job(None), population=100, data=digits_coordinator)
    fixed = reference.details
    assert isinstance(fixed, DpFedAvgPlan)
    assert fixed.adaptive_clipping is None
    plan = ALGORITHM.plan(
        _job({"target_quantile": 0.6, "count_noise": 2.0}), population=100, data=digits_coordinator
    )
    d = plan.details
    assert isinstance(d, DpFedAvgPlan)
    assert d.adaptive_clipping is not None
    adaptive = d.adaptive_clipping
    assert (fixed.dimension, d.dimension, d.model_dimension) == (650, 651, 650)
    assert adaptive.clip == pytest.approx(math.hypot(1.0, adaptive.count_weight / 2))
    assert adaptive.target_quantile == 0.6
    # the count's noise in agents: the summed noise's std over the count's weight in ring units
    std = math.sqrt(2 * d.noise_total)
    assert std / math.ldexp(adaptive.count_weight, d.scale_bits) == pytest.approx(
        adaptive.count_noise, rel=1e-9
    )
    assert adaptive.count_noise == pytest.approx(2.0, rel=1e-3)
    # the same z costs the same ε on the bigger vector: the count's noise comes out of the
    # update's, whose std over C₀ is z·√(1 + w²/4C₀²) instead of z
    assert plan.calibration["epsilon"] == pytest.approx(reference.calibration["epsilon"], rel=1e-3)
    assert d.l2_sensitivity / fixed.l2_sensitivity == pytest.approx(adaptive.clip, rel=2e-3)
    # the default count noise is m/20 for m = q·n = 30 expected participants
    default = _plan(_job({}), digits_coordinator).adaptive_clipping
    assert default is not None
    assert default.count_noise == pytest.approx(30 / 20, rel=1e-3)


def test_a_count_noise_below_half_the_multiplier_is_refused(
    digits_coordinator: CoordinatorData,
) -> None:
    with pytest.raises(AlgorithmError, match=r"count_noise: σ_b = 0.5 agents.*z/2 = 0.75"):
        _plan(_job({"count_noise": 0.5}), digits_coordinator)


@pytest.mark.parametrize(
    ("adaptive", "message"),
    [
        ({"target_quantile": 1.0}, "target_quantile"),
        ({"clip_learning_rate": 0.0}, "clip_learning_rate"),
        ({"count_noise": -1.0}, "count_noise"),
        ({"quantile": 0.5}, "quantile"),
    ],
)
def test_job_validation_names_the_field(adaptive: dict[str, Any], message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        _job(adaptive)


def test_agent_vector_is_the_clipped_rescaled_update_and_the_centred_bit() -> None:
    task = AdaptiveClippingTask(round_clip=0.5, update_clip=2.0, count_weight=3.0)
    small = np.array([0.3, 0.0, -0.4])  # norm 0.5: within the clip, b = 1
    out = agent_vector(small, task)
    np.testing.assert_allclose(out, [1.2, 0.0, -1.6, 1.5])
    large = np.array([3.0, 4.0, 0.0])  # norm 5: clipped to 0.5, then rescaled to 2
    out = agent_vector(large, task)
    np.testing.assert_allclose(out, [1.2, 1.6, 0.0, -1.5])
    assert float(np.linalg.norm(out)) == pytest.approx(encoding_clip(2.0, 3.0))


@pytest.mark.parametrize("round_clip", [1e-12, 1e-3, 1.0, 1e6])
def test_any_round_clip_keeps_the_vector_within_the_encodings_clip(round_clip: float) -> None:
    """The clip a coordinator sends moves the update, never the vector's norm bound: that bound
    is what every charge rests on."""
    rng = np.random.default_rng(3)
    task = AdaptiveClippingTask(round_clip=round_clip, update_clip=1.0, count_weight=0.8)
    for scale in (1e-9, 1e-3, 1.0, 1e3):
        vector = agent_vector(rng.normal(size=50) * scale, task)
        assert float(np.linalg.norm(vector)) <= encoding_clip(1.0, 0.8) * (1 + 1e-12)


def test_the_clip_moves_geometrically_from_the_released_count() -> None:
    plan = AdaptiveClippingPlan(
        update_clip=1.0,
        count_weight=4.0,
        count_noise=1.0,
        target_quantile=0.5,
        clip_learning_rate=0.2,
    )
    # m = 10 expected, 8 within the round's clip 0.5: the last coordinate sums (8 − 5)·4 = 12
    total = np.array([2.0, -1.0, 12.0])
    updates, count = read_sum(total, plan, round_clip=0.5, expected_participants=10.0)
    np.testing.assert_allclose(updates, [1.0, -0.5])
    assert count == pytest.approx(8.0)
    # 8 of m = 10 within: the clip shrinks by e^{−0.2·(0.8 − 0.5)}
    assert next_clip(0.5, count, expected_participants=10.0, plan=plan) == pytest.approx(
        0.5 * math.exp(-0.06)
    )
    assert next_clip(0.5, 2.0, expected_participants=10.0, plan=plan) == pytest.approx(
        0.5 * math.exp(0.06)
    )


def test_round_tasks_carry_the_stored_clip_and_the_agent_checks_them(
    digits_coordinator: CoordinatorData, digits_agents: list[Any]
) -> None:
    job = _job({"count_noise": 2.0})
    plan = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    d = plan.details
    assert isinstance(d, DpFedAvgPlan)
    assert d.adaptive_clipping is not None
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    task = ALGORITHM.bind(job, plan).round_task(state, round_number=1)
    params = task.params.to_json()
    assert task.vector_length == 651
    assert params["clip"] == pytest.approx(d.adaptive_clipping.clip)
    assert params["adaptive_clipping"]["round_clip"] == 1.0
    moved = CoordinatorState(state.model, 1, {"round": 1, CLIP_KEY: 0.25})
    later = ALGORITHM.bind(job, plan).round_task(moved, round_number=2).params.to_json()
    assert later["adaptive_clipping"]["round_clip"] == 0.25
    # the agent's gate accepts the task with the plan's events and encoding
    config = ALGORITHM.bind(job, plan).encoding(task, participants=30, min_survivors=29)
    events = list(
        ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=["a"] * 100)
    )
    kw = {"num_clients": 30, "min_survivors": 29, "honest_fraction": 1.0}
    ALGORITHM.agent(ALGORITHM.parse_task(params)).check(events, config, **kw)
    vector = ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
        digits_agents[0], model=state.model, public_x=None, device="cpu"
    )
    assert vector.shape == (651,)
    assert abs(vector[-1]) == pytest.approx(d.adaptive_clipping.count_weight / 2)
    # a count that does not fit the encoding's clip is refused when the task is read
    forged = {**params, "adaptive_clipping": {**params["adaptive_clipping"], "count_weight": 9.0}}
    with pytest.raises(AlgorithmError, match="above the clip"):
        ALGORITHM.parse_task(forged)
    # a stored clip that is not a positive number is an error, not a silent default
    broken = CoordinatorState(state.model, 1, {"round": 1, CLIP_KEY: -1.0})
    with pytest.raises(AlgorithmError, match=CLIP_KEY):
        ALGORITHM.bind(job, plan).round_task(broken, round_number=2)


def test_finish_round_rescales_the_update_and_stores_the_next_clip(
    digits_coordinator: CoordinatorData,
) -> None:
    job = _job({"count_noise": 2.0}, server_momentum=0.0)
    plan = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    d = plan.details
    assert isinstance(d, DpFedAvgPlan)
    assert d.adaptive_clipping is not None
    adaptive = d.adaptive_clipping
    state = CoordinatorState(
        ALGORITHM.bind(job, plan).initial_state(digits_coordinator).model, 0, {CLIP_KEY: 0.5}
    )
    rng = np.random.default_rng(5)
    update = rng.normal(size=DIGITS_LOGREG)
    # 30 survivors (m = 30), 18 within the clip; updates sent at the scale C₀ = 2·(their size
    # at C_t 0.5)
    aggregate = np.append(update * 2.0, (18 - 15) * adaptive.count_weight)
    outcome = ALGORITHM.bind(job, plan).finish_round(
        state, digits_coordinator, round_number=1, aggregate=aggregate, survivors=30
    )
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    before = flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64)
    after = flatten_parameters(model_from_bytes(outcome.state.model, model=net), dtype=np.float64)
    np.testing.assert_allclose(after - before, update / 30.0, rtol=1e-5, atol=1e-7)
    expected = 0.5 * math.exp(-0.2 * (18 / 30 - 0.5))
    assert outcome.state.details[CLIP_KEY] == pytest.approx(expected)
    assert outcome.metrics["clip"] == 0.5
    assert outcome.metrics["clipped_fraction"] == pytest.approx(0.4)


def test_the_charge_is_the_release_of_the_bigger_vector(
    digits_coordinator: CoordinatorData,
) -> None:
    job = _job({"count_noise": 2.0})
    plan = ALGORITHM.plan(job, population=100, data=digits_coordinator)
    d = plan.details
    assert isinstance(d, DpFedAvgPlan)
    assert d.adaptive_clipping is not None
    charge = (
        ALGORITHM.bind(job, plan)
        .round_charge(round_number=1, population=[f"c{i}" for i in range(100)])
        .charges(["c0"])["c0"]
    )
    assert isinstance(charge.event, PoissonSampledEvent)
    inner = charge.event.event
    assert isinstance(inner, SkellamEvent)
    assert inner.dimension == 651
    assert inner.l2_sensitivity == pytest.approx(d.l2_sensitivity)
    assert inner.l2_sensitivity >= math.ldexp(d.adaptive_clipping.clip, d.scale_bits)


def test_dp_fed_ls_smooths_the_update_without_the_count(
    digits_coordinator: CoordinatorData,
) -> None:
    doc = job_to_dict(make_job(algorithm="dp-fed-ls", rounds=2))
    doc["privacy"] = {**doc["privacy"], "target_epsilon": None, "noise_multiplier": 1.5}
    doc["params"] = {
        "clip": 1.0,
        "sampling_rate": 0.3,
        "learning_rate": 0.5,
        "sigma_ls": 1.0,
        "adaptive_clipping": {"count_noise": 2.0},
    }
    job = parse_job(doc)
    plan = FEDLS.plan(job, population=100, data=digits_coordinator)
    state = FEDLS.bind(job, plan).initial_state(digits_coordinator)
    aggregate = np.append(np.random.default_rng(2).normal(size=DIGITS_LOGREG), 0.0)
    outcome = FEDLS.bind(job, plan).finish_round(
        state, digits_coordinator, round_number=1, aggregate=aggregate, survivors=30
    )
    assert outcome.state.details[CLIP_KEY] == pytest.approx(1.0 * math.exp(-0.2 * (0.5 - 0.5)))


def _federation(adaptive: dict[str, Any] | None) -> Any:
    """20 IID agents, every one each round, 12 rounds at ε 8, a first clip of 5: about five
    times the agents' update norms once the model has settled."""
    doc = job_to_dict(_job(adaptive, clip=5.0, sampling_rate=1.0, server_momentum=0.0))
    doc["rounds"] = 12
    doc["privacy"] = {**doc["privacy"], "target_epsilon": 8.0, "noise_multiplier": None}
    doc["data"]["partition"] = {"scheme": "iid"}
    return run_job(
        parse_job(doc),
        num_agents=20,
        algorithm=DpFedAvg(random_source=SeededRandomSource(b"adaptive-clip-sampling-0")),
        seed=b"adaptive-clip-harness-seed-0",
    )


@pytest.mark.slow  # two 12-round federations of 20 agents: about 20 s
def test_the_clip_moves_down_to_the_update_norms_and_rescues_a_bad_first_clip() -> None:
    """The clip falls from 5 towards the median update norm, and the model beats the same job
    held at clip 5, at the same ε; every agent's ledger holds the bigger vector's charge."""
    adaptive = _federation({"target_quantile": 0.5, "clip_learning_rate": 0.5, "count_noise": 2.0})
    fixed = _federation(None)
    clips = [r.metrics["clip"] for r in adaptive.rounds if not r.skipped]
    assert len(clips) == 12
    assert clips[0] == 5.0
    assert max(clips[-4:]) < 0.4 * clips[0]
    assert adaptive.plan.noise_multiplier == pytest.approx(fixed.plan.noise_multiplier, rel=1e-3)
    assert adaptive.final_metrics["accuracy"] >= fixed.final_metrics["accuracy"] + 0.1
    for agent in ("agent-0000", "agent-0019"):
        assert adaptive.epsilon(agent) <= 8.0 + 1e-6
        assert adaptive.agent_epsilon(agent) >= adaptive.epsilon(agent) - 1e-9
    charged = adaptive.ledger["agent-0000"][0].event
    assert isinstance(charged, SkellamEvent)
    assert charged.dimension == DIGITS_LOGREG + 1


def _released_count(
    job: JobSpec, plan: Any, data: CoordinatorData, *, last: float, survivors: int
) -> float:
    """The count the coordinator releases (in the metrics, and as the next clip) for a sum whose
    update part is zero and whose last coordinate is ``last``."""
    d = plan.details
    state = CoordinatorState(
        ALGORITHM.bind(job, plan).initial_state(data).model, 0, {CLIP_KEY: 0.5}
    )
    aggregate = np.append(np.zeros(d.dimension - 1), last)
    outcome = ALGORITHM.bind(job, plan).finish_round(
        state, data, round_number=1, aggregate=aggregate, survivors=survivors
    )
    fraction = outcome.metrics["clipped_fraction"]
    count = d.expected_participants * (1.0 - fraction)
    # the next clip is the same count's post-processing
    assert outcome.state.details[CLIP_KEY] == pytest.approx(
        next_clip(
            0.5,
            count,
            expected_participants=d.expected_participants,
            plan=d.adaptive_clipping,
        )
    )
    return count


def _largest_count_move(data: CoordinatorData) -> float:
    """How far one agent moves the released count under Poisson sampling, in agents: the agent
    is added to 20 others (so the number summed grows by one) with its bit 1 or 0."""
    job = _job({"count_noise": 2.0})
    plan = ALGORITHM.plan(job, population=100, data=data)
    w = plan.details.adaptive_clipping.count_weight
    others = (12 - 10) * w  # 12 of 20 others within the clip
    without = _released_count(job, plan, data, last=others, survivors=20)
    return max(
        abs(_released_count(job, plan, data, last=others + bit * w, survivors=21) - without)
        for bit in (0.5, -0.5)
    )


@pytest.mark.parametrize(
    ("population", "rate", "rounds", "z", "delta", "ratio"),
    [
        (100, 0.3, 20, 1.44, 1e-3, 1.094),
        (200, 0.1, 50, 1.0, 1e-5, 1.155),
        (50, 1.0, 12, 2.08, 1e-5, 0.915),
    ],
)
def test_one_agent_moves_the_released_count_by_at_most_the_charged_half(
    digits_coordinator: CoordinatorData,
    population: int,
    rate: float,
    rounds: int,
    z: float,
    delta: float,
    ratio: float,
) -> None:
    """Under Poisson sampling the number of summed vectors moves with the agent. A count decoded
    with it moves by a whole agent, so the released (update, count) pair has sensitivity
    √(C₀² + w²) while √(C₀² + w²/4) is charged (issue: 4.26 charged against 5.52 true in the
    first row). The true ε here is computed independently of dpfl's accounting: dp_accounting's
    pessimistic PLD of the subsampled Gaussian at the sensitivity the released count shows."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    from dpfl.accounting import ComposedEvent, GaussianEvent, compute_epsilon

    move = _largest_count_move(digits_coordinator)
    clip = 1.0
    w = count_weight(clip, noise_multiplier=z, count_noise=0.05 * population * rate)
    assert w / clip == pytest.approx(ratio, abs=1e-3)
    charged_clip = encoding_clip(clip, w)
    released_clip = math.hypot(clip, w * move)
    step = pld.from_gaussian_mechanism(
        standard_deviation=z * charged_clip / released_clip,
        sampling_prob=rate,
        pessimistic_estimate=True,
        value_discretization_interval=1e-3,
    )
    true = step.self_compose(rounds).get_epsilon_for_delta(delta)
    one = GaussianEvent(z) if rate == 1.0 else PoissonSampledEvent(rate, GaussianEvent(z))
    charged = compute_epsilon(
        ComposedEvent(tuple([one] * rounds)), delta=delta, tight=False
    ).epsilon
    assert move <= 0.5 + 1e-9
    assert true <= charged
