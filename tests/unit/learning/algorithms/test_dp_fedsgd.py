"""DP-FedSGD: integer DP-SGD steps against a record-by-record ground truth, calibration of S
Poisson-subsampled Skellam steps per round, the per-step noise split, the ring, charges (secure
aggregation or local DP, exact or approximate), agent checks and whole jobs."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from support.algorithm_harness import run_job

from dpfl.accounting import (
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
    event_from_json,
)
from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData, JobPlan
from dpfl.learning.algorithms.dp_fedsgd import ALGORITHM, DpFedSgd, required_ring_bits
from dpfl.learning.algorithms.parts.data_sizes import mean_local_size
from dpfl.learning.algorithms.parts.fedsgd_accounting import CLAIM_LABEL
from dpfl.learning.algorithms.parts.integer_dpsgd import (
    _per_sample_gradients,
    clamp,
    clip_rows,
    fixed_point_rows,
    fixed_point_sum,
    fraction_bits,
    integer_dp_sgd,
    round_sum,
    step_sensitivities,
)
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.jobs import parse_job
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters, model_from_bytes
from dpfl.mechanisms import EncodingConfig, NoiseSpec, centre
from dpfl.secagg import SeededRandomSource

AGENTS = [f"agent-{i:04d}" for i in range(10)]


def sgd_job(**overrides: Any) -> Any:
    doc: dict[str, Any] = {
        "name": "fedsgd",
        "algorithm": "dp-fedsgd",
        "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
        "model": "logreg",
        "rounds": 4,
        "privacy": {"unit": "record", "target_epsilon": 4.0, "delta": 1e-5},
        "params": {"clip": 1.0, "local_steps": 3, "batch_sampling_rate": 0.1, "learning_rate": 0.5},
    }
    for key, value in overrides.items():
        doc[key] = {**doc[key], **value} if isinstance(doc.get(key), dict) else value
    return parse_job(doc)


@pytest.fixture(scope="module")
def plan(digits_coordinator: CoordinatorData) -> JobPlan:
    return ALGORITHM.plan(sgd_job(), population=10, data=digits_coordinator)


def _stream(label: str) -> Any:
    return SeededRandomSource(b"dp-fedsgd-test-seed-0").stream(label)


# -- the integer local steps -----------------------------------------------------------------


@pytest.mark.parametrize("model", ["logreg", "cnn"])
def test_one_integer_step_matches_record_by_record_gradients(
    digits_agents: list[AgentData], model: str
) -> None:
    """torch.func's per-record gradients equal one-record backward passes (the cnn computes in
    channels-last layout, dpfl.learning.models)."""
    agent = digits_agents[0]
    x, y = agent.x[:20], agent.y[:20]
    net = build_model(model, input_shape=(1, 8, 8), num_classes=10, seed=1)
    before = flatten_parameters(net, dtype=np.float64)
    bits, clip = 12, 0.5
    truth = []
    for xi, yi in zip(x, y, strict=True):  # the ground truth: one record at a time
        net.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            net(torch.tensor(xi[None], dtype=torch.float32)), torch.tensor([int(yi)])
        )
        loss.backward()
        g = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).double().numpy()
        truth.append(g * min(1.0, clip / np.linalg.norm(g)))
    summed = np.ldexp(np.sum(truth, axis=0), bits)
    result = integer_dp_sgd(
        net,
        x,
        y,
        steps=1,
        sampling_rate=1.0,
        clip=clip,
        learning_rate=0.5,
        normalizer=4.0,
        scale_bits=bits,
        noise=NoiseSpec.none(),
        stream=_stream("one-step"),
    )
    assert result.batch_sizes == (20,)
    assert result.total.dtype == np.int64
    # the sum is rounded once, to floor or ceiling per coordinate (truncation costs 20·2^-16)
    assert np.abs(result.total - summed).max() < 1.01
    after = flatten_parameters(net, dtype=np.float64)
    np.testing.assert_allclose(
        after, before - 0.5 * result.total / (4.0 * 2**bits), rtol=1e-5, atol=1e-6
    )


def test_the_step_sum_adds_every_pass_of_records_once(
    digits_agents: list[AgentData],
) -> None:
    """The records' clipped fixed-point gradients are summed in passes of exactly ``chunk``
    records (the last padded with zero records, which add nothing): the integer sum agrees with
    the whole batch's rows up to the float32 rounding of the gradients."""
    agent = digits_agents[0]
    net = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=3)
    names = [name for name, _ in net.named_parameters()]
    xt, yt = torch.as_tensor(agent.x[:70]), torch.as_tensor(agent.y[:70])
    n = len(xt)
    grads = _per_sample_gradients(net, names, xt, yt).detach()
    whole = fixed_point_rows(clip_rows(grads.to(torch.float64).numpy(), 0.5), 20).sum(axis=0)
    assert np.abs(whole).max() > 2**18  # the rows are far from zero
    for chunk in (1, 2, 32, n - 1, n, 500):
        summed = fixed_point_sum(net, names, xt, yt, clip=0.5, bits=20, chunk=chunk)
        assert summed.dtype == np.int64
        assert np.abs(summed - whole).max() <= n * 2**20 * 1e-5
    with pytest.raises(AlgorithmError, match="no records"):
        fixed_point_sum(net, names, xt[:0], yt[:0], clip=0.5, bits=20)
    with pytest.raises(AlgorithmError, match="chunk"):
        fixed_point_sum(net, names, xt, yt, clip=0.5, bits=20, chunk=0)


@pytest.mark.parametrize("model", ["cnn", "logreg"])
@pytest.mark.parametrize("chunk", [4, 16, 128])
def test_removing_a_record_moves_the_step_sum_by_exactly_its_own_row(
    digits_agents: list[AgentData], model: str, chunk: int
) -> None:
    """What the sensitivity argument assumes of the computed sum: with one record removed, the
    other records' rows are bit for bit the same, so the sums differ by exactly the removed
    record's fixed-point row (computed alone). Passes of a fixed size make a row's float32
    kernels independent of the batch."""
    agent = digits_agents[0]
    net = build_model(model, input_shape=(1, 8, 8), num_classes=10, seed=5)
    names = [name for name, _ in net.named_parameters()]
    xt, yt = torch.as_tensor(agent.x[:41]), torch.as_tensor(agent.y[:41])

    def summed(index: list[int]) -> np.ndarray:
        return fixed_point_sum(net, names, xt[index], yt[index], clip=0.5, bits=24, chunk=chunk)

    everyone = list(range(len(xt)))
    full = summed(everyone)
    for k in (0, 3, 16, 17, 40):
        alone = summed([k])
        assert np.abs(alone).max() > 0
        assert np.array_equal(full - summed([i for i in everyone if i != k]), alone), k


def test_fixed_point_truncation_never_raises_a_norm() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(300, 40))
    rows *= 64.0 / np.linalg.norm(rows, axis=1, keepdims=True)  # on the clip sphere
    fixed = fixed_point_rows(rows, 5)
    assert fixed.dtype == np.int64
    assert np.all(np.abs(fixed) <= np.abs(np.ldexp(rows, 5)))
    assert np.all(np.linalg.norm(fixed, axis=1) <= 64.0 * 32)
    assert np.all(np.abs(fixed - np.ldexp(rows, 5)) < 1)


def test_the_sum_is_rounded_once_without_bias() -> None:
    """⌊(A + U)/2^f⌋ rounds A/2^f up with probability exactly its fractional part."""
    bits = 4
    fixed = np.array([-37, -16, -1, 0, 5, 16, 23], dtype=np.int64)
    draws = np.stack([round_sum(fixed, bits, _stream(f"sum{i}")) for i in range(4000)])
    exact = fixed / 16
    assert np.all((draws == np.floor(exact)[None]) | (draws == np.ceil(exact)[None]))
    np.testing.assert_allclose(draws.mean(axis=0), exact, atol=0.03)
    assert np.array_equal(round_sum(fixed, 0, _stream("none")), fixed)


def test_fraction_bits_keep_the_sum_in_64_bits() -> None:
    assert fraction_bits(100, 1 << 18) == 16
    assert fraction_bits(1 << 20, 1 << 30) == 62 - 51
    with pytest.raises(AlgorithmError, match="overflow 64 bits"):
        fraction_bits(1 << 40, 1 << 30)


def test_noise_is_added_at_every_step_and_the_batches_are_poisson(
    digits_agents: list[AgentData],
) -> None:
    agent = digits_agents[1]
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    noise = NoiseSpec.skellam(mu=50.0)
    result = integer_dp_sgd(
        net,
        agent.x,
        agent.y,
        steps=40,
        sampling_rate=0.25,
        clip=1.0,
        learning_rate=1e-9,  # the model barely moves: the steps' data parts stay comparable
        normalizer=1.0,
        scale_bits=0,
        noise=noise,
        stream=_stream("noisy"),
    )
    sizes = np.array(result.batch_sizes)
    m = len(agent.y)
    assert abs(sizes.mean() - 0.25 * m) < 5 * math.sqrt(0.25 * 0.75 * m / 40)
    # the total carries 40 steps of Sk(50): variance 40·2·50 per coordinate (data part ≤ 40·m)
    assert np.var(result.total) == pytest.approx(40 * 100, rel=0.2)


# -- plan ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_plan_calibrates_s_subsampled_skellam_steps_per_round(plan: JobPlan) -> None:
    assert get_algorithm("dp-fedsgd") is ALGORITHM
    d = plan.details
    # one rounding per step: Δ₂ = c + √d, and b the smallest scale keeping it within 1 % of c
    config = EncodingConfig(clip=1.0, scale_bits=d.scale_bits, ring_bits=64, rounding_beta=0.0)
    assert d.l2_sensitivity == config.scaled_clip + math.sqrt(650)
    assert d.l1_sensitivity == pytest.approx(config.scaled_clip * math.sqrt(650) + 650)
    assert d.l2_sensitivity <= 1.01 * config.scaled_clip
    smaller = math.ldexp(1.0, d.scale_bits - 1)
    assert smaller + math.sqrt(650) > 1.01 * smaller
    assert plan.calibration["scale_bits_rule"] == "inflation<=1.0%"
    assert math.sqrt(2 * d.noise_total) == pytest.approx(plan.noise_multiplier * d.l2_sensitivity)
    step = PoissonSampledEvent(
        0.1, SkellamEvent(d.noise_total, d.l1_sensitivity, d.l2_sensitivity, 650)
    )
    event = event_from_json(plan.calibration["event"])
    assert event == SelfComposedEvent(SelfComposedEvent(step, 3), 4)
    assert plan.details.guaranteed_round_event() == SelfComposedEvent(step, 3)
    assert 3.95 < compute_epsilon(event, delta=1e-5).epsilon <= 4.0
    assert d.expected_batch_size == pytest.approx(0.1 * mean_local_size(sgd_job(), 10))
    assert ALGORITHM.parse_plan(json.loads(json.dumps(plan.to_json()))) == plan


@pytest.mark.slow
def test_plan_variants(digits_coordinator: CoordinatorData) -> None:
    gaussian = ALGORITHM.plan(
        sgd_job(privacy={"noise": "gaussian"}), population=10, data=digits_coordinator
    )
    step = event_from_json(gaussian.calibration["event"]).event.event
    assert isinstance(step, PoissonSampledEvent)
    assert isinstance(step.event, GaussianEvent)
    given = ALGORITHM.plan(
        sgd_job(
            privacy={"target_epsilon": None, "noise_multiplier": 1.5},
            params={"expected_batch_size": 7.0, "batch_sampling_rate": 1.0},
        ),
        population=10,
        data=digits_coordinator,
    )
    assert (given.noise_multiplier, given.details.expected_batch_size) == (1.5, 7.0)
    # no record sampling: the bare Skellam step
    assert isinstance(given.details.guaranteed_round_event().event, SkellamEvent)
    with pytest.raises(AlgorithmError, match="cannot run"):
        ALGORITHM.plan(
            parse_job({"name": "x", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 1}}),
            population=10,
        )


#: The three accounting modes of a secure-aggregation job (fedsgd_accounting): S = 1 is charged
#: centrally (exact), S > 1 as local DP by default, or sum-dominating when the job opts in.
MODES = {
    "central": {"params": {"local_steps": 1}},
    "local": {},
    "sum-dominating": {"privacy": {"accounting": "sum-dominating"}},
}


@pytest.fixture(scope="module")
def plans(digits_coordinator: CoordinatorData) -> dict[str, tuple[Any, JobPlan]]:
    out = {}
    for mode, overrides in MODES.items():
        job = sgd_job(**overrides)
        out[mode] = (job, ALGORITHM.plan(job, population=10, data=digits_coordinator))
    return out


def _with_honest(plan: JobPlan, honest: float) -> JobPlan:
    details = plan.details.model_copy(update={"honest_fraction": honest})
    return JobPlan(plan.noise_multiplier, plan.calibration, plan.population, details)


@pytest.mark.slow
@pytest.mark.parametrize(("honest", "survivors"), [(1.0, 9), (0.5, 10), (0.8, 7)])
def test_central_step_noise_is_split_over_the_honest_participants(
    plans: dict[str, tuple[Any, JobPlan]], honest: float, survivors: int
) -> None:
    job, plan = plans["central"]
    assert plan.details.accounting_mode == "central"
    p = _with_honest(plan, honest)
    task = ALGORITHM.bind(job, p).round_task(_state(p), round_number=1)
    config = ALGORITHM.bind(job, p).encoding(task, participants=10, min_survivors=survivors)
    mu = plan.details.noise_total
    assert config.noise.parameter * (honest * survivors) >= mu
    # t·N(1−δ) = t·9.5 of the 10 (dropout 0.05), or t·m_s where m_s < 9.5
    count = honest * min(10 * 0.95, survivors)
    assert config.noise.variance * count == pytest.approx(2 * mu, rel=1e-12)
    assert config.clip == 1.0
    assert config.scale_bits == plan.details.scale_bits
    # the ring holds 1 step of 10 agents of at most 100 000 records, plus κσ of noise
    assert config.ring_bits == required_ring_bits(
        participants=10, steps=1, max_local_size=100_000, config=config
    )
    worst = 10 * 1 * 100_000 * config.coordinate_bound
    assert 2 ** (config.ring_bits - 1) > worst


@pytest.mark.slow
@pytest.mark.parametrize(("participants", "survivors"), [(10, 10), (10, 4), (3, 3), (12, 12)])
def test_several_local_steps_add_the_whole_noise_per_agent_by_default(
    plans: dict[str, tuple[Any, JobPlan]], participants: int, survivors: int
) -> None:
    """Provable accounting of S = 3: every agent's own share is the whole μ; summing split
    shares, as docs/algorithms.md#dp-fedsgd does, only with the job's opt-in (and never below the
    plan's ``agent_noise``, the share its agents record)."""
    job, plan = plans["local"]
    assert (plan.details.accounting_mode, plan.details.agent_noise) == ("local", None)
    task = ALGORITHM.bind(job, plan).round_task(_state(plan), round_number=1)
    assert task.params.accounting == "provable"
    assert task.params.agent_noise is None
    config = ALGORITHM.bind(job, plan).encoding(
        task, participants=participants, min_survivors=survivors
    )
    assert config.noise.parameter == plan.details.noise_total
    assert config.ring_bits == required_ring_bits(
        participants=participants, steps=3, max_local_size=100_000, config=config
    )
    opt_job, opt = plans["sum-dominating"]
    # the same event, so the same calibrated μ; the shares differ by t·N(1−δ) = 9.5
    assert opt.details.noise_total == plan.details.noise_total
    floor = opt.details.agent_noise
    assert floor == pytest.approx(plan.details.noise_total / 9.5, rel=1e-12)
    opt_task = ALGORITHM.bind(opt_job, opt).round_task(_state(opt), round_number=1)
    assert (opt_task.params.accounting, opt_task.params.agent_noise) == (
        "sum-dominating",
        floor,
    )
    split = ALGORITHM.bind(opt_job, opt).encoding(
        opt_task, participants=participants, min_survivors=survivors
    )
    assert split.noise.parameter >= floor  # 12 > the plan's 10 participants: held at the floor
    assert split.noise.parameter * survivors >= opt.details.noise_total


def _state(plan: JobPlan) -> Any:
    return ALGORITHM.bind(sgd_job(), plan).initial_state(CoordinatorData((1, 8, 8), 10))


# -- charges ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_participants_pay_s_compositions_and_the_ledger_says_which_guarantee(
    plans: dict[str, tuple[Any, JobPlan]], digits_coordinator: CoordinatorData
) -> None:
    flags = {}
    for mode, (job, plan) in plans.items():
        charges = (
            ALGORITHM.bind(job, plan)
            .round_charge(round_number=1, population=AGENTS)
            .charges(AGENTS[:6])
        )
        assert set(charges) == set(AGENTS[:6])  # a record is touched only when its agent is in
        charge = charges[AGENTS[0]]
        assert charge.event == plan.details.guaranteed_round_event()
        assert (charge.event == plan.details.claimed_round_event()) == (mode != "sum-dominating")
        assert charge.unit == "record"
        assert ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=AGENTS) == (
            charge.event,
        )
        flags[mode] = (charge.secure_aggregation, charge.approximate, charge.honest_fraction)
    assert flags == {
        "central": (True, False, 1.0),  # exact on the summed noise
        "local": (True, False, 1.0),  # masked, but no other agent's noise credited
        "sum-dominating": (True, False, 1.0),  # the own-share charge: proven, nobody credited
    }
    honest = sgd_job(privacy={"accounting": "sum-dominating", "honest_fraction": 0.8})
    honest_plan = ALGORITHM.plan(honest, population=10, data=digits_coordinator)
    one = (
        ALGORITHM.bind(honest, honest_plan)
        .round_charge(round_number=1, population=AGENTS)
        .charges(AGENTS)[AGENTS[0]]
    )
    assert (one.approximate, one.honest_fraction) == (False, 1.0)
    local = sgd_job(secagg={"enabled": False}, privacy={"noise": "gaussian"})
    local_plan = ALGORITHM.plan(local, population=10, data=digits_coordinator)
    one = (
        ALGORITHM.bind(local, local_plan)
        .round_charge(round_number=2, population=AGENTS)
        .charges(AGENTS)[AGENTS[2]]
    )
    assert (one.secure_aggregation, one.approximate, one.honest_fraction) == (False, True, 1.0)
    # without secure aggregation each agent adds the whole per-step noise itself
    task = ALGORITHM.bind(local, local_plan).round_task(_state(local_plan), round_number=1)
    config = ALGORITHM.bind(local, local_plan).encoding(task, participants=10, min_survivors=1)
    assert config.noise.parameter >= local_plan.details.noise_total


# -- agent side ------------------------------------------------------------------------------


def _round(job: Any, plan: JobPlan, survivors: int = 9) -> tuple[dict, list, Any]:
    task = ALGORITHM.bind(job, plan).round_task(_state(plan), round_number=1)
    config = ALGORITHM.bind(job, plan).encoding(task, participants=10, min_survivors=survivors)
    events = list(ALGORITHM.bind(job, plan).invitation_events(round_number=1, population=AGENTS))
    return task.params.to_json(), events, config


@pytest.mark.slow
def test_agent_check_requires_the_same_s_c_p_and_sigma(
    plans: dict[str, tuple[Any, JobPlan]],
) -> None:
    params, events, config = _round(*plans["central"])

    def check(p: Any = params, e: Any = events, c: Any = config, **kw: Any) -> None:
        args = {"num_clients": 10, "min_survivors": 9, "honest_fraction": 1.0, **kw}
        ALGORITHM.agent(ALGORITHM.parse_task(p)).check(e, c, **args)

    check()
    step = events[0].event
    with pytest.raises(AlgorithmError, match="compositions"):
        check(e=[SelfComposedEvent(step, 2)])
    with pytest.raises(AlgorithmError, match="rate"):
        check(p={**params, "batch_sampling_rate": 0.2})
    with pytest.raises(AlgorithmError, match="does not say so"):
        check(e=[SelfComposedEvent(step.event, 1)])
    with pytest.raises(AlgorithmError, match="clip"):
        check(p={**params, "clip": 2.0})
    stronger = SkellamEvent(
        step.event.mu * 2, step.event.l1_sensitivity, step.event.l2_sensitivity, 650
    )
    with pytest.raises(AlgorithmError, match="below"):
        check(e=[SelfComposedEvent(PoissonSampledEvent(0.1, stronger), 1)])
    with pytest.raises(AlgorithmError, match="below"):
        check(min_survivors=4)
    narrow = EncodingConfig(
        clip=1.0, scale_bits=config.scale_bits, ring_bits=config.ring_bits - 1, noise=config.noise
    )
    with pytest.raises(AlgorithmError, match="wrap"):
        check(c=narrow)
    with pytest.raises(AlgorithmError, match="GaussianEvent is claimed"):
        check(e=[SelfComposedEvent(PoissonSampledEvent(0.1, GaussianEvent(1e9, 1.0)), 1)])
    with pytest.raises(AlgorithmError, match="honest fraction"):
        check(honest_fraction=0.5)
    with pytest.raises(AlgorithmError, match="expected_batch_size"):
        check(p={**params, "expected_batch_size": 0})
    with pytest.raises(AlgorithmError, match=r"params\.accounting"):
        check(p={k: v for k, v in params.items() if k != "accounting"})
    with pytest.raises(AlgorithmError, match="needs secure aggregation and local_steps > 1"):
        check(p={**params, "accounting": "sum-dominating"})


@pytest.mark.slow
def test_an_agent_refuses_split_noise_for_several_steps_unless_the_job_opted_in(
    plans: dict[str, tuple[Any, JobPlan]],
) -> None:
    """S > 1: the central (split) claim is refused under the provable accounting; an opted-in
    task is announced with the agent's own-share event, which its own noise must carry alone:
    announcing the sum-dominating claim itself is refused."""
    params, events, own = _round(*plans["local"])
    opt_job, opt_plan = plans["sum-dominating"]
    opt_params, opt_events, split = _round(opt_job, opt_plan)
    assert events == [opt_plan.details.claimed_round_event()]  # same calibrated claim event...
    assert opt_events == [opt_plan.details.guaranteed_round_event()]  # ...but never announced
    assert opt_events != events

    def check(p: Any, c: Any, e: Any = events, **kw: Any) -> None:
        args = {"num_clients": 10, "min_survivors": 9, "honest_fraction": 1.0, **kw}
        ALGORITHM.agent(ALGORITHM.parse_task(p)).check(e, c, **args)

    check(params, own)
    check(params, own, min_survivors=2)  # the agent's own noise does not need the others
    check(opt_params, split, opt_events)
    check(opt_params, split, opt_events, min_survivors=1)  # nothing rests on the others
    check(opt_params, own, opt_events)  # more noise than claimed is fine
    with pytest.raises(AlgorithmError, match="accounted as local DP"):
        check(params, split)  # the coordinator splits the noise of a provable S > 1 task
    with pytest.raises(AlgorithmError, match="accounted as local DP"):
        check({**params, "agent_noise": split.noise.parameter}, split)
    with pytest.raises(
        AlgorithmError, match=r"privacy\.accounting: sum-dominating\): this agent's own noise"
    ):
        check(opt_params, split)  # the claim announced as the charge: refused
    # opted in, but the round's share is below the agent_noise its own ledger would record
    with pytest.raises(AlgorithmError, match="summed over 1 honest agents is below"):
        check({**opt_params, "agent_noise": split.noise.parameter * 1.01}, split, opt_events)
    with pytest.raises(
        AlgorithmError, match=r"params\.agent_noise: a sum-dominating task must state it"
    ):
        check({k: v for k, v in opt_params.items() if k != "agent_noise"}, split, opt_events)


@pytest.mark.slow
def test_the_agent_records_what_its_own_noise_proves(
    plans: dict[str, tuple[Any, JobPlan]],
) -> None:
    for mode in ("central", "local", "sum-dominating"):  # the announced event, as charged
        params, events, _ = _round(*plans[mode])
        assert ALGORITHM.agent(ALGORITHM.parse_task(params)).charge(events) == tuple(events)
    params, events, split = _round(*plans["sum-dominating"])
    (recorded,) = ALGORITHM.agent(ALGORITHM.parse_task(params)).charge(events)
    claim = plans["sum-dominating"][1].details.claimed_round_event()
    floor = params["agent_noise"]
    assert recorded == SelfComposedEvent(
        PoissonSampledEvent(
            0.1,
            SkellamEvent(
                floor,
                claim.event.event.l1_sensitivity,
                claim.event.event.l2_sensitivity,
                650,
            ),
        ),
        3,
    )
    # a coordinator that announces the claim still gets the own-share event recorded
    assert ALGORITHM.agent(ALGORITHM.parse_task(params)).charge([claim]) == (recorded,)
    assert split.noise.parameter >= floor
    rounds = SelfComposedEvent(recorded, 4)
    job_eps = compute_epsilon(SelfComposedEvent(claim, 4), delta=1e-5).epsilon
    assert compute_epsilon(rounds, delta=1e-5).epsilon > 3 * job_eps  # 9.5 times less noise
    claimed = events[0]
    with pytest.raises(AlgorithmError, match="compositions"):
        ALGORITHM.agent(ALGORITHM.parse_task(params)).charge([claimed.event])
    with pytest.raises(AlgorithmError, match="one event"):
        ALGORITHM.agent(ALGORITHM.parse_task(params)).charge([claimed, claimed])
    gaussian = SelfComposedEvent(PoissonSampledEvent(0.1, GaussianEvent(50.0, 2.0)), 3)
    assert ALGORITHM.agent(ALGORITHM.parse_task(params)).charge([gaussian]) == (
        SelfComposedEvent(PoissonSampledEvent(0.1, GaussianEvent(floor, 2.0)), 3),
    )


def test_agent_contribution_is_the_ring_vector_of_its_noisy_steps(
    plan: JobPlan, digits_agents: list[AgentData]
) -> None:
    params, _, config = _round(sgd_job(), plan)
    state = _state(plan)
    agent = digits_agents[2]
    vector = ALGORITHM.agent(ALGORITHM.parse_task(params)).contribution(
        agent,
        model=state.model,
        public_x=None,
        device="cpu",
        encoding=config,
        stream=_stream("contribution"),
    )
    assert vector.dtype == np.uint64
    assert vector.shape == (650,)
    assert int(vector.max()) < 2**config.ring_bits
    signed = centre(vector, config.ring_bits)
    # three steps of the agent's noise share (std √(2μ_share) each) plus its clipped gradients
    assert np.std(signed) >= 0.9 * math.sqrt(3 * config.noise.variance)
    # more records than max_local_size: no refusal (it would depend on the data set's size)
    larger = ALGORITHM.agent(ALGORITHM.parse_task({**params, "max_local_size": 10})).contribution(
        agent,
        model=state.model,
        public_x=None,
        device="cpu",
        encoding=config,
        stream=_stream("larger"),
    )
    assert larger.shape == (650,)
    with pytest.raises(AlgorithmError, match="global model"):
        ALGORITHM.agent(ALGORITHM.parse_task(params)).contribution(
            agent,
            model=None,
            public_x=None,
            device="cpu",
            encoding=config,
            stream=_stream("no-model"),
        )
    with pytest.raises(AlgorithmError, match="in contribution"):
        ALGORITHM.agent(ALGORITHM.parse_task(params)).compute(
            agent, model=state.model, public_x=None, device="cpu"
        )


def test_finish_round_averages_the_agents_local_deltas(
    plan: JobPlan, digits_coordinator: CoordinatorData
) -> None:
    job = sgd_job()
    state = ALGORITHM.bind(job, plan).initial_state(digits_coordinator)
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    theta0 = flatten_parameters(model_from_bytes(state.model, model=net), dtype=np.float64)
    aggregate = np.random.default_rng(5).normal(size=650) * 30
    out = ALGORITHM.bind(job, plan).finish_round(
        state, digits_coordinator, round_number=1, aggregate=aggregate, survivors=7
    )
    theta1 = flatten_parameters(model_from_bytes(out.state.model, model=net), dtype=np.float64)
    expected = theta0 - 0.5 * aggregate / (plan.details.expected_batch_size * 7)
    np.testing.assert_allclose(theta1, expected, rtol=1e-5, atol=1e-6)
    assert out.state.model_version == 1
    assert not out.done
    with pytest.raises(AlgorithmError, match="shape"):
        ALGORITHM.bind(job, plan).finish_round(
            state, digits_coordinator, round_number=1, aggregate=aggregate[:9], survivors=7
        )


# -- whole jobs ------------------------------------------------------------------------------


@pytest.mark.slow
def test_whole_job_decodes_the_sum_of_the_agents_steps() -> None:
    job = sgd_job(rounds=3)
    result = run_job(
        job,
        num_agents=5,
        algorithm=DpFedSgd(random_source=SeededRandomSource(b"fedsgd-select-seed-0")),
        seed=b"fedsgd-whole-job-seed",
    )
    assert [len(r.participants) for r in result.rounds] == [5, 5, 5]
    accuracies = [r.metrics["accuracy"] for r in result.rounds]
    assert accuracies[-1] >= 0.3, accuracies  # chance is 0.1
    planned = compute_epsilon(event_from_json(result.plan.calibration["event"]), delta=1e-5)
    for client in result.population:
        charges = result.ledger[client]
        assert len(charges) == 3
        assert all(c.event.count == 3 and c.unit == "record" for c in charges)
        assert result.epsilon(client) == pytest.approx(planned.epsilon, rel=1e-9)
        # the record sampling is the agent's own: it keeps the amplification
        assert result.agent_epsilon(client) == pytest.approx(result.epsilon(client))


@pytest.mark.slow
def test_whole_sum_dominating_job_charges_the_own_share_and_shows_the_claim_apart() -> None:
    """Every ledger (coordinator's and agent's) holds the guaranteed own-share event; the
    sum-dominating figure is only in the plan, labelled as a claim, and far below it."""
    job = sgd_job(rounds=2, privacy={"accounting": "sum-dominating"})
    result = run_job(
        job,
        num_agents=5,
        algorithm=DpFedSgd(random_source=SeededRandomSource(b"fedsgd-select-seed-1")),
        seed=b"fedsgd-sum-dominating-job",
    )
    assert [len(r.participants) for r in result.rounds] == [5, 5]
    # shares split over t·N(1−δ) = 4.75 of the 5 agents (the plan's population)
    mu = result.plan.details.noise_total
    floor = result.plan.details.agent_noise
    assert result.rounds[0].encoding.noise.parameter == pytest.approx(mu / 4.75, rel=1e-12)
    assert floor == pytest.approx(mu / 4.75, rel=1e-12)
    claimed = result.plan.details.claimed_epsilon
    assert result.plan.details.claim == CLAIM_LABEL
    assert "NOT a proven bound" in CLAIM_LABEL
    assert claimed == pytest.approx(4.0, rel=0.02)  # what the recipe was calibrated to
    assert result.plan.calibration["claim"]["epsilon"] == claimed
    guaranteed = compute_epsilon(event_from_json(result.plan.calibration["event"]), delta=1e-5)
    assert result.plan.calibration["epsilon"] == pytest.approx(guaranteed.epsilon)
    for client in result.population:
        charges = result.ledger[client]
        assert all(not c.approximate and c.secure_aggregation for c in charges)
        assert all(c.event.event.event.mu == floor for c in charges)  # the own share
        assert result.epsilon(client) == pytest.approx(guaranteed.epsilon, rel=1e-9)
        assert result.agent_epsilon(client) == pytest.approx(result.epsilon(client), rel=1e-9)
        assert result.epsilon(client) > 2 * claimed  # the claim is never what is charged


@pytest.mark.slow
def test_client_sampling_and_no_secure_aggregation_charge_participants_only() -> None:
    job = sgd_job(
        rounds=2, secagg={"enabled": False}, params={"client_sampling_rate": 0.5, "local_steps": 1}
    )
    result = run_job(
        job,
        num_agents=8,
        algorithm=DpFedSgd(random_source=SeededRandomSource(b"fedsgd-client-sampling")),
    )
    took_part = [c for r in result.rounds for c in r.participants]
    assert set(result.ledger) == set(took_part)
    assert len(took_part) < 16
    for client, charges in result.ledger.items():
        assert len(charges) == took_part.count(client)
        assert all(not c.secure_aggregation for c in charges)


def test_the_normaliser_must_be_stated_when_the_data_is_not_here(
    digits_coordinator: CoordinatorData,
) -> None:
    job = sgd_job(data={"dataset": "npz:/nonexistent/silo.npz"})
    with pytest.raises(AlgorithmError, match="state them in the job's params"):
        ALGORITHM.plan(job, population=10, data=digits_coordinator)
    stated = sgd_job(
        data={"dataset": "npz:/nonexistent/silo.npz"}, params={"expected_batch_size": 12.5}
    )
    plan = ALGORITHM.plan(stated, population=10, data=digits_coordinator)
    assert plan.details.expected_batch_size == 12.5


def _clamped_steps(x: Any, y: Any, *, limit: int | None, seed: str, steps: int = 2) -> Any:
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    return integer_dp_sgd(
        net,
        x,
        y,
        steps=steps,
        sampling_rate=1.0,
        clip=1.0,
        learning_rate=0.5,
        normalizer=10.0,
        scale_bits=4,
        noise=NoiseSpec.none(),
        stream=_stream(seed),
        coordinate_limit=limit,
    )


def test_max_local_size_clamps_each_step_instead_of_refusing(
    digits_agents: list[AgentData],
) -> None:
    """The ring bound ``M_max·⌈C·2^b⌉`` per coordinate and step holds for any data set size, the
    clamp never acts at or below M_max records, and a larger agent still takes part."""
    agent = digits_agents[0]
    bound = EncodingConfig(clip=1.0, scale_bits=4, ring_bits=64).coordinate_bound
    m_max = 5
    limit = m_max * bound
    # 40 copies of one record: the unclamped sum would reach 40·⌈C·2^b⌉ in some coordinate
    x = np.repeat(agent.x[:1], 40, axis=0)
    y = np.repeat(agent.y[:1], 40, axis=0)
    free = _clamped_steps(x, y, limit=None, seed="clamp", steps=1)
    assert np.abs(free.total).max() > limit
    clamped = _clamped_steps(x, y, limit=limit, seed="clamp", steps=1)
    assert np.abs(clamped.total).max() <= limit
    assert np.array_equal(clamped.total, np.clip(free.total, -limit, limit))
    # at most M_max records: identical with or without the clamp
    small = _clamped_steps(agent.x[:m_max], agent.y[:m_max], limit=limit, seed="small")
    plain = _clamped_steps(agent.x[:m_max], agent.y[:m_max], limit=None, seed="small")
    assert np.array_equal(small.total, plain.total)
    with pytest.raises(AlgorithmError, match="coordinate_limit"):
        _clamped_steps(x, y, limit=0, seed="bad")


def test_the_clamp_and_the_rounding_keep_one_records_sensitivity(
    digits_agents: list[AgentData],
) -> None:
    """Add/remove one record at an agent far above M_max: with the same rounding draws, the
    rounded clamped step sums (of the real clipped per-record gradients) differ by at most
    ⌈|that record's fixed-point move|⌉ per coordinate, so by at most Δ₁ in L1 and Δ₂ in L2."""
    agent = digits_agents[1]
    bits, clip, dimension = 4, 1.0, 650
    l1, l2 = step_sensitivities(clip=clip, scale_bits=bits, dimension=dimension)
    assert l2 == pytest.approx(16 + math.sqrt(dimension))
    assert l1 == pytest.approx(16 * math.sqrt(dimension) + dimension)
    net = build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=0)
    names = [name for name, _ in net.named_parameters()]
    xt = torch.as_tensor(np.concatenate([np.repeat(agent.x[:1], 30, axis=0), agent.x[1:9]]))
    yt = torch.as_tensor(np.concatenate([np.repeat(agent.y[:1], 30, axis=0), agent.y[1:9]]))
    grads = _per_sample_gradients(net, names, xt, yt).detach().to(torch.float64).numpy()
    f = fraction_bits(len(grads), 16)
    rows = fixed_point_rows(clip_rows(grads, clip), bits + f)
    limit = (3 * EncodingConfig(clip=clip, scale_bits=bits, ring_bits=64).coordinate_bound) << f
    worst = 0.0
    for k in range(30, 38):  # remove each of the 8 distinct records in turn
        for draw in range(3):
            label = f"coupled{draw}"
            with_k = round_sum(clamp(rows.sum(axis=0), limit), f, _stream(label))
            without = round_sum(
                clamp(np.delete(rows, k, axis=0).sum(axis=0), limit), f, _stream(label)
            )
            gap = (with_k - without).astype(np.float64)
            assert np.all(np.abs(gap) <= np.ceil(np.abs(rows[k]) / 2**f))
            assert np.abs(gap).sum() <= l1
            assert np.linalg.norm(gap) <= l2
            worst = max(worst, float(np.linalg.norm(gap)))
    assert worst > 0.5 * 16  # the records do move the sum
    assert np.abs(rows.sum(axis=0)).max() > limit  # the clamp acted
