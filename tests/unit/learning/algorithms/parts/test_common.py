"""The shared pieces of the algorithms: client sampling, the noise split, scale bits, params."""

from __future__ import annotations

import json
import math
import random
from typing import Literal

import pytest
from pydantic import Field

from dpfl.accounting import GaussianEvent, PoissonSampledEvent, SelfComposedEvent
from dpfl.learning.algorithms.base import AlgorithmError, Contract, parse_contract
from dpfl.learning.algorithms.parts import common
from dpfl.mechanisms import EncodingConfig, NoiseKind
from dpfl.secagg import SeededRandomSource


def _stream(label: str = "s"):
    return SeededRandomSource(b"common-tests-seed-0000").stream(label)


@pytest.mark.parametrize("rate", [0.3, 0.05, 0.9])
def test_poisson_sample_has_the_rate(rate: float) -> None:
    population = [f"c{i}" for i in range(20_000)]
    chosen = common.poisson_sample(population, rate, _stream(str(rate)))
    n = len(population)
    # binomial: within 5 standard deviations
    assert abs(len(chosen) - rate * n) <= 5 * math.sqrt(n * rate * (1 - rate))
    assert len(set(chosen)) == len(chosen)
    assert set(chosen) <= set(population)
    # order kept, membership independent of position: both halves near the rate
    half = set(population[: n // 2])
    first = sum(c in half for c in chosen)
    assert abs(first - rate * n / 2) <= 5 * math.sqrt(n / 2 * rate * (1 - rate))


def test_poisson_sample_is_fresh_per_stream_and_exact_at_the_edges() -> None:
    population = [f"c{i}" for i in range(500)]
    a = common.poisson_sample(population, 0.5, _stream("a"))
    b = common.poisson_sample(population, 0.5, _stream("b"))
    assert a != b
    assert a == common.poisson_sample(population, 0.5, _stream("a"))  # seeded: reproducible
    assert common.poisson_sample(population, 1.0, _stream()) == population
    # a rate whose denominator exceeds 2^64 takes the exact big-integer path
    tiny = common.poisson_sample(population * 4, 2.0**-70, _stream("tiny"))
    assert tiny == []
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(AlgorithmError, match="sampling rate"):
            common.poisson_sample(population, bad, _stream())


def _share(kind: NoiseKind, total: float, **kw: object) -> float:
    args = {
        "secure_aggregation": True,
        "honest_fraction": 1.0,
        "dropout_fraction": 0.0,
        **kw,
    }
    return common.per_agent_noise(kind=kind, total=total, **args).parameter  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [NoiseKind.SKELLAM, NoiseKind.DISCRETE_GAUSSIAN])
def test_noise_share_covers_the_total_over_the_honest_survivors(kind: NoiseKind) -> None:
    rng = random.Random(7)
    for _ in range(2000):
        total = rng.uniform(0.1, 1e7)
        t = rng.choice([1.0, 0.9, 2 / 3, rng.uniform(0.05, 1.0)])
        n = rng.randint(1, 5000)
        dropout = rng.choice([0.0, 0.05, 0.2, rng.uniform(0.0, 0.9)])
        floor = max(1, math.ceil(n * (1 - dropout)))
        # the secure aggregation's floor, sometimes raised (Shamir threshold), sometimes an
        # artificially low one (the larger, survivor-based share must then win)
        survivors = rng.choice([floor, rng.randint(floor, n), rng.randint(1, floor)])
        spec = common.per_agent_noise(
            kind=kind,
            total=total,
            secure_aggregation=True,
            honest_fraction=t,
            min_survivors=survivors,
            participants=n,
            dropout_fraction=dropout,
        )
        honest = math.ceil(t * survivors - 1e-9)  # fewest honest survivors possible
        count = min(t * n * (1 - dropout), t * survivors)
        if kind is NoiseKind.SKELLAM:
            assert spec.parameter * honest >= total
            assert spec.parameter <= total / count * (1 + 1e-12)
        else:
            assert spec.parameter**2 * honest >= total**2 * (1 - 1e-12)
            assert spec.parameter <= total / math.sqrt(count) * (1 + 1e-12)
        common.check_noise(
            spec,
            kind=kind,
            total=total,
            secure_aggregation=True,
            honest_fraction=t,
            min_survivors=survivors,
        )


@pytest.mark.parametrize("kind", [NoiseKind.SKELLAM, NoiseKind.DISCRETE_GAUSSIAN])
@pytest.mark.parametrize(("t", "dropout"), [(1.0, 0.0), (1.0, 0.05), (0.8, 0.2), (2 / 3, 0.3)])
def test_summed_noise_without_dropouts_does_not_depend_on_the_participant_count(
    kind: NoiseKind, t: float, dropout: float
) -> None:
    """N shares add up to total/(t(1−δ)) (Skellam μ; discrete-Gaussian variance σ²/(t(1−δ)))
    for every N, with the survivor floor the secure aggregation uses, ⌈N(1−δ)⌉ — or higher."""
    total = 7_654.321
    want = (
        total / (t * (1 - dropout)) if kind is NoiseKind.SKELLAM else total**2 / (t * (1 - dropout))
    )
    sums = []
    for n in (2, 3, 7, 10, 11, 64, 999, 5000):
        survivors = max(1, math.ceil(n * (1 - dropout)))
        for m in {survivors, min(n, survivors + 1), n}:  # a Shamir threshold may raise it
            share = _share(
                kind,
                total,
                honest_fraction=t,
                min_survivors=m,
                participants=n,
                dropout_fraction=dropout,
            )
            sums.append(n * share if kind is NoiseKind.SKELLAM else n * share * share)
    assert sums == pytest.approx([want] * len(sums), rel=1e-13)
    # a split over ⌈N(1−δ)⌉ would move with N whenever N(1−δ) is not an integer
    if dropout > 0:
        old = [n * total / (t * math.ceil(n * (1 - dropout))) for n in range(2, 41)]
        assert max(old) / min(old) > 1 + 1e-3


def test_noise_share_arguments_are_checked() -> None:
    kind = NoiseKind.SKELLAM
    with pytest.raises(AlgorithmError, match="at least min_survivors"):
        _share(kind, 1.0, min_survivors=5, participants=4)
    with pytest.raises(AlgorithmError, match="dropout fraction"):
        _share(kind, 1.0, min_survivors=2, participants=4, dropout_fraction=1.0)
    with pytest.raises(AlgorithmError, match="participants must be an integer"):
        _share(kind, 1.0, min_survivors=2, participants=4.0)
    with pytest.raises(AlgorithmError, match="honest fraction"):
        _share(kind, 1.0, min_survivors=2, participants=4, honest_fraction=0.0)


def test_without_secure_aggregation_each_agent_adds_all_the_noise() -> None:
    spec = common.per_agent_noise(
        kind=NoiseKind.SKELLAM,
        total=1234.5,
        secure_aggregation=False,
        honest_fraction=0.5,
        min_survivors=40,
        participants=50,
        dropout_fraction=0.2,
    )
    assert spec.parameter == 1234.5
    shared = common.per_agent_noise(
        kind=NoiseKind.SKELLAM,
        total=1234.5,
        secure_aggregation=True,
        honest_fraction=0.5,
        min_survivors=40,
        participants=50,
        dropout_fraction=0.2,
    )
    assert shared.parameter == pytest.approx(1234.5 / 20, rel=1e-12)
    with pytest.raises(AlgorithmError, match="below"):
        common.check_noise(
            shared,
            kind=NoiseKind.SKELLAM,
            total=1234.5,
            secure_aggregation=False,
            honest_fraction=0.5,
            min_survivors=40,
        )
    with pytest.raises(AlgorithmError, match="discrete-gaussian noise but the events need"):
        common.check_noise(
            common.per_agent_noise(
                kind=NoiseKind.DISCRETE_GAUSSIAN,
                total=3.0,
                secure_aggregation=True,
                honest_fraction=1.0,
                min_survivors=4,
                participants=4,
                dropout_fraction=0.0,
            ),
            kind=NoiseKind.SKELLAM,
            total=3.0,
            secure_aggregation=True,
            honest_fraction=1.0,
            min_survivors=4,
        )


@pytest.mark.parametrize(("clip", "dimension"), [(1.0, 650), (1.0, 21_000), (0.05, 100), (40.0, 7)])
def test_scale_bits_are_the_smallest_within_the_inflation(clip: float, dimension: int) -> None:
    bits = common.choose_scale_bits(clip=clip, dimension=dimension)
    chosen = EncodingConfig(clip=clip, scale_bits=bits, ring_bits=64)
    assert chosen.rounded_l2_bound(dimension) <= 1.001 * chosen.scaled_clip
    if bits > 0:
        coarser = EncodingConfig(clip=clip, scale_bits=bits - 1, ring_bits=64)
        assert coarser.rounded_l2_bound(dimension) > 1.001 * coarser.scaled_clip


class _Toy(Contract):
    n: int = Field(ge=1)
    f: float = Field(ge=0, le=1)
    s: Literal["c"]
    b: bool
    q: tuple[int, ...] = ()


def test_contracts_name_the_bad_field() -> None:
    good = {"n": 3, "f": 0.5, "s": "c", "b": True}
    toy = parse_contract(_Toy, good, where="params")
    assert (toy.n, toy.f, toy.s, toy.b) == (3, 0.5, "c", True)
    assert parse_contract(_Toy, toy, where="params") == toy  # a contract is re-validated
    assert parse_contract(_Toy, json.dumps(good), where="params") == toy
    cases: list[tuple[object, str]] = [
        ({k: v for k, v in good.items() if k != "n"}, r"params\.n: required field is missing"),
        ({**good, "n": 0}, r"params\.n: must be >= 1"),
        ({**good, "n": 0.5}, r"params\.n: "),  # no coercion of a float into an integer
        ({**good, "n": True}, r"params\.n: "),  # nor of a boolean
        ({**good, "f": True}, r"params\.f: "),
        ({**good, "f": 1.5}, r"params\.f: must be <= 1"),
        ({**good, "b": 1}, r"params\.b: "),
        ({**good, "s": "a"}, r"params\.s: must be one of"),
        ({**good, "q": [1, "x"]}, r"params\.q\.1: "),
        ({**good, "zzz": 1}, r"params\.zzz: unknown field"),
        ({**good, "f": float("nan")}, r"params: not a JSON object"),
        ([1, 2], r"params: "),
        ("{", r"params: "),
    ]
    for data, message in cases:
        with pytest.raises(AlgorithmError, match=message):
            parse_contract(_Toy, data, where="params")
    # several mistakes are reported at once
    with pytest.raises(AlgorithmError, match=r"params\.n: .*; params\.s: "):
        parse_contract(_Toy, {**good, "n": 0, "s": "a"}, where="params")


def test_an_agent_refuses_a_task_field_it_does_not_know() -> None:
    """An unknown field could change what the claimed privacy means: the task is refused, the
    message names the field and says the agent may be older than the coordinator."""
    from dpfl.learning.algorithms.pate_fl import ALGORITHM as PATE

    task = {
        "algorithm": "pate-fl",
        "job": "j",
        "round": 1,
        "noise": "skellam",
        "noise_total": 10.0,
        "noise_multiplier": 1.0,
        "scale_bits": 8,
        "secure_aggregation": True,
        "honest_fraction": 1.0,
        "unit": "agent",
        "delta": 1e-5,
        "model": "logreg",
        "num_classes": 10,
        "queries": [0, 3],
        "public_size": 5,
        "level": "agent",
        "vote": "one-hot",
        "teacher": {"epochs": 1, "learning_rate": 0.1, "momentum": 0.9, "batch_size": 8, "seed": 0},
    }
    assert PATE.parse_task(task).queries == (0, 3)
    with pytest.raises(AlgorithmError, match=r"params\.clip_votes: unknown field .*older than"):
        PATE.parse_task({**task, "clip_votes": 2})
    with pytest.raises(AlgorithmError, match=r"params\.queries: .*duplicates"):
        PATE.parse_task({**task, "queries": [1, 1]})
    with pytest.raises(AlgorithmError, match=r"params\.queries: .*\[0, 5\)"):
        PATE.parse_task({**task, "queries": [0, 5]})
    with pytest.raises(AlgorithmError, match=r"params\.algorithm: must be one of"):
        PATE.parse_task({**task, "algorithm": "dp-fedavg"})
    with pytest.raises(AlgorithmError, match=r"params\.teacher\.epochs: must be >= 1"):
        PATE.parse_task({**task, "teacher": {**task["teacher"], "epochs": 0}})  # type: ignore[dict-item]


@pytest.mark.slow
def test_calibration_meets_the_target_or_refuses_a_weak_given_noise() -> None:
    def make(z: float) -> SelfComposedEvent:
        return SelfComposedEvent(PoissonSampledEvent(0.3, GaussianEvent.from_multiplier(z)), 10)

    z, record = common.calibrate_or_check(make, given=None, target_epsilon=4.0, delta=1e-5)
    assert record["mode"] == "calibrated"
    assert record["epsilon"] <= 4.0
    assert record["event"]["kind"] == "self_composed"
    _, given = common.calibrate_or_check(make, given=2 * z, target_epsilon=4.0, delta=1e-5)
    assert given["mode"] == "given"
    assert given["epsilon"] < 4.0
    with pytest.raises(AlgorithmError, match="above the target"):
        common.calibrate_or_check(make, given=z / 2, target_epsilon=4.0, delta=1e-5)
    with pytest.raises(AlgorithmError, match="neither"):
        common.calibrate_or_check(make, given=None, target_epsilon=None, delta=1e-5)
    # (at δ = 1e-5 the largest multiplier searched is (0, δ)-DP here: its total variation is
    # below δ, which the fine PLD grid now sees; at δ = 1e-10 ε > 1e-9 stays out of reach)
    with pytest.raises(AlgorithmError, match="calibration failed"):
        common.calibrate_or_check(make, given=None, target_epsilon=1e-9, delta=1e-10)
