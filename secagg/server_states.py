"""The server's states: one frozen value per protocol stage (see :mod:`dpfl.secagg.server`).

``stage`` is the stage whose responses the state collects (``RESULT`` for the two final states).
Every state exposes ``survivors`` (A1 ⊇ A2 ⊇ A3 and the stage-4 responders known so far) and, while
collecting, ``pending`` (the clients whose answer has not arrived yet), so a driver can close a
stage as soon as everyone answered or at its deadline, whichever comes first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from .config import RoundParameters
from .errors import WrongStage
from .graph import NeighbourGraph
from .messages import EncryptedShare, RoundHeader, ShareKind, Stage
from .parameters import ThreatModel

#: (encryption public key, masking public key) of a client, as advertised.
PublicKeys = tuple[bytes, bytes]
#: malicious-secure rounds: (signature, certificate DER, certificate key id) of an advertisement
Advert = tuple[bytes, bytes, bytes]
Words = npt.NDArray[np.uint32] | npt.NDArray[np.uint64]


@dataclass(frozen=True, slots=True)
class ServerContext:
    """Fixed for the whole round at setup, except the graph of a malicious-secure round, which the
    roster fixes when the advertisements close (docs/secagg.md#the-malicious-secure-variant)."""

    job_id: str
    round: int
    session_id: bytes
    params: RoundParameters
    graph_or_none: NeighbourGraph | None = field(repr=False)
    threat_model: ThreatModel = ThreatModel.SEMI_HONEST

    @property
    def graph(self) -> NeighbourGraph:
        """The neighbour graph.

        Raises:
            WrongStage: a malicious-secure round whose advertisements are still being collected.
        """
        if self.graph_or_none is None:
            raise WrongStage("the graph of a malicious-secure round is fixed by the roster")
        return self.graph_or_none

    @property
    def malicious(self) -> bool:
        return self.threat_model is ThreatModel.MALICIOUS

    def header(self, stage: Stage) -> RoundHeader:
        return RoundHeader(self.job_id, self.round, stage, self.session_id)


@dataclass(frozen=True, slots=True)
class Survivors:
    """The responders of each stage: A1 (keys), A2 (shares), A3 (masked inputs), unmask."""

    a1: frozenset[int] = frozenset()
    a2: frozenset[int] = frozenset()
    a3: frozenset[int] = frozenset()
    unmask: frozenset[int] = frozenset()
    #: malicious-secure rounds: the agents of A3 whose consistency signature arrived
    attested: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ServerCollectingKeys:
    """Stage 1: collecting ``AdvertiseKeysResponse`` from the n invited clients."""

    stage: ClassVar[Stage] = Stage.ADVERTISE_KEYS
    ctx: ServerContext
    keys: Mapping[int, PublicKeys] = field(default_factory=dict, repr=False)
    keys_seen: frozenset[bytes] = field(default=frozenset(), repr=False)
    adverts: Mapping[int, Advert] = field(default_factory=dict, repr=False)

    @property
    def survivors(self) -> Survivors:
        return Survivors(a1=frozenset(self.keys))

    @property
    def pending(self) -> frozenset[int]:
        return frozenset(range(self.ctx.params.num_clients)) - frozenset(self.keys)


@dataclass(frozen=True, slots=True)
class ServerCollectingShares:
    """Stage 2: collecting ``ShareKeysResponse`` from A1."""

    stage: ClassVar[Stage] = Stage.SHARE_KEYS
    ctx: ServerContext
    keys: Mapping[int, PublicKeys] = field(repr=False)
    shares: Mapping[int, Mapping[int, EncryptedShare]] = field(default_factory=dict, repr=False)

    @property
    def a1(self) -> frozenset[int]:
        return frozenset(self.keys)

    @property
    def survivors(self) -> Survivors:
        return Survivors(a1=self.a1, a2=frozenset(self.shares))

    @property
    def pending(self) -> frozenset[int]:
        return self.a1 - frozenset(self.shares)


@dataclass(frozen=True, slots=True)
class ServerCollectingMaskedInputs:
    """Stage 3: summing ``MaskedInputResponse`` vectors from A2 as they arrive."""

    stage: ClassVar[Stage] = Stage.MASKED_INPUT
    ctx: ServerContext
    keys: Mapping[int, PublicKeys] = field(repr=False)
    a2: frozenset[int]
    total: Words = field(repr=False, compare=False)
    a3: frozenset[int] = frozenset()

    @property
    def survivors(self) -> Survivors:
        return Survivors(a1=frozenset(self.keys), a2=self.a2, a3=self.a3)

    @property
    def pending(self) -> frozenset[int]:
        return self.a2 - self.a3


@dataclass(frozen=True, slots=True)
class ServerCollectingConsistency:
    """Malicious-secure rounds: collecting the signatures of S = A3 (``ConsistencyResponse``)."""

    stage: ClassVar[Stage] = Stage.CONSISTENCY
    ctx: ServerContext
    keys: Mapping[int, PublicKeys] = field(repr=False)
    a2: frozenset[int]
    a3: frozenset[int]
    total: Words = field(repr=False, compare=False)
    attestations: Mapping[int, bytes] = field(default_factory=dict, repr=False)

    @property
    def survivors(self) -> Survivors:
        return Survivors(
            a1=frozenset(self.keys), a2=self.a2, a3=self.a3, attested=frozenset(self.attestations)
        )

    @property
    def pending(self) -> frozenset[int]:
        return self.a3 - frozenset(self.attestations)


@dataclass(frozen=True, slots=True)
class ServerReadyToUnmask:
    """Masked inputs closed (and, in a malicious-secure round, S attested), no unmask request
    sent yet.

    **Ledger hook** (docs/architecture.md#rule-1-never-under-count): the aggregate becomes
    computable as soon as the unmask requests go out, so the coordinator commits the round's privacy
    events while holding this state, and only then calls :func:`dpfl.secagg.server.begin_unmask`.
    """

    stage: ClassVar[Stage] = Stage.UNMASK
    ctx: ServerContext
    keys: Mapping[int, PublicKeys] = field(repr=False)
    a2: frozenset[int]
    a3: frozenset[int]
    total: Words = field(repr=False, compare=False)
    #: malicious-secure rounds: the consistency signature of each attesting agent of A3
    attestations: Mapping[int, bytes] = field(default_factory=dict, repr=False)

    @property
    def survivors(self) -> Survivors:
        return Survivors(
            a1=frozenset(self.keys), a2=self.a2, a3=self.a3, attested=frozenset(self.attestations)
        )

    @property
    def pending(self) -> frozenset[int]:
        return frozenset()


#: One decoded unmask share: (owner, kind, y).
DecodedShare = tuple[int, ShareKind, int]


@dataclass(frozen=True, slots=True)
class ServerCollectingUnmask:
    """Stage 4: collecting ``UnmaskResponse`` from A3."""

    stage: ClassVar[Stage] = Stage.UNMASK
    ctx: ServerContext
    keys: Mapping[int, PublicKeys] = field(repr=False)
    a2: frozenset[int]
    a3: frozenset[int]
    total: Words = field(repr=False, compare=False)
    requests: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] = field(repr=False)
    #: the secrets to rebuild: (SELF_MASK_SEED, i) for i in A3, (MASKING_KEY, d) for dropped d
    needed: frozenset[tuple[ShareKind, int]] = field(default=frozenset(), repr=False)
    responses: Mapping[int, tuple[DecodedShare, ...]] = field(default_factory=dict, repr=False)
    #: shares received per secret: (kind, owner) -> count
    counts: Mapping[tuple[ShareKind, int], int] = field(default_factory=dict, repr=False)
    attested: frozenset[int] = frozenset()

    @property
    def survivors(self) -> Survivors:
        return Survivors(
            a1=frozenset(self.keys),
            a2=self.a2,
            a3=self.a3,
            unmask=frozenset(self.responses),
            attested=self.attested,
        )

    @property
    def pending(self) -> frozenset[int]:
        """The agents asked (A3, or its attesting part in a malicious-secure round) that have not
        answered yet."""
        return frozenset(self.requests) - frozenset(self.responses)

    @property
    def ready(self) -> bool:
        """Every needed secret has ≥ t shares: closing now would succeed (barring bad shares)."""
        t = self.ctx.params.threshold
        return all(self.counts.get(key, 0) >= t for key in self.needed)


@dataclass(frozen=True, slots=True)
class ServerCompleted:
    """The round succeeded: ``aggregate`` = Σ_{i∈A3} x_i mod 2^r (uint64)."""

    stage: ClassVar[Stage] = Stage.RESULT
    ctx: ServerContext
    survivors: Survivors
    aggregate: npt.NDArray[np.uint64] = field(repr=False, compare=False)

    @property
    def pending(self) -> frozenset[int]:
        return frozenset()


@dataclass(frozen=True, slots=True)
class ServerAborted:
    """The round aborted at ``at_stage`` (all or nothing: no aggregate)."""

    stage: ClassVar[Stage] = Stage.RESULT
    ctx: ServerContext
    at_stage: Stage
    reason: str
    survivors: Survivors

    @property
    def pending(self) -> frozenset[int]:
        return frozenset()


ServerState = (
    ServerCollectingKeys
    | ServerCollectingShares
    | ServerCollectingMaskedInputs
    | ServerCollectingConsistency
    | ServerReadyToUnmask
    | ServerCollectingUnmask
    | ServerCompleted
    | ServerAborted
)
