"""A whole secure-aggregation round through serialized protobuf bytes equals the plain sum, and
malformed wire content is refused before it reaches a state machine."""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any

import numpy as np
import pytest
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from support.peer_pki import NOW, TestCA

from dpfl.protos import pb, secagg_wire
from dpfl.secagg import client as client_sm
from dpfl.secagg import messages as sm
from dpfl.secagg import server as server_sm
from dpfl.secagg.config import RoundParameters
from dpfl.secagg.errors import ErrorCode
from dpfl.secagg.identity import ClientIdentity
from dpfl.secagg.parameters import ThreatModel
from dpfl.secagg.randomness import SystemRandomSource
from dpfl.secagg.server_states import ServerCompleted, ServerReadyToUnmask

RING_BITS = 37


def _wire_round(
    vectors: list[np.ndarray],
    *,
    drop_after_masking: int | None,
    identities: list[ClientIdentity] | None = None,
) -> np.ndarray:
    n, m = len(vectors), len(vectors[0])
    threat = ThreatModel.SEMI_HONEST if identities is None else ThreatModel.MALICIOUS
    params = RoundParameters(
        num_clients=n,
        degree=n - 1,
        threshold=3,
        ring_bits=RING_BITS,
        vector_length=m,
        min_survivors=n - 1,
    )
    rng = SystemRandomSource()
    server, outbound = server_sm.start_round(
        job_id="job-1", round=4, params=params, rng=rng, threat_model=threat
    )
    clients = {
        i: client_sm.new_client(
            job_id="job-1",
            round=4,
            input=vectors[i],
            identity=None if identities is None else identities[i],
        )
        for i in range(n)
    }
    for _stage in range(4 if identities is None else 5):
        for item in outbound:
            if item.recipient == drop_after_masking and isinstance(item.message, sm.UnmaskRequest):
                continue  # this client sent its masked input, then died
            raw = secagg_wire.to_coordinator_message(item.message).SerializeToString()
            request = secagg_wire.from_coordinator_message(pb.CoordinatorMessage.FromString(raw))
            assert request == item.message
            clients[item.recipient], reply = client_sm.step(clients[item.recipient], request)
            assert reply is not None
            pieces = list(secagg_wire.to_agent_messages(reply, ring_bits=RING_BITS, max_bytes=64))
            decoded = [pb.AgentMessage.FromString(p.SerializeToString()) for p in pieces]
            if isinstance(reply, sm.MaskedInputResponse):
                assert len(decoded) > 1  # the vector travelled in several pieces
                assembler = secagg_wire.MaskedInputAssembler(vector_length=m, ring_bits=RING_BITS)
                results = [assembler.add(d.masked_input) for d in decoded]
                assert all(r is None for r in results[:-1])
                received = results[-1]
            else:
                (single,) = decoded
                received = secagg_wire.from_agent_message(single)
            assert received == reply
            server = server_sm.receive(server, item.recipient, received)
        server, outbound = server_sm.close_stage(server)
        if isinstance(server, ServerReadyToUnmask):
            server, outbound = server_sm.begin_unmask(server)
    assert isinstance(server, ServerCompleted)
    return np.asarray(server.aggregate)


@pytest.mark.parametrize("malicious", [False, True], ids=["semi-honest", "malicious"])
@pytest.mark.parametrize("drop", [None, 2])
def test_round_through_protobuf_bytes_sums_exactly(drop: int | None, malicious: bool) -> None:
    rng = np.random.default_rng(7)
    vectors = [rng.integers(0, 2**20, size=50, dtype=np.uint64) for _ in range(5)]
    identities = None
    if malicious:  # signatures, certificates, roster, survivors and attestations on the wire
        ca = TestCA.make()
        identities = [
            ClientIdentity(ca.signer(f"silo-{i}"), ca.authority(), 0, NOW) for i in range(5)
        ]
    aggregate = _wire_round(vectors, drop_after_masking=drop, identities=identities)
    expected = np.sum(vectors, axis=0, dtype=np.uint64) % np.uint64(2**RING_BITS)
    np.testing.assert_array_equal(aggregate, expected)


def test_unknown_enum_values_and_missing_parts_are_refused() -> None:
    bad_stage = pb.AgentMessage(
        share_keys=pb.ShareKeysResponse(header=pb.RoundHeader(job_id="j", round=1, stage=99))
    )
    with pytest.raises(secagg_wire.WireError, match=r"header\.stage: unknown value 99"):
        secagg_wire.from_agent_message(bad_stage)
    bad_kind = pb.AgentMessage(
        unmask=pb.UnmaskResponse(
            header=pb.RoundHeader(job_id="j", round=1, stage=pb.STAGE_UNMASK),
            shares=[pb.UnmaskShare(owner=0, kind=7, share=b"x")],
        )
    )
    with pytest.raises(secagg_wire.WireError, match="kind: unknown value 7"):
        secagg_wire.from_agent_message(bad_kind)
    with pytest.raises(secagg_wire.WireError, match="header is missing"):
        secagg_wire.from_agent_message(pb.AgentMessage(share_keys=pb.ShareKeysResponse()))
    with pytest.raises(secagg_wire.WireError, match="setup is missing"):
        secagg_wire.from_coordinator_message(
            pb.CoordinatorMessage(
                advertise_keys=pb.AdvertiseKeysRequest(header=pb.RoundHeader(job_id="j"))
            )
        )
    with pytest.raises(secagg_wire.WireError, match="not a secure-aggregation"):
        secagg_wire.from_agent_message(pb.AgentMessage(hello=pb.Hello(agent_id="a")))


def test_an_older_coordinators_setup_is_semi_honest() -> None:
    """A setup without the threat_model field (proto3: empty) is a semi-honest round."""
    request = pb.CoordinatorMessage(
        advertise_keys=pb.AdvertiseKeysRequest(
            header=pb.RoundHeader(job_id="j", round=1, stage=pb.STAGE_ADVERTISE_KEYS),
            setup=pb.SecAggSetup(num_clients=3, degree=2, threshold=2),
        )
    )
    parsed = secagg_wire.from_coordinator_message(request)
    assert isinstance(parsed, sm.AdvertiseKeysRequest)
    assert parsed.setup.threat_model == "semi-honest"


def test_assembler_refuses_mixed_headers_and_bad_pieces() -> None:
    header = pb.RoundHeader(job_id="j", round=1, stage=pb.STAGE_MASKED_INPUT)
    other = pb.RoundHeader(job_id="j", round=2, stage=pb.STAGE_MASKED_INPUT)
    asm = secagg_wire.MaskedInputAssembler(vector_length=16, ring_bits=8)
    piece = pb.PackedVector(bit_width=8, length=8, data=bytes(8), offset=0, total_length=16)
    assert asm.add(pb.MaskedInputResponse(header=header, masked_input=piece)) is None
    second = pb.PackedVector(bit_width=8, length=8, data=bytes(8), offset=8, total_length=16)
    with pytest.raises(secagg_wire.WireError, match="different headers"):
        asm.add(pb.MaskedInputResponse(header=other, masked_input=second))
    with pytest.raises(secagg_wire.WireError, match="overlaps"):
        asm.add(pb.MaskedInputResponse(header=header, masked_input=piece))
    with pytest.raises(secagg_wire.WireError, match="masked_input is missing"):
        asm.add(pb.MaskedInputResponse(header=header))
    done = asm.add(pb.MaskedInputResponse(header=header, masked_input=second))
    assert done is not None
    assert done.masked_input.shape == (16,)


@pytest.mark.parametrize(
    ("secagg_enum", "proto_enum", "prefix", "convert"),
    [
        (sm.Stage, pb.Stage, "STAGE_", secagg_wire.stage_to_pb),
        (sm.ShareKind, pb.ShareKind, "SHARE_", secagg_wire.share_kind_to_pb),
    ],
)
def test_enum_conversion_covers_both_enums_name_for_name(
    secagg_enum: type[IntEnum],
    proto_enum: EnumTypeWrapper,
    prefix: str,
    convert: Callable[[Any], int],
) -> None:
    converted = {member: convert(member) for member in secagg_enum}
    for member, value in converted.items():
        assert proto_enum.Name(value) == prefix + member.name
        assert value == int(member), "the numbers on the wire are the secagg numbers"
    assert sorted(converted.values()) == sorted(proto_enum.values()), "a proto value is unmapped"


def test_the_protocols_error_codes_are_wire_codes_name_for_name() -> None:
    """secagg's codes are a subset of the wire's (the service's own codes are not secagg's)."""
    for member in ErrorCode:
        value = secagg_wire.error_code_to_pb(member)
        assert pb.ErrorCode.Name(value) == "ERROR_" + member.name
        assert value == int(member)
    assert {m.name for m in ErrorCode} == {
        "INVALID_ARGUMENT",
        "STALE_ROUND",
        "WRONG_STAGE",
        "PROTOCOL_ABORT",
        "INTERNAL",
        "DUPLICATE",
    }
