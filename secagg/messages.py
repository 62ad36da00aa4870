"""Protocol messages: one frozen dataclass per message of ``protos/dpfl/v1/agent.proto``.

Field names, order and meaning are those of the proto, so the gRPC layer converts mechanically:

- every field maps to the proto field of the same name;
- :class:`Stage`, :class:`ShareKind` (and :class:`~dpfl.secagg.errors.ErrorCode`) are ``IntEnum``
  mirrors of the proto enums: ``pb.Stage.Value("STAGE_" + stage.name) == int(stage)``, likewise
  ``"SHARE_" + kind.name``;
- ``repeated`` fields are tuples; ``bytes`` stay bytes;
- the one type difference: ``MaskedInputResponse.masked_input`` is a ``numpy.uint64`` array of ring
  elements here and a ``PackedVector`` on the wire, converted with ``dpfl.protos.codec.pack`` /
  ``unpack`` at ``bit_width = SecAggSetup.ring_bits`` (splitting into pieces is transport work).

The server's messages are addressed with :class:`Outbound` (recipient = the client's global index).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


class Stage(enum.IntEnum):
    """Mirror of ``dpfl.v1.Stage`` (names without the ``STAGE_`` prefix, same numbers).

    The numbers are wire numbers, not the order of the protocol: CONSISTENCY (7, added with the
    malicious-secure variant) runs between MASKED_INPUT and UNMASK. Compare stages with
    :func:`stage_rank`, never with ``<``.
    """

    UNSPECIFIED = 0
    INVITATION = 1
    ADVERTISE_KEYS = 2  # docs/secagg.md#stage-1-advertise-keys
    SHARE_KEYS = 3  # stage 2
    MASKED_INPUT = 4  # stage 3
    UNMASK = 5  # stage 4
    RESULT = 6
    CONSISTENCY = 7  # malicious-secure variant only, between stage 3 and stage 4


#: The stages in the order a round runs them (docs/secagg.md#the-malicious-secure-variant).
STAGE_ORDER: tuple[Stage, ...] = (
    Stage.UNSPECIFIED,
    Stage.INVITATION,
    Stage.ADVERTISE_KEYS,
    Stage.SHARE_KEYS,
    Stage.MASKED_INPUT,
    Stage.CONSISTENCY,
    Stage.UNMASK,
    Stage.RESULT,
)
_RANK = {stage: rank for rank, stage in enumerate(STAGE_ORDER)}


def stage_rank(stage: Stage) -> int:
    """The position of ``stage`` in :data:`STAGE_ORDER` (earlier stages rank lower)."""
    return _RANK[stage]


class ShareKind(enum.IntEnum):
    """Mirror of ``dpfl.v1.ShareKind`` (names without the ``SHARE_`` prefix)."""

    UNSPECIFIED = 0
    SELF_MASK_SEED = 1  # a share of b_i, for alive i
    MASKING_KEY = 2  # a share of s_i^SK, for dropped i


@dataclass(frozen=True, slots=True)
class RoundHeader:
    job_id: str
    round: int
    stage: Stage
    session_id: bytes = b""


@dataclass(frozen=True, slots=True)
class SecAggSetup:
    """A client's round parameters. ``encoding_json`` is the application's text about how the
    inputs are made (dpfl: ``dpfl.mechanisms.EncodingConfig.to_json``); the protocol carries it
    and never reads it."""

    client_index: int
    num_clients: int
    degree: int
    threshold: int
    ring_bits: int
    vector_length: int
    min_survivors: int
    encoding_json: str = ""
    session_nonce: bytes = b""
    #: a :class:`~dpfl.secagg.parameters.ThreatModel` value; ``"malicious"`` runs the
    #: malicious-secure variant (docs/secagg.md#the-malicious-secure-variant)
    threat_model: str = "semi-honest"


@dataclass(frozen=True, slots=True)
class AdvertiseKeysRequest:
    header: RoundHeader
    setup: SecAggSetup


@dataclass(frozen=True, slots=True)
class AdvertiseKeysResponse:
    """``signature`` and ``certificate`` (the peer certificate, DER) are set in a
    malicious-secure round only."""

    header: RoundHeader
    encryption_public_key: bytes
    masking_public_key: bytes
    signature: bytes = b""
    certificate: bytes = b""


@dataclass(frozen=True, slots=True)
class PeerKeys:
    index: int
    encryption_public_key: bytes
    masking_public_key: bytes
    signature: bytes = b""
    certificate: bytes = b""


@dataclass(frozen=True, slots=True)
class RosterEntry:
    """One advertisement of A1: its index and roster digest d_j (32 bytes)."""

    index: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class ShareKeysRequest:
    """``roster`` (every entry of A1, in index order) is sent in a malicious-secure round only."""

    header: RoundHeader
    peers: tuple[PeerKeys, ...]
    roster: tuple[RosterEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class EncryptedShare:
    sender: int
    receiver: int
    ciphertext: bytes


@dataclass(frozen=True, slots=True)
class ShareKeysResponse:
    header: RoundHeader
    shares: tuple[EncryptedShare, ...]


@dataclass(frozen=True, slots=True)
class MaskedInputRequest:
    header: RoundHeader
    shares: tuple[EncryptedShare, ...]


@dataclass(frozen=True, slots=True, eq=False)
class MaskedInputResponse:
    header: RoundHeader
    masked_input: npt.NDArray[np.uint64]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MaskedInputResponse):
            return NotImplemented
        return self.header == other.header and bool(
            np.array_equal(self.masked_input, other.masked_input)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class ConsistencyRequest:
    """The survivor set S = A3 every agent of S is asked to sign (malicious-secure only)."""

    header: RoundHeader
    survivors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConsistencyResponse:
    header: RoundHeader
    signature: bytes


@dataclass(frozen=True, slots=True)
class Attestation:
    """A neighbour's consistency signature, relayed as received."""

    index: int
    signature: bytes


@dataclass(frozen=True, slots=True)
class UnmaskRequest:
    """``survivors`` and ``attestations`` are set in a malicious-secure round only."""

    header: RoundHeader
    alive: tuple[int, ...]
    dropped: tuple[int, ...]
    survivors: tuple[int, ...] = ()
    attestations: tuple[Attestation, ...] = ()


@dataclass(frozen=True, slots=True)
class UnmaskShare:
    owner: int
    kind: ShareKind
    share: bytes


@dataclass(frozen=True, slots=True)
class UnmaskResponse:
    header: RoundHeader
    shares: tuple[UnmaskShare, ...]


ServerMessage = (
    AdvertiseKeysRequest
    | ShareKeysRequest
    | MaskedInputRequest
    | ConsistencyRequest
    | UnmaskRequest
)
ClientMessage = (
    AdvertiseKeysResponse
    | ShareKeysResponse
    | MaskedInputResponse
    | ConsistencyResponse
    | UnmaskResponse
)

#: The stage each message type belongs to.
MESSAGE_STAGE: dict[type, Stage] = {
    AdvertiseKeysRequest: Stage.ADVERTISE_KEYS,
    AdvertiseKeysResponse: Stage.ADVERTISE_KEYS,
    ShareKeysRequest: Stage.SHARE_KEYS,
    ShareKeysResponse: Stage.SHARE_KEYS,
    MaskedInputRequest: Stage.MASKED_INPUT,
    MaskedInputResponse: Stage.MASKED_INPUT,
    ConsistencyRequest: Stage.CONSISTENCY,
    ConsistencyResponse: Stage.CONSISTENCY,
    UnmaskRequest: Stage.UNMASK,
    UnmaskResponse: Stage.UNMASK,
}


@dataclass(frozen=True, slots=True)
class Outbound:
    """A server message and the global index of the client it goes to."""

    recipient: int
    message: ServerMessage
