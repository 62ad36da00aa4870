"""The agent's two summations (``dpfl.client.summation``): a plain round's mode check, setup
validation, request checks and unmasked answer; a masked round driven through the real secagg
server; and the deviations each strategy refuses."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest

from dpfl.client.summation import (
    ModeMismatchError,
    PlainParameters,
    PlainSummation,
    SecureParameters,
    SecureSummation,
    Summation,
    check_mode,
    is_plain_setup,
    start_summation,
)
from dpfl.learning.algorithms.base import AlgorithmError, TaskParams, parse_contract
from dpfl.mechanisms import EncodingConfig
from dpfl.mechanisms.noise import NoiseKind, NoiseSpec
from dpfl.secagg import RoundParameters
from dpfl.secagg import messages as sm
from dpfl.secagg import server as server_sm
from dpfl.secagg.errors import (
    DuplicateMessage,
    EncodingOverflow,
    ParameterError,
    ProtocolAborted,
    StaleMessage,
    WrongStage,
)
from dpfl.secagg.primitives import compute_session_id
from dpfl.secagg.randomness import SeededRandomSource
from dpfl.secagg.server_states import ServerCompleted, ServerReadyToUnmask, ServerState

JOB, ROUND, M = "job-p", 3, 8
ENCODING = EncodingConfig.for_summands(
    clip=1.0, scale_bits=8, summands=4, noise=NoiseSpec(NoiseKind.SKELLAM, 100.0)
)
NONCE = os.urandom(32)
SESSION = compute_session_id(job_id=JOB, round=ROUND, nonce=NONCE)


def request(**changes: Any) -> sm.AdvertiseKeysRequest:
    session = changes.pop("session_id", SESSION)
    fields: dict[str, Any] = {
        "client_index": 1,
        "num_clients": 4,
        "degree": 0,
        "threshold": 0,
        "ring_bits": ENCODING.ring_bits,
        "vector_length": M,
        "min_survivors": 1,
        "encoding_json": ENCODING.to_json(),
        "session_nonce": NONCE,
    }
    fields.update(changes)
    return sm.AdvertiseKeysRequest(
        header=sm.RoundHeader(JOB, ROUND, sm.Stage.ADVERTISE_KEYS, session),
        setup=sm.SecAggSetup(**fields),
    )


def acknowledged() -> PlainSummation:
    params = PlainParameters.from_request(request(), job_id=JOB, round=ROUND)
    summation, ack = start_summation(
        params,
        request(),
        job_id=JOB,
        round=ROUND,
        rng=SeededRandomSource(b"a plain round draws nothing"),
    )
    assert isinstance(summation, PlainSummation)
    assert isinstance(ack, sm.AdvertiseKeysResponse)
    return summation


def test_the_plain_marker_is_degree_and_threshold_zero() -> None:
    assert is_plain_setup(request().setup)
    assert not is_plain_setup(request(degree=2, threshold=2).setup)
    assert not is_plain_setup(request(threshold=2).setup)


TASK: dict[str, Any] = {
    "algorithm": "dp-fedavg",
    "job": "p",
    "round": ROUND,
    "noise": "skellam",
    "noise_total": 100.0,
    "noise_multiplier": 1.0,
    "scale_bits": 8,
    "honest_fraction": 1.0,
    "unit": "agent",
    "delta": 1e-5,
}


@pytest.mark.parametrize(
    ("flag", "plain", "refused"),
    [
        (False, True, False),
        (True, True, True),  # the downgrade
        (True, False, False),
        (False, False, True),
    ],
)
def test_the_setup_mode_must_be_the_tasks(flag: bool, plain: bool, refused: bool) -> None:
    task = parse_contract(TaskParams, {**TASK, "secure_aggregation": flag}, where="params")
    setup = (request() if plain else request(degree=2, threshold=2)).setup
    if refused:
        with pytest.raises(ModeMismatchError, match="secure"):
            check_mode(task, setup)
    else:
        check_mode(task, setup)
    alone = request(num_clients=1, client_index=0).setup
    if plain and flag:  # one agent alone: the local policy decides
        check_mode(task, alone)
        with pytest.raises(ModeMismatchError, match="one-agent round"):
            check_mode(task, alone, alone_unmasked=False)


@pytest.mark.parametrize("flag", [None, "false", 0, 1])
def test_only_a_boolean_flag_makes_a_task(flag: object) -> None:
    """A task that does not say, or says it with anything but a boolean, never reaches the mode
    check: the invitation is declined when its task is parsed."""
    data = TASK if flag is None else {**TASK, "secure_aggregation": flag}
    with pytest.raises(AlgorithmError, match=r"params\.secure_aggregation"):
        parse_contract(TaskParams, data, where="params")


def test_a_valid_setup_and_its_acknowledgement() -> None:
    params = PlainParameters.from_request(request(), job_id=JOB, round=ROUND)
    assert (params.num_clients, params.client_index, params.min_survivors) == (4, 1, 1)
    assert params.encoding == ENCODING
    state = PlainSummation(job_id=JOB, round=ROUND, session_id=SESSION, params=params)
    ack = state.acknowledgement()
    assert not state.secure
    assert ack.header == sm.RoundHeader(JOB, ROUND, sm.Stage.ADVERTISE_KEYS, SESSION)
    assert (ack.encryption_public_key, ack.masking_public_key, ack.signature) == (b"", b"", b"")
    assert state.stage is sm.Stage.ADVERTISE_KEYS


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"degree": 2}, "not a plain setup"),
        ({"session_id": b"short"}, "32 bytes"),
        ({"session_id": b"\x00" * 32}, "does not match"),
        ({"session_nonce": os.urandom(32)}, "does not match"),
        ({"num_clients": 0}, "num_clients"),
        ({"client_index": 4}, "client_index"),
        ({"min_survivors": 2}, "min_survivors"),
        ({"min_survivors": 0}, "min_survivors"),
        ({"ring_bits": 0}, "ring_bits"),
        ({"ring_bits": 65}, "ring_bits"),
        ({"vector_length": 0}, "vector_length"),
        ({"encoding_json": ""}, "encoding_json"),
        ({"encoding_json": "{"}, "JSON"),
        ({"ring_bits": ENCODING.ring_bits - 1}, "differs"),
    ],
)
def test_malformed_setups_name_the_field(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ParameterError, match=match):
        PlainParameters.from_request(request(**changes), job_id=JOB, round=ROUND)


def test_a_setup_of_another_round_or_a_ring_that_wraps_is_refused() -> None:
    with pytest.raises(ParameterError, match="does not match"):
        PlainParameters.from_request(request(), job_id=JOB, round=ROUND + 1)
    small = dataclasses.replace(ENCODING, ring_bits=ENCODING.required_ring_bits(4) - 1)
    with pytest.raises(EncodingOverflow):
        PlainParameters.from_request(
            request(encoding_json=small.to_json(), ring_bits=small.ring_bits),
            job_id=JOB,
            round=ROUND,
        )


def masked_input_request(**changes: Any) -> sm.MaskedInputRequest:
    header = sm.RoundHeader(JOB, ROUND, sm.Stage.MASKED_INPUT, SESSION)
    return sm.MaskedInputRequest(
        header=dataclasses.replace(header, **changes.pop("header", {})),
        shares=changes.pop("shares", ()),
    )


def test_requests_after_the_acknowledgement() -> None:
    state = acknowledged()
    assert state.input_request(masked_input_request()) == masked_input_request()
    with pytest.raises(StaleMessage):
        state.input_request(masked_input_request(header={"round": ROUND + 1}))
    with pytest.raises(StaleMessage):
        state.input_request(masked_input_request(header={"job_id": "other"}))
    with pytest.raises(StaleMessage, match="session"):
        state.input_request(masked_input_request(header={"session_id": b"\x01" * 32}))
    with pytest.raises(WrongStage):
        state.input_request(masked_input_request(header={"stage": sm.Stage.UNMASK}))
    with pytest.raises(DuplicateMessage, match="acknowledged"):
        state.input_request(request())
    share = sm.EncryptedShare(sender=0, receiver=1, ciphertext=b"x")
    with pytest.raises(ProtocolAborted, match=r"plain round aborted: .* carries 1 shares"):
        state.input_request(masked_input_request(shares=(share,)))


def test_a_plain_round_refuses_the_stages_of_a_masked_one() -> None:
    """A share-keys or unmask request (a coordinator driving a masked round against a plain
    agent, or replaying one) is refused whichever way it reaches the summation."""
    state = acknowledged()
    share_keys = sm.ShareKeysRequest(
        header=sm.RoundHeader(JOB, ROUND, sm.Stage.SHARE_KEYS, SESSION), peers=()
    )
    unmask = sm.UnmaskRequest(
        header=sm.RoundHeader(JOB, ROUND, sm.Stage.UNMASK, SESSION), alive=(), dropped=()
    )
    for message in (share_keys, unmask):
        with pytest.raises(WrongStage, match="without secure aggregation"):
            state.input_request(message)
        with pytest.raises(WrongStage, match="without secure aggregation"):
            state.answer(message)
    with pytest.raises(WrongStage, match="only the masked input"):
        state.answer(masked_input_request())
    assert state.stage is sm.Stage.ADVERTISE_KEYS


def test_the_answer_is_the_vector_itself_once() -> None:
    state = acknowledged()
    vector = np.arange(M, dtype=np.uint64) * 100
    sent, reply = state.contribute(vector, masked_input_request())
    assert sent.sent
    assert sent.stage is sm.Stage.MASKED_INPUT
    assert isinstance(reply, sm.MaskedInputResponse)
    assert reply.header == sm.RoundHeader(JOB, ROUND, sm.Stage.MASKED_INPUT, SESSION)
    np.testing.assert_array_equal(reply.masked_input, vector)
    with pytest.raises(DuplicateMessage):
        sent.contribute(vector, masked_input_request())
    with pytest.raises(DuplicateMessage):
        sent.input_request(masked_input_request())
    with pytest.raises(ParameterError, match="expected 8 values"):
        state.contribute(vector[:-1], masked_input_request())
    too_big = vector.copy()
    too_big[0] = np.uint64(1) << np.uint64(ENCODING.ring_bits)
    with pytest.raises(ParameterError, match="bits"):
        state.contribute(too_big, masked_input_request())
    with pytest.raises(ParameterError, match="integers"):
        state.contribute(vector.astype(np.float64), masked_input_request())


# -- a masked round -------------------------------------------------------------------------


SECURE = RoundParameters(
    num_clients=3, degree=2, threshold=2, ring_bits=16, vector_length=4, min_survivors=2
)
SECURE_ENCODING = EncodingConfig(clip=1.0, scale_bits=4, ring_bits=16)


def secure_setup(encoding_json: str = SECURE_ENCODING.to_json()) -> sm.SecAggSetup:
    """Client 0's setup of :data:`SECURE` from the real secagg server, with ``encoding_json``."""
    rng = SeededRandomSource(b"summation-tests!")
    _, out = server_sm.start_round(
        job_id=JOB, round=ROUND, params=SECURE, rng=rng, encoding_json=encoding_json
    )
    assert isinstance(out[0].message, sm.AdvertiseKeysRequest)
    return out[0].message.setup


def test_a_masked_setup_carries_the_encoding_beside_the_protocols_parameters() -> None:
    params = SecureParameters.from_setup(secure_setup())
    assert params.encoding == SECURE_ENCODING
    assert RoundParameters.from_setup(secure_setup()) == SECURE
    assert dataclasses.astuple(params)[:-2] == dataclasses.astuple(SECURE)
    assert not params.malicious


@pytest.mark.parametrize(
    ("encoding_json", "error", "match"),
    [
        ("", ParameterError, "encoding_json"),
        ("{", ParameterError, "JSON"),
        (dataclasses.replace(SECURE_ENCODING, ring_bits=17).to_json(), ParameterError, "differs"),
        # 3 vectors of bound 2^14 wrap a 16-bit ring
        (dataclasses.replace(SECURE_ENCODING, scale_bits=14).to_json(), EncodingOverflow, "16"),
    ],
)
def test_a_masked_setup_whose_encoding_does_not_fit_is_refused(
    encoding_json: str, error: type[Exception], match: str
) -> None:
    """The protocol carries the encoding unread, so the agent checks it against the ring and
    the number of summands itself."""
    with pytest.raises(error, match=match):
        SecureParameters.from_setup(secure_setup(encoding_json))


def secure_round() -> tuple[ServerState, dict[int, Summation], dict[int, sm.ServerMessage]]:
    """The real secagg server's setup, acknowledged by three agents' summations."""
    rng = SeededRandomSource(b"summation-tests!")
    server, out = server_sm.start_round(
        job_id=JOB, round=ROUND, params=SECURE, rng=rng, encoding_json=SECURE_ENCODING.to_json()
    )
    agents: dict[int, Summation] = {}
    for o in out:
        assert isinstance(o.message, sm.AdvertiseKeysRequest)
        params = SecureParameters.from_setup(o.message.setup)
        agent, reply = start_summation(
            params, o.message, job_id=JOB, round=ROUND, rng=rng.child(f"agent-{o.recipient}")
        )
        assert isinstance(agent, SecureSummation)
        assert agent.secure
        assert isinstance(reply, sm.AdvertiseKeysResponse)
        assert reply.encryption_public_key
        agents[o.recipient] = agent
        server = server_sm.receive(server, o.recipient, reply)
    server, out = server_sm.close_stage(server)
    return server, agents, {o.recipient: o.message for o in out}


def test_a_masked_round_sums_the_agents_vectors() -> None:
    server, agents, requests = secure_round()
    vectors = {i: np.arange(4, dtype=np.uint64) * np.uint64(i + 1) for i in agents}
    for _ in range(3):  # share keys, masked input, unmask
        for i, message in sorted(requests.items()):
            agent = agents[i]
            wanted = agent.input_request(message)
            if wanted is not None:
                agent, reply = agent.contribute(vectors[i], wanted)
                assert isinstance(reply, sm.MaskedInputResponse)
                assert not np.array_equal(reply.masked_input, vectors[i])  # masked
            else:
                agent, reply = agent.answer(message)
            agents[i] = agent
            server = server_sm.receive(server, i, reply)
        server, out = server_sm.close_stage(server)
        if isinstance(server, ServerReadyToUnmask):
            server, out = server_sm.begin_unmask(server)
        requests = {o.recipient: o.message for o in out}
    assert isinstance(server, ServerCompleted)
    np.testing.assert_array_equal(server.aggregate, sum(vectors.values()))


def test_a_masked_round_refuses_a_plain_setup_and_stages_out_of_order() -> None:
    """After its setup, a masked round refuses a plain setup (the same session: a duplicate;
    another: stale), a masked-input request before the keys are shared, and aborts on a
    share-keys request whose content breaks the protocol."""
    _, agents, requests = secure_round()
    agent = agents[0]
    share_keys = requests[0]
    assert isinstance(share_keys, sm.ShareKeysRequest)
    header = share_keys.header
    plain_setup = sm.AdvertiseKeysRequest(
        header=dataclasses.replace(header, stage=sm.Stage.ADVERTISE_KEYS),
        setup=request().setup,
    )
    assert agent.input_request(plain_setup) is None
    with pytest.raises(DuplicateMessage):
        agent.answer(plain_setup)
    with pytest.raises(StaleMessage, match="session"):
        agent.answer(request())
    early = sm.MaskedInputRequest(
        header=dataclasses.replace(header, stage=sm.Stage.MASKED_INPUT), shares=()
    )
    assert agent.input_request(early) is None
    with pytest.raises(WrongStage):
        agent.answer(early)
    forged = dataclasses.replace(share_keys, peers=share_keys.peers[:1])
    with pytest.raises(ProtocolAborted, match="secure aggregation aborted"):
        agent.answer(forged)
    assert agent.stage is sm.Stage.SHARE_KEYS
    next_agent, reply = agent.answer(share_keys)
    assert isinstance(reply, sm.ShareKeysResponse)
    assert next_agent.stage is sm.Stage.MASKED_INPUT
