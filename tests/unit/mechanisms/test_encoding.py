"""Ring encoding (docs/mechanisms.md#encoding-for-secure-aggregation): round trip, bit
budget, no wrap, unbiased rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfl.mechanisms.encoding import (
    EncodingConfig,
    bit_budget,
    centre,
    clip_l2,
    decode,
    encode,
    stochastic_round,
    to_ring,
)
from dpfl.mechanisms.noise import NoiseSpec
from dpfl.secagg import RoundParameters, client
from dpfl.secagg import server as srv
from dpfl.secagg.errors import EncodingOverflow, ParameterError
from dpfl.secagg.randomness import SeededRandomSource

SOURCE = SeededRandomSource(b"encoding-tests!!")


def test_bit_budget_is_the_smallest_safe_ring() -> None:
    # 2(N·B + ⌈κσ⌉) = 2(10·1000 + 0) = 20000 < 2^15
    assert bit_budget(summands=10, coordinate_bound=1000, noise_std=0.0) == 15
    assert bit_budget(summands=10, coordinate_bound=1000, noise_std=100.0, kappa=10) == 15
    assert bit_budget(summands=10, coordinate_bound=1000, noise_std=700.0, kappa=10) == 16
    # exactly 2^15 must be refused (R must exceed the bound): N·B = 16384/2
    assert bit_budget(summands=8, coordinate_bound=1024, noise_std=0.0) == 15
    assert bit_budget(summands=8, coordinate_bound=1023, noise_std=0.0) == 14
    for kwargs in (
        {"summands": 0, "coordinate_bound": 1, "noise_std": 0.0},
        {"summands": 1, "coordinate_bound": -1, "noise_std": 0.0},
        {"summands": 1, "coordinate_bound": 1, "noise_std": float("nan")},
        {"summands": 1, "coordinate_bound": 1.5, "noise_std": 0.0},
    ):
        with pytest.raises(ParameterError):
            bit_budget(**kwargs)  # type: ignore[arg-type]


def test_configs_that_can_wrap_are_refused() -> None:
    noise = NoiseSpec.skellam(mu=50.0)
    config = EncodingConfig.for_summands(clip=1.0, scale_bits=10, summands=100, noise=noise)
    config.check_no_wrap(100)
    smaller = EncodingConfig(clip=1.0, scale_bits=10, ring_bits=config.ring_bits - 1, noise=noise)
    with pytest.raises(EncodingOverflow, match="too small"):
        smaller.check_no_wrap(100)
    with pytest.raises(EncodingOverflow):
        config.check_no_wrap(1000)
    with pytest.raises(EncodingOverflow, match="64"):
        EncodingConfig.for_summands(clip=2.0**40, scale_bits=20, summands=10**6)


@pytest.mark.parametrize("sign", [1, -1])
def test_no_wrap_at_the_bound_with_kappa_sigma_of_noise(sign: int) -> None:
    """N vectors at ±B on every coordinate plus summed noise of ±⌈κσ⌉ decode exactly."""
    n, noise = 50, NoiseSpec.skellam(mu=200.0)
    config = EncodingConfig.for_summands(clip=3.0, scale_bits=8, summands=n, noise=noise)
    bound = config.coordinate_bound
    extreme_noise = math.ceil(10 * noise.summed_std(n))
    total = np.zeros(4, dtype=np.uint64)
    for _ in range(n):
        total += to_ring(np.full(4, sign * bound, dtype=np.int64), config.ring_bits)
    total += to_ring(np.full(4, sign * extreme_noise, dtype=np.int64), config.ring_bits)
    total &= np.uint64((1 << config.ring_bits) - 1)
    assert centre(total, config.ring_bits).tolist() == [sign * (n * bound + extreme_noise)] * 4
    # one more unit of headroom than the budget promises would wrap for some r: check the margin
    assert 2 * (n * bound + extreme_noise) < 1 << config.ring_bits


def test_encode_decode_round_trip_without_noise() -> None:
    config = EncodingConfig(clip=5.0, scale_bits=16, ring_bits=32, rounding_beta=0.0)
    x = np.array([0.5, -1.25, 3.0, -0.001, 0.0])
    x = clip_l2(x, 5.0)
    z = encode(x, config=config, stream=SOURCE.stream("round-trip"))
    assert z.dtype == np.uint64
    assert np.all(np.abs(decode(z, config=config) - x) <= 2.0**-16)


def test_sum_of_many_encoded_vectors_decodes_to_the_sum() -> None:
    n = 40
    noise = NoiseSpec.skellam(mu=4.0)
    config = EncodingConfig.for_summands(clip=1.0, scale_bits=12, summands=n, noise=noise)
    stream = SOURCE.stream("sum")
    vectors = [np.array([1.0, -0.5, 0.25]) * (i % 3 - 1) for i in range(n)]
    total = np.zeros(3, dtype=np.uint64)
    for v in vectors:
        total += encode(v, config=config, stream=stream)
    total &= np.uint64((1 << config.ring_bits) - 1)
    expected = sum(clip_l2(v, 1.0) for v in vectors)
    tolerance = (n + 10 * noise.summed_std(n)) * 2.0**-12
    assert np.all(np.abs(decode(total, config=config) - expected) <= tolerance)


def test_clipping() -> None:
    v = np.array([3.0, 4.0])
    assert np.allclose(clip_l2(v, 1.0), [0.6, 0.8])
    assert np.array_equal(clip_l2(v, 10.0), v)
    for bad in ([[1.0]], [], [1.0, float("nan")], [float("inf")]):
        with pytest.raises(ParameterError):
            clip_l2(bad, 1.0)


def test_stochastic_rounding_is_unbiased() -> None:
    values = np.repeat(np.array([0.3, -2.75, 1e-3, 12345.5, -0.0]), 40000)
    rounded = stochastic_round(values, SOURCE.stream("unbiased")).astype(np.float64)
    for j, v in enumerate([0.3, -2.75, 1e-3, 12345.5, -0.0]):
        chunk = rounded[j * 40000 : (j + 1) * 40000]
        assert set(np.unique(chunk)) <= {math.floor(v), math.floor(v) + 1}
        frac = v - math.floor(v)
        se = math.sqrt(max(frac * (1 - frac), 1e-12) / chunk.size)
        assert abs(chunk.mean() - v) <= 5 * se + 1e-12


def test_integers_round_to_themselves() -> None:
    values = np.array([-3.0, 0.0, 7.0, 2.0**40])
    assert stochastic_round(values, SOURCE.stream("ints")).tolist() == [-3, 0, 7, 2**40]


def test_conditional_rounding_meets_the_norm_bound() -> None:
    config = EncodingConfig(clip=1.0, scale_bits=2, ring_bits=32, rounding_beta=0.5)
    dim = 400
    bound = config.rounded_l2_bound(dim)
    assert bound < config.scaled_clip + math.sqrt(dim)  # the probabilistic bound is the smaller
    x = np.full(dim, 1.0 / math.sqrt(dim))  # norm exactly 1: the worst case
    stream = SOURCE.stream("conditional")
    for _ in range(20):
        z = centre(encode(x, config=config, stream=stream, add_noise=False), 32)
        assert float(np.linalg.norm(z.astype(float))) <= bound
    assert config.rounded_l1_bound(dim) == pytest.approx(bound * min(math.sqrt(dim), bound))
    assert EncodingConfig(clip=1.0, scale_bits=2, ring_bits=32, rounding_beta=0.0).rounded_l2_bound(
        dim
    ) == pytest.approx(4 + 20)


def test_centre() -> None:
    assert centre(np.array([0, 1, 127, 128, 255], dtype=np.uint64), 8).tolist() == [
        0,
        1,
        127,
        -128,
        -1,
    ]
    assert centre(np.array([2**63, 2**64 - 1], dtype=np.uint64), 64).tolist() == [-(2**63), -1]
    with pytest.raises(EncodingOverflow):
        centre(np.array([256], dtype=np.uint64), 8)


def test_json_round_trip_and_errors() -> None:
    config = EncodingConfig(
        clip=2.5, scale_bits=11, ring_bits=40, noise=NoiseSpec.discrete_gaussian(sigma=3.5)
    )
    text = config.to_json()
    assert EncodingConfig.from_json(text) == config
    assert '"kind":"discrete-gaussian"' in text
    for bad in (
        "not json",
        "[]",
        '{"clip": 1}',
        text.replace('"ring_bits":40', '"ring_bits":65'),
        text.replace("discrete-gaussian", "laplace"),
        text.replace('"clip":2.5', '"clip":-1'),
    ):
        with pytest.raises(ParameterError):
            EncodingConfig.from_json(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"clip": 0.0, "scale_bits": 1, "ring_bits": 8},
        {"clip": float("nan"), "scale_bits": 1, "ring_bits": 8},
        {"clip": 1.0, "scale_bits": -1, "ring_bits": 8},
        {"clip": 1.0, "scale_bits": 63, "ring_bits": 8},
        {"clip": 1.0, "scale_bits": 1, "ring_bits": 0},
        {"clip": 1.0, "scale_bits": 1, "ring_bits": 8, "rounding_beta": 1.0},
        {"clip": 2.0**30, "scale_bits": 40, "ring_bits": 64},
    ],
)
def test_invalid_configs(kwargs: dict[str, object]) -> None:
    with pytest.raises(ParameterError):
        EncodingConfig(**kwargs)  # type: ignore[arg-type]


def test_norm_check_is_exact_at_the_boundary() -> None:
    from dpfl.mechanisms.encoding import norm_at_most

    z = np.array([3, 4], dtype=np.int64)  # norm exactly 5
    assert norm_at_most(z, 5.0)
    assert not norm_at_most(z, math.nextafter(5.0, 0.0))
    big = np.full(10_000, 2**20, dtype=np.int64)  # norm exactly 2^20 · 100
    assert norm_at_most(big, 100.0 * 2**20)
    assert not norm_at_most(big, math.nextafter(100.0 * 2**20, 0.0))


def test_real_inputs_encoded_with_the_rounds_encoding_sum_to_the_real_total() -> None:
    """The agent's path: each real vector is encoded (clip, scale, round, noise share) with the
    round's encoding and attached as a ring vector to secure aggregation, which sums it unread;
    the decoded aggregate is the real sum."""
    encoding = EncodingConfig.for_summands(
        clip=10.0, scale_bits=10, summands=5, noise=NoiseSpec.skellam(mu=2.0)
    )
    params = RoundParameters(
        num_clients=5,
        degree=4,
        threshold=3,
        ring_bits=encoding.ring_bits,
        vector_length=3,
        min_survivors=5,
    )
    encoding.check_round(ring_bits=params.ring_bits, summands=params.num_clients)
    rng = SeededRandomSource(b"real-valued-inputs")
    state, out = srv.start_round(job_id="j", round=0, params=params, rng=rng)
    clients = {i: client.new_client(job_id="j", round=0, rng=rng.child(str(i))) for i in range(5)}
    for stage in range(4):
        for o in out:
            i = o.recipient
            if stage == 2:
                stream = rng.child(f"agent-{i}").stream("encode")
                encoded = encode([1.0, -2.0, 0.5 * i], config=encoding, stream=stream)
                clients[i] = client.with_input(clients[i], encoded)
            clients[i], reply = client.step(clients[i], o.message)
            state = srv.receive(state, i, reply)
        state, out = srv.close_stage(state)
        if isinstance(state, srv.ServerReadyToUnmask):
            state, out = srv.begin_unmask(state)
    total = decode(state.aggregate, config=encoding)
    noise = 10 * encoding.noise.summed_std(5) * 2.0**-10 + 5 * 2.0**-10
    assert np.all(np.abs(total - [5.0, -10.0, 5.0]) <= noise)


def test_an_encoding_fits_a_round_only_in_its_ring_and_without_wrapping() -> None:
    """Whoever puts an encoding beside a summation's parameters checks both (the protocol only
    adds ring elements)."""
    config = EncodingConfig.for_summands(clip=1.0, scale_bits=8, summands=4)
    config.check_round(ring_bits=config.ring_bits, summands=4)
    with pytest.raises(ParameterError, match=r"encoding ring \(\d+ bits\) differs"):
        config.check_round(ring_bits=config.ring_bits + 1, summands=4)
    with pytest.raises(EncodingOverflow, match="too small for 400 summands"):
        config.check_round(ring_bits=config.ring_bits, summands=400)
