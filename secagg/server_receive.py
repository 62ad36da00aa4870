"""Adding client responses to a server state, one at a time or in batches.

States are immutable, so adding a response builds a new state. Copying the collected responses
for every message would cost O(n) per message and O(n²) per stage; :func:`receive_many` copies
them once per batch instead (a driver passes whatever arrived since its last call), and
:func:`receive` is the batch of one. Every response is validated against the state *and* the
responses accepted earlier in the same batch, so a batch accepts exactly what the same messages
one by one would.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from . import signed
from .client_states import SHARE_CIPHERTEXT_BYTES
from .errors import (
    DuplicateMessage,
    InvalidKey,
    ProtocolViolation,
    SecAggError,
    StaleMessage,
    WrongStage,
)
from .identity import IdentityError
from .messages import (
    MESSAGE_STAGE,
    AdvertiseKeysResponse,
    ClientMessage,
    ConsistencyResponse,
    EncryptedShare,
    MaskedInputResponse,
    RoundHeader,
    ShareKeysResponse,
    ShareKind,
    UnmaskResponse,
)
from .primitives import validate_public_key
from .ring import as_ring_vector
from .server_states import (
    Advert,
    DecodedShare,
    PublicKeys,
    ServerCollectingConsistency,
    ServerCollectingKeys,
    ServerCollectingMaskedInputs,
    ServerCollectingShares,
    ServerCollectingUnmask,
    ServerState,
    Words,
)
from .shamir import decode_share

Collecting = (
    ServerCollectingKeys
    | ServerCollectingShares
    | ServerCollectingMaskedInputs
    | ServerCollectingConsistency
    | ServerCollectingUnmask
)

#: an ECDSA P-256 signature in DER has at most 72 bytes
MAX_SIGNATURE_BYTES = 72
#: a peer certificate is a few hundred bytes; anything this large is not one
MAX_CERTIFICATE_BYTES = 16384


@dataclass
class _Draft:
    """Mutable copies of the collections a batch adds to (made once per batch)."""

    keys: dict[int, PublicKeys] = field(default_factory=dict)
    keys_seen: set[bytes] = field(default_factory=set)
    adverts: dict[int, Advert] = field(default_factory=dict)
    key_ids_seen: set[bytes] = field(default_factory=set)
    attestations: dict[int, bytes] = field(default_factory=dict)
    shares: dict[int, dict[int, EncryptedShare]] = field(default_factory=dict)
    a3: set[int] = field(default_factory=set)
    total: Words | None = None
    responses: dict[int, tuple[DecodedShare, ...]] = field(default_factory=dict)
    counts: dict[tuple[ShareKind, int], int] = field(default_factory=dict)


def _draft(state: Collecting) -> _Draft:
    if isinstance(state, ServerCollectingKeys):
        return _Draft(
            keys=dict(state.keys),
            keys_seen=set(state.keys_seen),
            adverts=dict(state.adverts),
            key_ids_seen={advert[2] for advert in state.adverts.values()},
        )
    if isinstance(state, ServerCollectingShares):
        return _Draft(shares=dict(state.shares))  # type: ignore[arg-type]
    if isinstance(state, ServerCollectingMaskedInputs):
        return _Draft(a3=set(state.a3), total=state.total.copy())
    if isinstance(state, ServerCollectingConsistency):
        return _Draft(attestations=dict(state.attestations))
    return _Draft(responses=dict(state.responses), counts=dict(state.counts))


def _finish(state: Collecting, draft: _Draft) -> ServerState:
    if isinstance(state, ServerCollectingKeys):
        return replace(
            state, keys=draft.keys, keys_seen=frozenset(draft.keys_seen), adverts=draft.adverts
        )
    if isinstance(state, ServerCollectingShares):
        return replace(state, shares=draft.shares)
    if isinstance(state, ServerCollectingMaskedInputs):
        total = state.total if draft.total is None else draft.total
        return replace(state, a3=frozenset(draft.a3), total=total)
    if isinstance(state, ServerCollectingConsistency):
        return replace(state, attestations=draft.attestations)
    return replace(state, responses=draft.responses, counts=draft.counts)


def _check(state: ServerState, draft: _Draft, sender: int, message: ClientMessage) -> None:
    ctx = state.ctx
    if isinstance(sender, bool) or not isinstance(sender, int):
        raise ProtocolViolation(f"sender must be a client index, got {sender!r}")
    if not 0 <= sender < ctx.params.num_clients:
        raise ProtocolViolation(f"sender {sender} outside [0, {ctx.params.num_clients})")
    header = getattr(message, "header", None)
    if not isinstance(header, RoundHeader):
        raise ProtocolViolation("message without a RoundHeader")
    if (header.job_id, header.round, header.session_id) != (ctx.job_id, ctx.round, ctx.session_id):
        raise StaleMessage(f"message from {sender} belongs to another job, round or session")
    expected = MESSAGE_STAGE.get(type(message))
    if expected is None or header.stage != expected:
        raise WrongStage(f"{type(message).__name__} from {sender} carries stage {header.stage!r}")
    if not isinstance(state, Collecting):
        raise WrongStage(f"no responses are collected in {type(state).__name__}")
    if expected != state.stage:
        raise WrongStage(f"{expected.name} response from {sender} during {state.stage.name}")
    if isinstance(state, ServerCollectingKeys):
        asked, answered = True, sender in draft.keys
    elif isinstance(state, ServerCollectingShares):
        asked, answered = sender in state.keys, sender in draft.shares
    elif isinstance(state, ServerCollectingMaskedInputs):
        asked, answered = sender in state.a2, sender in draft.a3
    elif isinstance(state, ServerCollectingConsistency):
        asked, answered = sender in state.a3, sender in draft.attestations
    else:
        asked, answered = sender in state.requests, sender in draft.responses
    if answered:
        raise DuplicateMessage(f"client {sender} already answered {expected.name}")
    if not asked:
        raise ProtocolViolation(f"client {sender} was not asked for {expected.name}")


def _signature(value: object, what: str) -> bytes:
    if not isinstance(value, bytes) or not 0 < len(value) <= MAX_SIGNATURE_BYTES:
        size = len(value) if isinstance(value, bytes) else type(value).__name__
        raise ProtocolViolation(
            f"{what}: a signature has 1 to {MAX_SIGNATURE_BYTES} bytes, got {size}"
        )
    return value


def _advert(draft: _Draft, sender: int, message: AdvertiseKeysResponse) -> Advert:
    """Structure of a malicious-secure advertisement (the agents verify the signatures)."""
    signature = _signature(message.signature, f"advertisement of {sender}")
    certificate = message.certificate
    if not isinstance(certificate, bytes) or not 0 < len(certificate) <= MAX_CERTIFICATE_BYTES:
        raise ProtocolViolation(
            f"advertisement of {sender}: no certificate, or one over {MAX_CERTIFICATE_BYTES} bytes"
        )
    try:
        key_id = signed.certificate_key_id(certificate)
    except IdentityError as exc:
        raise ProtocolViolation(f"advertisement of {sender}: {exc}") from None
    if key_id in draft.key_ids_seen:
        raise ProtocolViolation(
            f"advertisement of {sender}: the certificate key of another advertisement"
        )
    return signature, certificate, key_id


def _add_keys(
    state: ServerCollectingKeys, draft: _Draft, sender: int, message: AdvertiseKeysResponse
) -> None:
    enc, mask = message.encryption_public_key, message.masking_public_key
    validate_public_key(enc)
    validate_public_key(mask)
    if enc == mask:
        raise InvalidKey(f"client {sender} uses one key for encryption and masking")
    if enc in draft.keys_seen or mask in draft.keys_seen:
        raise InvalidKey(f"client {sender} advertises a key another client already uses")
    if state.ctx.malicious:
        advert = _advert(draft, sender, message)
        draft.adverts[sender] = advert
        draft.key_ids_seen.add(advert[2])
    draft.keys[sender] = (enc, mask)
    draft.keys_seen.update((enc, mask))


def _add_shares(
    state: ServerCollectingShares, draft: _Draft, sender: int, message: ShareKeysResponse
) -> None:
    expected = {j for j in state.ctx.graph.neighbours(sender) if j != sender and j in state.keys}
    by_receiver: dict[int, EncryptedShare] = {}
    for share in message.shares:
        if not isinstance(share, EncryptedShare):
            raise ProtocolViolation(f"malformed share from {sender}")
        if share.sender != sender:
            raise ProtocolViolation(f"client {sender} sent a share labelled from {share.sender}")
        if share.receiver not in expected:
            raise ProtocolViolation(
                f"client {sender} sent a share to non-neighbour {share.receiver}"
            )
        if share.receiver in by_receiver:
            raise ProtocolViolation(f"client {sender} sent two shares to {share.receiver}")
        if (
            not isinstance(share.ciphertext, bytes)
            or len(share.ciphertext) != SHARE_CIPHERTEXT_BYTES
        ):
            raise ProtocolViolation(
                f"share from {sender} to {share.receiver} is not {SHARE_CIPHERTEXT_BYTES} bytes"
            )
        by_receiver[share.receiver] = share
    if len(by_receiver) != len(expected):
        missing = sorted(expected - set(by_receiver))
        raise ProtocolViolation(f"client {sender} sent no share to listed neighbours {missing}")
    draft.shares[sender] = by_receiver


def _add_masked(
    state: ServerCollectingMaskedInputs, draft: _Draft, sender: int, message: MaskedInputResponse
) -> None:
    params = state.ctx.params
    try:
        y = as_ring_vector(
            message.masked_input, ring_bits=params.ring_bits, length=params.vector_length
        )
    except SecAggError as exc:
        raise ProtocolViolation(f"masked input of {sender}: {exc}") from exc
    total = draft.total
    if total is None:  # pragma: no cover - the draft of this stage always has a total
        raise WrongStage("no running total")
    np.add(total, y.astype(total.dtype), out=total)
    draft.a3.add(sender)


def _add_unmask(
    state: ServerCollectingUnmask, draft: _Draft, sender: int, message: UnmaskResponse
) -> None:
    alive, dropped = state.requests[sender]
    wanted = {(ShareKind.SELF_MASK_SEED, a) for a in alive}
    wanted |= {(ShareKind.MASKING_KEY, d) for d in dropped}
    decoded: list[DecodedShare] = []
    seen: set[tuple[ShareKind, int]] = set()
    for item in message.shares:
        key = (item.kind, item.owner)
        if key not in wanted:
            raise ProtocolViolation(f"client {sender} sent an unrequested share {key}")
        if key in seen:
            raise ProtocolViolation(f"client {sender} sent two shares for {key}")
        seen.add(key)
        decoded.append((item.owner, item.kind, decode_share(item.share)))
    if seen != wanted:
        raise ProtocolViolation(f"client {sender} left out {len(wanted - seen)} requested shares")
    for owner, kind, _ in decoded:
        draft.counts[(kind, owner)] = draft.counts.get((kind, owner), 0) + 1
    draft.responses[sender] = tuple(decoded)


def _add(state: ServerState, draft: _Draft, sender: int, message: ClientMessage) -> None:
    _check(state, draft, sender, message)
    if isinstance(state, ServerCollectingKeys) and isinstance(message, AdvertiseKeysResponse):
        _add_keys(state, draft, sender, message)
    elif isinstance(state, ServerCollectingShares) and isinstance(message, ShareKeysResponse):
        _add_shares(state, draft, sender, message)
    elif isinstance(state, ServerCollectingMaskedInputs) and isinstance(
        message, MaskedInputResponse
    ):
        _add_masked(state, draft, sender, message)
    elif isinstance(state, ServerCollectingConsistency) and isinstance(
        message, ConsistencyResponse
    ):
        draft.attestations[sender] = _signature(
            message.signature, f"consistency signature of {sender}"
        )
    elif isinstance(state, ServerCollectingUnmask) and isinstance(message, UnmaskResponse):
        _add_unmask(state, draft, sender, message)
    else:
        raise WrongStage(f"{type(message).__name__} does not apply to {type(state).__name__}")


def receive(state: ServerState, sender: int, message: ClientMessage) -> ServerState:
    """Add one response; the state is unchanged when it is refused.

    Raises:
        StaleMessage: another job, round or session.
        WrongStage: not the stage being collected.
        DuplicateMessage: the sender already answered this stage.
        ProtocolViolation, InvalidKey, InvalidShare: the sender was not asked, or the content is
            malformed (wrong share count, wrong length, value outside the ring, bad key ...).
    """
    state, rejected = receive_many(state, [(sender, message)])
    if rejected:
        raise rejected[0][1]
    return state


def receive_many(
    state: ServerState, messages: Iterable[tuple[int, ClientMessage]]
) -> tuple[ServerState, list[tuple[int, SecAggError]]]:
    """Add a batch of (sender, response) pairs in order, with one copy of the collections.

    Returns:
        The new state and the refused responses, each with the typed error it would have raised
        from :func:`receive` (a refused response changes nothing).
    """
    rejected: list[tuple[int, SecAggError]] = []
    if not isinstance(state, Collecting):
        for sender, _ in messages:
            rejected.append(
                (sender, WrongStage(f"no responses are collected in {type(state).__name__}"))
            )
        return state, rejected
    draft = _draft(state)
    for sender, message in messages:
        try:
            _add(state, draft, sender, message)
        except SecAggError as exc:
            rejected.append((sender, exc))
    return _finish(state, draft), rejected
