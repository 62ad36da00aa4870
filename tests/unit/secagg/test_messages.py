"""The secagg message dataclasses mirror dpfl.v1 field for field (so the gRPC layer is mechanical).

This test may import the generated protos; dpfl.secagg itself never does (test_layering.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpfl.protos import codec
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import messages as m
from dpfl.secagg.errors import ErrorCode

MIRRORED = [
    m.RoundHeader,
    m.SecAggSetup,
    m.AdvertiseKeysRequest,
    m.AdvertiseKeysResponse,
    m.PeerKeys,
    m.RosterEntry,
    m.ShareKeysRequest,
    m.EncryptedShare,
    m.ShareKeysResponse,
    m.MaskedInputRequest,
    m.MaskedInputResponse,
    m.ConsistencyRequest,
    m.ConsistencyResponse,
    m.Attestation,
    m.UnmaskRequest,
    m.UnmaskShare,
    m.UnmaskResponse,
]


@pytest.mark.parametrize("cls", MIRRORED, ids=lambda c: c.__name__)
def test_fields_mirror_the_proto(cls: type) -> None:
    proto = getattr(pb, cls.__name__)
    assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in proto.DESCRIPTOR.fields]


@pytest.mark.parametrize(
    ("enum", "proto", "prefix"),
    [
        (m.Stage, pb.Stage, "STAGE_"),
        (m.ShareKind, pb.ShareKind, "SHARE_"),
    ],
)
def test_enums_mirror_the_proto(enum: type, proto: object, prefix: str) -> None:
    ours = {prefix + member.name: int(member) for member in enum}  # type: ignore[attr-defined]
    assert ours == dict(proto.items())  # type: ignore[attr-defined]


def test_error_codes_are_a_subset_of_the_protos() -> None:
    wire = dict(pb.ErrorCode.items())
    assert all(wire["ERROR_" + code.name] == int(code) for code in ErrorCode)
    assert "ERROR_BUDGET_EXCEEDED" not in {"ERROR_" + code.name for code in ErrorCode}


def _to_proto(message: object) -> object:
    """The mechanical conversion the gRPC layer does (here only to prove it is mechanical)."""
    proto_cls = getattr(pb, type(message).__name__)
    kwargs = {}
    for f in dataclasses.fields(message):  # type: ignore[arg-type]
        value = getattr(message, f.name)
        if isinstance(value, np.ndarray):
            value = pb.PackedVector(
                bit_width=16, length=value.size, total_length=value.size, data=codec.pack(value, 16)
            )
        elif isinstance(value, tuple):
            value = (
                [_to_proto(v) for v in value]
                if value and dataclasses.is_dataclass(value[0])
                else list(value)
            )
        elif dataclasses.is_dataclass(value):
            value = _to_proto(value)
        kwargs[f.name] = value
    return proto_cls(**kwargs)


def test_mechanical_conversion_round_trips_the_bytes() -> None:
    header = m.RoundHeader("job", 3, m.Stage.UNMASK, b"s" * 32)
    response = m.UnmaskResponse(header, (m.UnmaskShare(4, m.ShareKind.MASKING_KEY, b"\x01" * 66),))
    proto = _to_proto(response)
    assert proto.header.stage == pb.STAGE_UNMASK  # type: ignore[attr-defined]
    assert proto.shares[0].kind == pb.SHARE_MASKING_KEY  # type: ignore[attr-defined]
    masked = m.MaskedInputResponse(
        m.RoundHeader("job", 3, m.Stage.MASKED_INPUT, b"s" * 32), np.arange(5, dtype=np.uint64)
    )
    packed = _to_proto(masked).masked_input  # type: ignore[attr-defined]
    assert np.array_equal(codec.unpack(packed.data, 16, packed.length), masked.masked_input)


def test_masked_input_equality_compares_the_vector() -> None:
    header = m.RoundHeader("j", 0, m.Stage.MASKED_INPUT, b"")
    a = m.MaskedInputResponse(header, np.arange(3, dtype=np.uint64))
    assert a == m.MaskedInputResponse(header, np.arange(3, dtype=np.uint64))
    assert a != m.MaskedInputResponse(header, np.arange(1, 4, dtype=np.uint64))
