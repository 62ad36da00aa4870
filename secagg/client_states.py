"""The client's states: one frozen value per protocol stage (see :mod:`dpfl.secagg.client`).

Each state holds only what the next stages need: private keys until the masked input is sent, the
self-mask seed b_i until then too, and afterwards only the shares this client holds for its
neighbours. ``stage`` (a class attribute) is the stage of the next request the state accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from . import shamir
from .config import RoundParameters
from .errors import ErrorCode
from .identity import ClientIdentity, PeerIdentity
from .messages import PeerKeys, RoundHeader, Stage
from .primitives import NONCE_BYTES, KeyPair
from .randomness import RandomSource

SESSION_ID_BYTES = 32
#: i (4 bytes) ‖ j (4 bytes) ‖ b-share (66) ‖ s-share (66)
SHARE_PLAINTEXT_BYTES = 8 + 2 * shamir.SHARE_BYTES
SHARE_CIPHERTEXT_BYTES = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + 16

RingVector = npt.NDArray[np.uint64]
#: an integer vector whose ring is not known yet (reduced when the setup arrives)
IntegerVector = npt.NDArray[np.integer]


@dataclass(frozen=True, slots=True)
class ClientContext:
    """What a client knows once it has accepted the setup."""

    job_id: str
    round: int
    session_id: bytes
    index: int
    params: RoundParameters
    rng: RandomSource = field(repr=False, compare=False)
    #: set in a malicious-secure round only (docs/secagg.md#the-malicious-secure-variant)
    identity: ClientIdentity | None = field(default=None, repr=False, compare=False)
    #: the setup digest this agent signs over (malicious-secure rounds; empty otherwise)
    setup_digest: bytes = field(default=b"", repr=False)

    @property
    def malicious(self) -> bool:
        """True in a malicious-secure round (the agent accepted it with its identity)."""
        return self.identity is not None

    def header(self, stage: Stage) -> RoundHeader:
        return RoundHeader(self.job_id, self.round, stage, self.session_id)

    def label(self, purpose: str) -> str:
        return f"client/{self.job_id}/{self.round}/{self.session_id.hex()}/{self.index}/{purpose}"


@dataclass(frozen=True, slots=True)
class ClientAwaitingSetup:
    """Waiting for ``AdvertiseKeysRequest`` (the round's setup)."""

    stage: ClassVar[Stage] = Stage.ADVERTISE_KEYS
    job_id: str
    round: int
    rng: RandomSource = field(repr=False, compare=False)
    input: IntegerVector | None = field(default=None, repr=False, compare=False)
    identity: ClientIdentity | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ClientKeysAdvertised:
    """Keys sent; waiting for the neighbour list (``ShareKeysRequest``)."""

    stage: ClassVar[Stage] = Stage.SHARE_KEYS
    ctx: ClientContext
    encryption_key: KeyPair = field(repr=False)
    masking_key: KeyPair = field(repr=False)
    input: RingVector | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ClientSharesSent:
    """Shares sent; waiting for the neighbours' shares (``MaskedInputRequest``)."""

    stage: ClassVar[Stage] = Stage.MASKED_INPUT
    ctx: ClientContext
    #: K_ji for each listed neighbour j: the key of the share j sends to this client. The
    #: encryption private key itself is dropped once the shares are sent.
    receive_keys: Mapping[int, bytes] = field(repr=False)
    masking_key: KeyPair = field(repr=False)
    peers: Mapping[int, PeerKeys] = field(repr=False)
    self_seed: bytes = field(repr=False)
    own_shares: tuple[int, int] = field(repr=False)
    input: RingVector | None = field(default=None, repr=False, compare=False)
    #: malicious-secure rounds: the verified peer of each listed neighbour, and the roster's
    #: indices (A1)
    identities: Mapping[int, PeerIdentity] = field(default_factory=dict, repr=False)
    roster: frozenset[int] = field(default=frozenset(), repr=False)


@dataclass(frozen=True, slots=True)
class ClientMaskedInputSent:
    """y sent, private keys dropped; waiting for ``UnmaskRequest``."""

    stage: ClassVar[Stage] = Stage.UNMASK
    ctx: ClientContext
    listed: frozenset[int]
    senders: frozenset[int]  # L_j
    shares: Mapping[int, tuple[int, int]] = field(repr=False)  # owner -> (b-share, s-share)


@dataclass(frozen=True, slots=True)
class ClientAwaitingConsistency:
    """Malicious-secure round: y sent, private keys dropped; waiting for ``ConsistencyRequest``."""

    stage: ClassVar[Stage] = Stage.CONSISTENCY
    ctx: ClientContext
    listed: frozenset[int]
    senders: frozenset[int]  # L_j
    shares: Mapping[int, tuple[int, int]] = field(repr=False)
    identities: Mapping[int, PeerIdentity] = field(repr=False)
    roster: frozenset[int] = field(repr=False)


@dataclass(frozen=True, slots=True)
class ClientConsistencySigned:
    """Malicious-secure round: the survivor set S signed (once); waiting for ``UnmaskRequest``."""

    stage: ClassVar[Stage] = Stage.UNMASK
    ctx: ClientContext
    listed: frozenset[int]
    senders: frozenset[int]
    shares: Mapping[int, tuple[int, int]] = field(repr=False)
    identities: Mapping[int, PeerIdentity] = field(repr=False)
    survivors: tuple[int, ...] = field(repr=False)  # S, in index order
    survivors_digest: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class ClientFinished:
    """Unmask shares sent: the client's part of the round is over."""

    stage: ClassVar[Stage] = Stage.RESULT
    ctx: ClientContext


@dataclass(frozen=True, slots=True)
class ClientAborted:
    """The client left the round because a request broke the protocol."""

    job_id: str
    round: int
    at_stage: Stage
    reason: str
    code: ErrorCode = ErrorCode.PROTOCOL_ABORT
    stage: ClassVar[Stage] = Stage.RESULT


ClientState = (
    ClientAwaitingSetup
    | ClientKeysAdvertised
    | ClientSharesSent
    | ClientMaskedInputSent
    | ClientAwaitingConsistency
    | ClientConsistencySigned
    | ClientFinished
    | ClientAborted
)
