"""The whole protocol in process (docs/secagg.md#exact-sum, #counted-after-masking, #all-or-nothing,
golden transcripts, uniformity)."""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from support.peer_pki import NOW, TestCA
from support.vectors import golden

from dpfl.secagg import (
    ParameterError,
    RoundParameters,
    SeededRandomSource,
    SimulationAborted,
    simulate,
)
from dpfl.secagg.graph import NeighbourGraph
from dpfl.secagg.identity import ClientIdentity, Signer
from dpfl.secagg.messages import MaskedInputResponse, Stage, stage_rank
from dpfl.secagg.parameters import ThreatModel

STAGES = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)
MALICIOUS_STAGES = (
    Stage.ADVERTISE_KEYS,
    Stage.SHARE_KEYS,
    Stage.MASKED_INPUT,
    Stage.CONSISTENCY,
    Stage.UNMASK,
)


def _inputs(n: int, m: int, bits: int, seed: int) -> list[np.ndarray]:
    gen = np.random.default_rng(seed)  # test data only; the protocol never uses numpy.random
    high = 1 << bits
    return [
        gen.integers(0, high, m, dtype=np.uint64, endpoint=False)
        if bits < 64
        else gen.integers(0, 2**63, m, dtype=np.uint64)
        for _ in range(n)
    ]


def _predict(
    graph: NeighbourGraph | None,
    params: RoundParameters,
    drop_at: dict[int, Stage],
    *,
    malicious: bool = False,
) -> frozenset[int] | None:
    """A3 when the protocol must succeed, None when it must abort (an independent model).

    ``malicious``: the consistency stage runs; only the agents that attested S are asked to
    unmask, and each answers only with t attesting neighbours (itself included)."""
    n, t, floor = params.num_clients, params.threshold, params.min_survivors

    def alive(stage: Stage, pool: set[int]) -> set[int]:
        return {i for i in pool if stage_rank(drop_at.get(i, Stage.RESULT)) > stage_rank(stage)}

    if graph is None:  # a malicious round that never fixed its graph: stage 1 aborted
        assert len(alive(Stage.ADVERTISE_KEYS, set(range(n)))) < floor
        return None
    hood = [set(graph.neighbours(i)) for i in range(n)]

    a1 = alive(Stage.ADVERTISE_KEYS, set(range(n)))
    if len(a1) < floor:
        return None
    a2 = {i for i in alive(Stage.SHARE_KEYS, a1) if len(hood[i] & a1) >= t}  # else i aborts
    if len(a2) < floor:
        return None
    a3 = {j for j in alive(Stage.MASKED_INPUT, a2) if len(hood[j] & a2) >= t}
    if len(a3) < floor:
        return None
    if malicious:
        attested = alive(Stage.CONSISTENCY, a3)
        for i in a3:
            if len(hood[i] & attested) < t:
                return None
        for d in a2 - a3:
            if hood[d] & a3 and len(hood[d] & attested) < t:
                return None
        unmask = {j for j in alive(Stage.UNMASK, attested) if len(hood[j] & attested) >= t}
    else:
        unmask = alive(Stage.UNMASK, a3)
    for i in a3:
        if len(hood[i] & a3) < t or len(hood[i] & unmask) < t:
            return None
    for d in a2 - a3:
        live = hood[d] & a3
        if live and (len(live) < t or len(hood[d] & unmask) < t):
            return None
    return frozenset(a3)


@st.composite
def scenarios(
    draw: st.DrawFn, stages: tuple[Stage, ...] = STAGES
) -> tuple[RoundParameters, dict[int, Stage], int]:
    n = draw(st.integers(min_value=3, max_value=60))
    if n <= 4 or (n <= 12 and draw(st.booleans())):
        k = n - 1
    else:
        k = 2 * draw(st.integers(min_value=1, max_value=min(10, (n - 2) // 2)))
    t = draw(st.integers(min_value=2, max_value=min(k + 1, 8)))
    bits = draw(st.sampled_from([8, 16, 32, 33, 64]))
    m = draw(st.integers(min_value=1, max_value=4))
    rate = draw(st.sampled_from([0.0, 0.05, 0.15, 0.3]))
    drops = draw(st.lists(st.sampled_from(stages), min_size=n, max_size=n))
    coins = draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
    drop_at = {i: s for i, (s, c) in enumerate(zip(drops, coins, strict=True)) if c < rate}
    floor = draw(st.integers(min_value=t, max_value=max(t, n - len(drop_at))))
    params = RoundParameters(
        num_clients=n, degree=k, threshold=t, ring_bits=bits, vector_length=m, min_survivors=floor
    )
    return params, drop_at, draw(st.integers(0, 2**16))


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_exact_sum_under_random_dropouts(
    scenario: tuple[RoundParameters, dict[int, Stage], int],
) -> None:
    """decode(z) = Σ_{A3} x_i whenever the protocol can finish, and an abort exactly otherwise."""
    params, drop_at, seed = scenario
    n = params.num_clients
    vectors = _inputs(n, params.vector_length, params.ring_bits, seed)
    schedule: dict[Stage, list[int]] = {}
    for i, stage in drop_at.items():
        schedule.setdefault(stage, []).append(i)
    rng = SeededRandomSource(seed.to_bytes(4, "big") * 4)
    try:
        result = simulate(vectors, params=params, dropouts=schedule, rng=rng)
    except SimulationAborted as exc:
        aborted_graph = exc.state.ctx.graph
    else:
        aborted_graph = None
    if aborted_graph is not None:
        assert _predict(aborted_graph, params, drop_at) is None
        return
    a3 = _predict(result.graph, params, drop_at)
    assert a3 == result.survivors.a3
    mask = np.uint64((1 << params.ring_bits) - 1) if params.ring_bits < 64 else np.uint64(2**64 - 1)
    expected = np.zeros(params.vector_length, dtype=np.uint64)
    for i in a3:
        expected += vectors[i]
    assert np.array_equal(result.aggregate, expected & mask)
    # counted after masking: a client that drops during unmask is in the sum exactly when it
    # would be had it stayed (one whose neighbours all left earlier never was)
    for i in [i for i, s in drop_at.items() if s is Stage.UNMASK]:
        stayed = _predict(result.graph, params, {j: s for j, s in drop_at.items() if j != i})
        assert stayed is not None
        assert (i in a3) == (i in stayed)


@functools.cache
def _peers() -> tuple[TestCA, tuple[Signer, ...]]:
    """One federation CA and 60 certified peers, made once for the property test."""
    ca = TestCA.make()
    return ca, tuple(ca.signer(f"peer-{i}") for i in range(60))


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(MALICIOUS_STAGES))
def test_exact_sum_under_random_dropouts_malicious(
    scenario: tuple[RoundParameters, dict[int, Stage], int],
) -> None:
    """The same exact-sum property for the malicious-secure variant, with dropouts at the
    consistency stage as well: decode(z) = Σ_{A3} x_i or an abort exactly when predicted."""
    params, drop_at, seed = scenario
    n = params.num_clients
    ca, signers = _peers()
    authority = ca.authority()
    identities = [ClientIdentity(signers[i], authority, 0, NOW) for i in range(n)]
    vectors = _inputs(n, params.vector_length, params.ring_bits, seed)
    schedule: dict[Stage, list[int]] = {}
    for i, stage in drop_at.items():
        schedule.setdefault(stage, []).append(i)
    rng = SeededRandomSource(seed.to_bytes(4, "big") * 4)
    try:
        result = simulate(
            vectors,
            params=params,
            dropouts=schedule,
            rng=rng,
            threat_model=ThreatModel.MALICIOUS,
            identities=identities,
        )
    except SimulationAborted as exc:
        aborted_graph = exc.state.ctx.graph_or_none
        aborted = True
    else:
        aborted = False
    if aborted:
        assert _predict(aborted_graph, params, drop_at, malicious=True) is None
        return
    a3 = _predict(result.graph, params, drop_at, malicious=True)
    assert a3 == result.survivors.a3
    mask = np.uint64((1 << params.ring_bits) - 1) if params.ring_bits < 64 else np.uint64(2**64 - 1)
    expected = np.zeros(params.vector_length, dtype=np.uint64)
    for i in a3:
        expected += vectors[i]
    assert np.array_equal(result.aggregate, expected & mask)
    # counted after masking: a client that drops at consistency or unmask is in the sum exactly
    # when it would be had it stayed (one whose neighbours all left earlier never was)
    for i in [i for i, s in drop_at.items() if s in (Stage.CONSISTENCY, Stage.UNMASK)]:
        others = {j: s for j, s in drop_at.items() if j != i}
        stayed = _predict(result.graph, params, others, malicious=True)
        assert stayed is not None
        assert (i in a3) == (i in stayed)


def test_dropouts_at_every_stage_with_the_solver_parameters() -> None:
    params = RoundParameters.choose(
        num_clients=60, vector_length=16, ring_bits=32, corrupt_fraction=0.05, dropout_fraction=0.15
    )
    vectors = _inputs(60, 16, 32, 7)
    drops = {
        Stage.ADVERTISE_KEYS: [0, 1],
        Stage.SHARE_KEYS: [2, 3],
        Stage.MASKED_INPUT: [4, 5],
        Stage.UNMASK: [6, 7],
    }
    seen: list[str] = []
    result = simulate(
        vectors,
        params=params,
        dropouts=drops,
        rng=SeededRandomSource(b"sixty-clients-ok"),
        before_unmask=lambda state: seen.append(type(state).__name__),
    )
    assert seen == ["ServerReadyToUnmask"]
    assert result.survivors.a3 == frozenset(range(6, 60))
    expected = sum((vectors[i] for i in range(6, 60)), np.zeros(16, np.uint64)) & np.uint64(
        2**32 - 1
    )
    assert np.array_equal(result.aggregate, expected)
    assert set(result.timings) == set(STAGES)
    assert result.timings[Stage.MASKED_INPUT].clients == 54  # A2 minus the two silent ones
    assert result.total_seconds > 0


def test_abort_raises_with_the_survivors_and_no_aggregate() -> None:
    params = RoundParameters(
        num_clients=6, degree=2, threshold=3, ring_bits=16, vector_length=2, min_survivors=3
    )
    with pytest.raises(SimulationAborted) as info:
        simulate(
            _inputs(6, 2, 16, 1),
            params=params,
            dropouts={Stage.UNMASK: [0, 1, 2, 3]},
            rng=SeededRandomSource(b"abort-abort-abort"),
        )
    assert info.value.state.at_stage is Stage.UNMASK
    assert info.value.state.survivors.a3 == frozenset(range(6))


def test_invalid_arguments() -> None:
    params = RoundParameters(
        num_clients=4, degree=3, threshold=2, ring_bits=8, vector_length=2, min_survivors=2
    )
    with pytest.raises(ParameterError, match="3 vectors"):
        simulate(_inputs(3, 2, 8, 0), params=params)
    with pytest.raises(ParameterError, match="dropouts"):
        simulate(_inputs(4, 2, 8, 0), params=params, dropouts={Stage.RESULT: [1]})
    with pytest.raises(ParameterError, match=r"\[0, 4\)"):
        simulate(_inputs(4, 2, 8, 0), params=params, dropouts={Stage.UNMASK: [4]})
    with pytest.raises(ParameterError, match="integers"):
        simulate([np.zeros(2)] * 4, params=params)


def test_system_randomness_by_default() -> None:
    params = RoundParameters(
        num_clients=4, degree=3, threshold=2, ring_bits=8, vector_length=2, min_survivors=2
    )
    vectors = [np.array([i, 2 * i]) for i in range(4)]
    assert simulate(vectors, params=params).aggregate.tolist() == [6, 12]


# -- golden transcript ----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__} | {
            f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, np.ndarray):
        return [int(v) for v in value]
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(value)
    return value


def test_golden_transcript() -> None:
    """Fixed randomness gives byte-identical messages: a change of any derivation, encoding or
    message layout shows up here (regenerate with DPFL_REGENERATE_VECTORS=1 only on purpose)."""
    params = RoundParameters(
        num_clients=5, degree=4, threshold=2, ring_bits=12, vector_length=3, min_survivors=3
    )
    vectors = [np.array([i, 100 * i, 4095 - i]) for i in range(5)]
    result = simulate(
        vectors,
        params=params,
        dropouts={Stage.SHARE_KEYS: [1], Stage.UNMASK: [3]},
        rng=SeededRandomSource(b"golden-transcript-seed"),
        job_id="golden",
        round=7,
        record=True,
    )
    produced = {
        "params": _jsonable(params),
        "order": list(result.graph.order),
        "survivors": _jsonable(result.survivors),
        "aggregate": _jsonable(result.aggregate),
        "messages": [
            {"client": e.client, "to_server": e.to_server, "message": _jsonable(e.message)}
            for e in result.transcript
        ],
    }
    assert produced == golden("secagg_transcript_n5.json", produced)
    assert produced["aggregate"] == [(0 + 2 + 3 + 4), (100 * 9) % 4096, (4 * 4095 - 9) % 4096]


# -- masked inputs look uniform --------------------------------------------------------------------


def test_masked_inputs_are_uniform_whatever_the_input() -> None:
    n, m, bits = 6, 20000, 16
    params = RoundParameters(
        num_clients=n, degree=2, threshold=2, ring_bits=bits, vector_length=m, min_survivors=n
    )
    vectors = [np.zeros(m, dtype=np.uint64), np.full(m, 12345, dtype=np.uint64)] + [
        np.arange(m, dtype=np.uint64) % np.uint64(1 << bits) for _ in range(n - 2)
    ]
    result = simulate(
        vectors, params=params, rng=SeededRandomSource(b"uniformity-check"), record=True
    )
    masked = [
        e.message.masked_input
        for e in result.transcript
        if isinstance(e.message, MaskedInputResponse)
    ]
    assert len(masked) == n
    for y in masked:
        top = (y >> np.uint64(bits - 4)).astype(int)
        assert stats.chisquare(np.bincount(top, minlength=16)).pvalue > 1e-6
        low = (y & np.uint64(0xF)).astype(int)
        assert stats.chisquare(np.bincount(low, minlength=16)).pvalue > 1e-6
    assert not np.array_equal(masked[0], masked[1])
