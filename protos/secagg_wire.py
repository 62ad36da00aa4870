"""Conversion between the ``dpfl.secagg`` message dataclasses and the ``dpfl.v1`` protobufs.

The secagg messages mirror the proto field for field (see ``dpfl.secagg.messages``), so this is
mechanical, except for two things that belong to the wire:

- a masked input is a ``uint64`` ring vector in secagg and one or more ``PackedVector`` pieces on
  the wire (bit-packed at the round's ring width, split above ``max_bytes``); the receiver
  reassembles the pieces of each sender with :class:`MaskedInputAssembler`;
- proto3 enums are open, so a peer can send a stage or share kind number that does not exist:
  that, and any other malformed content, raises :class:`WireError` naming the field, before the
  message reaches a state machine.

Content rules (key lengths, share counts, who may send what) are the state machines' business.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from dpfl.protos import codec
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import messages as sm
from dpfl.secagg.errors import ErrorCode

#: Default payload size of one masked-input piece (well under gRPC's 4 MiB default limit).
DEFAULT_PIECE_BYTES = 1 << 20


class WireError(ValueError):
    """A protobuf message cannot be turned into a secagg message; the text names the field."""


# -- shared values -------------------------------------------------------------------------------

# The secagg enums mirror the proto enums name for name (without the proto prefix); the tables
# spell the correspondence out so that each side keeps its own enum type.
_STAGES: Final[Mapping[sm.Stage, pb.Stage]] = {
    sm.Stage.UNSPECIFIED: pb.STAGE_UNSPECIFIED,
    sm.Stage.INVITATION: pb.STAGE_INVITATION,
    sm.Stage.ADVERTISE_KEYS: pb.STAGE_ADVERTISE_KEYS,
    sm.Stage.SHARE_KEYS: pb.STAGE_SHARE_KEYS,
    sm.Stage.MASKED_INPUT: pb.STAGE_MASKED_INPUT,
    sm.Stage.UNMASK: pb.STAGE_UNMASK,
    sm.Stage.RESULT: pb.STAGE_RESULT,
    sm.Stage.CONSISTENCY: pb.STAGE_CONSISTENCY,
}
_SHARE_KINDS: Final[Mapping[sm.ShareKind, pb.ShareKind]] = {
    sm.ShareKind.UNSPECIFIED: pb.SHARE_UNSPECIFIED,
    sm.ShareKind.SELF_MASK_SEED: pb.SHARE_SELF_MASK_SEED,
    sm.ShareKind.MASKING_KEY: pb.SHARE_MASKING_KEY,
}
_ERROR_CODES: Final[Mapping[ErrorCode, pb.ErrorCode]] = {
    ErrorCode.INVALID_ARGUMENT: pb.ERROR_INVALID_ARGUMENT,
    ErrorCode.STALE_ROUND: pb.ERROR_STALE_ROUND,
    ErrorCode.WRONG_STAGE: pb.ERROR_WRONG_STAGE,
    ErrorCode.PROTOCOL_ABORT: pb.ERROR_PROTOCOL_ABORT,
    ErrorCode.INTERNAL: pb.ERROR_INTERNAL,
    ErrorCode.DUPLICATE: pb.ERROR_DUPLICATE,
}


def stage_to_pb(stage: sm.Stage) -> pb.Stage:
    return _STAGES[stage]


def share_kind_to_pb(kind: sm.ShareKind) -> pb.ShareKind:
    return _SHARE_KINDS[kind]


def error_code_to_pb(code: ErrorCode) -> pb.ErrorCode:
    return _ERROR_CODES[code]


def header_to_pb(header: sm.RoundHeader) -> pb.RoundHeader:
    return pb.RoundHeader(
        job_id=header.job_id,
        round=header.round,
        stage=stage_to_pb(header.stage),
        session_id=header.session_id,
    )


def header_from_pb(header: pb.RoundHeader) -> sm.RoundHeader:
    return sm.RoundHeader(
        job_id=header.job_id,
        round=header.round,
        stage=_enum(sm.Stage, header.stage, "header.stage"),
        session_id=bytes(header.session_id),
    )


def setup_to_pb(setup: sm.SecAggSetup) -> pb.SecAggSetup:
    return pb.SecAggSetup(
        client_index=setup.client_index,
        num_clients=setup.num_clients,
        degree=setup.degree,
        threshold=setup.threshold,
        ring_bits=setup.ring_bits,
        vector_length=setup.vector_length,
        min_survivors=setup.min_survivors,
        encoding_json=setup.encoding_json,
        session_nonce=bytes(setup.session_nonce),
        threat_model=setup.threat_model,
    )


def setup_from_pb(setup: pb.SecAggSetup) -> sm.SecAggSetup:
    return sm.SecAggSetup(
        client_index=setup.client_index,
        num_clients=setup.num_clients,
        degree=setup.degree,
        threshold=setup.threshold,
        ring_bits=setup.ring_bits,
        vector_length=setup.vector_length,
        min_survivors=setup.min_survivors,
        encoding_json=setup.encoding_json,
        session_nonce=bytes(setup.session_nonce),
        # an older coordinator sends no threat model: its rounds are semi-honest
        threat_model=setup.threat_model or "semi-honest",
    )


def _shares_to_pb(shares: tuple[sm.EncryptedShare, ...]) -> list[pb.EncryptedShare]:
    return [
        pb.EncryptedShare(sender=s.sender, receiver=s.receiver, ciphertext=s.ciphertext)
        for s in shares
    ]


def _shares_from_pb(shares: Iterable[pb.EncryptedShare]) -> tuple[sm.EncryptedShare, ...]:
    return tuple(
        sm.EncryptedShare(sender=s.sender, receiver=s.receiver, ciphertext=bytes(s.ciphertext))
        for s in shares
    )


# -- coordinator -> agent ------------------------------------------------------------------------


def to_coordinator_message(message: sm.ServerMessage) -> pb.CoordinatorMessage:
    """Wrap a secagg server request in the coordinator's ``oneof``."""
    header = header_to_pb(message.header)
    if isinstance(message, sm.AdvertiseKeysRequest):
        return pb.CoordinatorMessage(
            advertise_keys=pb.AdvertiseKeysRequest(header=header, setup=setup_to_pb(message.setup))
        )
    if isinstance(message, sm.ShareKeysRequest):
        peers = [
            pb.PeerKeys(
                index=p.index,
                encryption_public_key=p.encryption_public_key,
                masking_public_key=p.masking_public_key,
                signature=p.signature,
                certificate=p.certificate,
            )
            for p in message.peers
        ]
        roster = [pb.RosterEntry(index=e.index, digest=e.digest) for e in message.roster]
        return pb.CoordinatorMessage(
            share_keys=pb.ShareKeysRequest(header=header, peers=peers, roster=roster)
        )
    if isinstance(message, sm.MaskedInputRequest):
        return pb.CoordinatorMessage(
            masked_input=pb.MaskedInputRequest(header=header, shares=_shares_to_pb(message.shares))
        )
    if isinstance(message, sm.ConsistencyRequest):
        return pb.CoordinatorMessage(
            consistency=pb.ConsistencyRequest(header=header, survivors=list(message.survivors))
        )
    if isinstance(message, sm.UnmaskRequest):
        return pb.CoordinatorMessage(
            unmask=pb.UnmaskRequest(
                header=header,
                alive=list(message.alive),
                dropped=list(message.dropped),
                survivors=list(message.survivors),
                attestations=[
                    pb.Attestation(index=a.index, signature=a.signature)
                    for a in message.attestations
                ],
            )
        )
    raise TypeError(f"not a secagg server message: {type(message).__name__}")


def from_coordinator_message(message: pb.CoordinatorMessage) -> sm.ServerMessage:
    """The secagg request inside a ``CoordinatorMessage``.

    Raises:
        WireError: the message holds no secagg request, or a malformed one.
    """
    kind = message.WhichOneof("body")
    if kind == "advertise_keys":
        m = message.advertise_keys
        if not m.HasField("setup"):
            raise WireError("advertise_keys.setup is missing")
        return sm.AdvertiseKeysRequest(header=_header(m), setup=setup_from_pb(m.setup))
    if kind == "share_keys":
        m2 = message.share_keys
        peers = tuple(
            sm.PeerKeys(
                index=p.index,
                encryption_public_key=bytes(p.encryption_public_key),
                masking_public_key=bytes(p.masking_public_key),
                signature=bytes(p.signature),
                certificate=bytes(p.certificate),
            )
            for p in m2.peers
        )
        roster = tuple(sm.RosterEntry(index=e.index, digest=bytes(e.digest)) for e in m2.roster)
        return sm.ShareKeysRequest(header=_header(m2), peers=peers, roster=roster)
    if kind == "masked_input":
        m3 = message.masked_input
        return sm.MaskedInputRequest(header=_header(m3), shares=_shares_from_pb(m3.shares))
    if kind == "consistency":
        m5 = message.consistency
        return sm.ConsistencyRequest(header=_header(m5), survivors=tuple(m5.survivors))
    if kind == "unmask":
        m4 = message.unmask
        return sm.UnmaskRequest(
            header=_header(m4),
            alive=tuple(m4.alive),
            dropped=tuple(m4.dropped),
            survivors=tuple(m4.survivors),
            attestations=tuple(
                sm.Attestation(index=a.index, signature=bytes(a.signature)) for a in m4.attestations
            ),
        )
    raise WireError(f"coordinator message {kind!r} is not a secure-aggregation request")


# -- agent -> coordinator ------------------------------------------------------------------------


def to_agent_messages(
    message: sm.ClientMessage, *, ring_bits: int, max_bytes: int = DEFAULT_PIECE_BYTES
) -> Iterator[pb.AgentMessage]:
    """Wrap a secagg client response; a masked input becomes one message per vector piece."""
    header = header_to_pb(message.header)
    if isinstance(message, sm.AdvertiseKeysResponse):
        yield pb.AgentMessage(
            advertise_keys=pb.AdvertiseKeysResponse(
                header=header,
                encryption_public_key=message.encryption_public_key,
                masking_public_key=message.masking_public_key,
                signature=message.signature,
                certificate=message.certificate,
            )
        )
    elif isinstance(message, sm.ConsistencyResponse):
        yield pb.AgentMessage(
            consistency=pb.ConsistencyResponse(header=header, signature=message.signature)
        )
    elif isinstance(message, sm.ShareKeysResponse):
        yield pb.AgentMessage(
            share_keys=pb.ShareKeysResponse(header=header, shares=_shares_to_pb(message.shares))
        )
    elif isinstance(message, sm.MaskedInputResponse):
        for piece in codec.to_messages(message.masked_input, ring_bits, max_bytes=max_bytes):
            yield pb.AgentMessage(
                masked_input=pb.MaskedInputResponse(header=header, masked_input=piece)
            )
    elif isinstance(message, sm.UnmaskResponse):
        shares = [
            pb.UnmaskShare(owner=s.owner, kind=share_kind_to_pb(s.kind), share=s.share)
            for s in message.shares
        ]
        yield pb.AgentMessage(unmask=pb.UnmaskResponse(header=header, shares=shares))
    else:
        raise TypeError(f"not a secagg client message: {type(message).__name__}")


def from_agent_message(message: pb.AgentMessage) -> sm.ClientMessage:
    """The secagg response inside an ``AgentMessage`` (masked inputs: see the assembler).

    Raises:
        WireError: the message holds no secagg response, a masked-input piece, or bad enums.
    """
    kind = message.WhichOneof("body")
    if kind == "advertise_keys":
        m = message.advertise_keys
        return sm.AdvertiseKeysResponse(
            header=_header(m),
            encryption_public_key=bytes(m.encryption_public_key),
            masking_public_key=bytes(m.masking_public_key),
            signature=bytes(m.signature),
            certificate=bytes(m.certificate),
        )
    if kind == "consistency":
        m4 = message.consistency
        return sm.ConsistencyResponse(header=_header(m4), signature=bytes(m4.signature))
    if kind == "share_keys":
        m2 = message.share_keys
        return sm.ShareKeysResponse(header=_header(m2), shares=_shares_from_pb(m2.shares))
    if kind == "unmask":
        m3 = message.unmask
        shares = tuple(
            sm.UnmaskShare(
                owner=s.owner,
                kind=_enum(sm.ShareKind, s.kind, "unmask.shares.kind"),
                share=bytes(s.share),
            )
            for s in m3.shares
        )
        return sm.UnmaskResponse(header=_header(m3), shares=shares)
    if kind == "masked_input":
        raise WireError("masked-input pieces go through MaskedInputAssembler")
    raise WireError(f"agent message {kind!r} is not a secure-aggregation response")


class MaskedInputAssembler:
    """Collects the masked-input pieces of one sender into a ``MaskedInputResponse``.

    Args:
        vector_length: m of the round's setup.
        ring_bits: r of the round's setup (the pieces' bit width).
    """

    def __init__(self, *, vector_length: int, ring_bits: int) -> None:
        self._vector = codec.VectorAssembler(expected_length=vector_length, bit_width=ring_bits)
        self._header: sm.RoundHeader | None = None

    def add(self, message: pb.MaskedInputResponse) -> sm.MaskedInputResponse | None:
        """Add one piece; return the whole response once the last piece has arrived.

        Raises:
            WireError: the piece has no vector, a header that differs from the first piece's, or
                does not fit the vector (wrong width, length, overlap; see ``codec``).
        """
        if not message.HasField("masked_input"):
            raise WireError("masked_input.masked_input is missing")
        header = _header(message)
        if self._header is None:
            self._header = header
        elif header != self._header:
            raise WireError("masked-input pieces carry different headers")
        try:
            complete = self._vector.add(message.masked_input)
        except codec.CodecError as exc:
            raise WireError(f"masked_input: {exc}") from exc
        if not complete:
            return None
        vector: npt.NDArray[np.uint64] = self._vector.result()
        return sm.MaskedInputResponse(header=self._header, masked_input=vector)


class _RoundMessage(Protocol):
    """A protobuf message with a ``header`` field (every round-scoped message)."""

    @property
    def header(self) -> pb.RoundHeader: ...

    def HasField(self, field_name: str) -> bool: ...  # noqa: N802 (protobuf's name)


def _header(message: _RoundMessage) -> sm.RoundHeader:
    if not message.HasField("header"):
        raise WireError(f"{type(message).__name__}.header is missing")
    return header_from_pb(message.header)


_E = TypeVar("_E", bound=enum.IntEnum)


def _enum(cls: type[_E], value: int, field: str) -> _E:
    try:
        return cls(value)
    except ValueError:
        raise WireError(f"{field}: unknown value {value}") from None
