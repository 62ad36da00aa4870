"""The pure parts of a plain round on the agent (``dpfl.client.plain``): the mode check, the
setup's validation, the request checks and the unmasked answer."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest

from dpfl.client.plain import (
    ModeMismatchError,
    PlainParameters,
    PlainRound,
    check_mode,
    check_request,
    is_plain_setup,
    unmasked_input,
)
from dpfl.learning.algorithms.base import AlgorithmError, TaskParams, parse_contract
from dpfl.secagg import EncodingConfig
from dpfl.secagg import messages as sm
from dpfl.secagg.errors import (
    DuplicateMessage,
    EncodingOverflow,
    ParameterError,
    ProtocolViolation,
    StaleMessage,
    WrongStage,
)
from dpfl.secagg.noise import NoiseKind, NoiseSpec
from dpfl.secagg.primitives import compute_session_id

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


def acknowledged() -> PlainRound:
    params = PlainParameters.from_request(request(), job_id=JOB, round=ROUND)
    return PlainRound(job_id=JOB, round=ROUND, session_id=SESSION, params=params)


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
    if refused:
        with pytest.raises(ModeMismatchError, match="secure"):
            check_mode(task, plain=plain)
    else:
        check_mode(task, plain=plain)


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
    assert (params.degree, params.threshold) == (0, 0)
    assert params.encoding == ENCODING
    state = PlainRound(job_id=JOB, round=ROUND, session_id=SESSION, params=params)
    ack = state.acknowledgement()
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
    check_request(state, masked_input_request())
    with pytest.raises(StaleMessage):
        check_request(state, masked_input_request(header={"round": ROUND + 1}))
    with pytest.raises(StaleMessage):
        check_request(state, masked_input_request(header={"job_id": "other"}))
    with pytest.raises(StaleMessage, match="session"):
        check_request(state, masked_input_request(header={"session_id": b"\x01" * 32}))
    with pytest.raises(WrongStage):
        check_request(state, masked_input_request(header={"stage": sm.Stage.UNMASK}))
    with pytest.raises(DuplicateMessage, match="acknowledged"):
        check_request(state, request())
    share_keys = sm.ShareKeysRequest(
        header=sm.RoundHeader(JOB, ROUND, sm.Stage.SHARE_KEYS, SESSION), peers=()
    )
    unmask = sm.UnmaskRequest(
        header=sm.RoundHeader(JOB, ROUND, sm.Stage.UNMASK, SESSION), alive=(), dropped=()
    )
    for message in (share_keys, unmask):
        with pytest.raises(WrongStage, match="without secure aggregation"):
            check_request(state, message)
    share = sm.EncryptedShare(sender=0, receiver=1, ciphertext=b"x")
    with pytest.raises(ProtocolViolation, match="shares"):
        check_request(state, masked_input_request(shares=(share,)))


def test_the_answer_is_the_vector_itself_once() -> None:
    state = acknowledged()
    vector = np.arange(M, dtype=np.uint64) * 100
    sent, reply = unmasked_input(state, vector)
    assert sent.sent
    assert sent.stage is sm.Stage.MASKED_INPUT
    assert reply.header == sm.RoundHeader(JOB, ROUND, sm.Stage.MASKED_INPUT, SESSION)
    np.testing.assert_array_equal(reply.masked_input, vector)
    with pytest.raises(DuplicateMessage):
        unmasked_input(sent, vector)
    with pytest.raises(DuplicateMessage):
        check_request(sent, masked_input_request())
    with pytest.raises(ParameterError, match="expected 8 values"):
        unmasked_input(state, vector[:-1])
    too_big = vector.copy()
    too_big[0] = np.uint64(1) << np.uint64(ENCODING.ring_bits)
    with pytest.raises(ParameterError, match="bits"):
        unmasked_input(state, too_big)
    with pytest.raises(ParameterError, match="integers"):
        unmasked_input(state, vector.astype(np.float64))
