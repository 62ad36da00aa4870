"""The client (agent) side of the protocol: one frozen state per stage, one pure step function.

``step(state, request) -> (state, response | None)``. A client verifies every request and answers
each stage at most once: an out-of-place message raises (the caller keeps its state), a request
whose content breaks the protocol returns a :class:`ClientAborted` state. Keys are fresh every
round; all randomness comes from the injected source. The rules:
docs/secagg.md#how-a-client-treats-a-request. In a malicious-secure round (the setup says so and
the client has a :class:`~dpfl.secagg.identity.ClientIdentity`) it also signs its keys, checks the
roster, the seeded graph and every neighbour's certificate and signature, signs the survivor set
once and reveals shares only for an attested one (docs/secagg.md#the-malicious-secure-variant).
"""

from __future__ import annotations

from dataclasses import replace

import numpy.typing as npt

from . import shamir, signed
from .client_states import (
    SESSION_ID_BYTES,
    SHARE_PLAINTEXT_BYTES,
    ClientAborted,
    ClientAwaitingConsistency,
    ClientAwaitingSetup,
    ClientConsistencySigned,
    ClientContext,
    ClientFinished,
    ClientKeysAdvertised,
    ClientMaskedInputSent,
    ClientSharesSent,
    ClientState,
    RingVector,
)
from .config import RoundParameters
from .errors import (
    DecryptionError,
    DuplicateMessage,
    ErrorCode,
    InvalidKey,
    InvalidShare,
    ParameterError,
    SecAggError,
    StaleMessage,
    VerificationFailed,
    WrongStage,
)
from .identity import ClientIdentity, IdentityError, PeerIdentity
from .messages import (
    MESSAGE_STAGE,
    AdvertiseKeysRequest,
    AdvertiseKeysResponse,
    Attestation,
    ClientMessage,
    ConsistencyRequest,
    ConsistencyResponse,
    EncryptedShare,
    MaskedInputRequest,
    MaskedInputResponse,
    PeerKeys,
    RosterEntry,
    RoundHeader,
    ServerMessage,
    ShareKeysRequest,
    ShareKeysResponse,
    ShareKind,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    UnmaskShare,
    stage_rank,
)
from .parameters import ThreatModel
from .prg import PAIR_MASK, SELF_MASK, MaskAccumulator
from .primitives import (
    NONCE_BYTES,
    agree_many,
    compute_session_id,
    decrypt_share,
    encrypt_share,
    keypair_from_private,
    mask_seed,
    share_key,
    validate_public_key,
)
from .randomness import RandomSource, SystemRandomSource
from .ring import as_integer_vector, as_ring_vector


def new_client(
    *,
    job_id: str,
    round: int,
    rng: RandomSource | None = None,
    input: npt.ArrayLike | None = None,
    identity: ClientIdentity | None = None,
) -> ClientAwaitingSetup:
    """A client ready for the setup of round ``round`` of ``job_id``.

    Args:
        job_id: the job, as in every ``RoundHeader``.
        round: the round number.
        rng: randomness (production: None → :class:`SystemRandomSource`).
        input: the ring vector to sum (encoded and noised already), or None to attach it later with
            :func:`with_input` (any time before the masked-input request).
        identity: the agent's peer identity; without it a malicious-secure setup is refused. A
            semi-honest setup runs the plain protocol whether it is given or not.
    """
    if not isinstance(job_id, str):
        raise ParameterError("job_id must be a string")
    if isinstance(round, bool) or not isinstance(round, int) or round < 0:
        raise ParameterError(f"round must be an integer ≥ 0, got {round!r}")
    if identity is not None and not isinstance(identity, ClientIdentity):
        raise ParameterError(f"identity must be a ClientIdentity, got {type(identity).__name__}")
    vector = None if input is None else as_integer_vector(input)
    return ClientAwaitingSetup(
        job_id=job_id,
        round=round,
        rng=rng or SystemRandomSource(),
        input=vector,
        identity=identity,
    )


def verified_noise_shares(state: ClientState) -> int:
    """How many noise shares, this agent's own included, every sum the coordinator can decode
    that contains this agent's input is sure to hold, as far as this agent verified itself.

    max(1, t − c) once the stage-2 checks of a malicious-secure round passed and the threshold
    condition 2t > k + 1 + c holds (c: the identity's ``max_colluding_peers``); 1 (the agent's
    own share, the local-DP figure) otherwise, and after an abort.
    Derivation: docs/secagg.md#why-t--c-shares-of-noise-are-always-in-the-sum.
    """
    if not isinstance(
        state,
        ClientSharesSent | ClientAwaitingConsistency | ClientConsistencySigned | ClientFinished,
    ):
        return 1
    identity = state.ctx.identity
    if identity is None:
        return 1
    params = state.ctx.params
    c = identity.max_colluding_peers
    if 2 * params.threshold <= params.degree + 1 + c:
        return 1
    return max(1, params.threshold - c)


def with_input(state: ClientState, values: npt.ArrayLike) -> ClientState:
    """The same state with the input vector attached (before the masked-input request).

    Raises:
        WrongStage: the masked input was already sent (or the client left the round).
        ParameterError: not an integer vector, or (once the setup is known) wrong length or values
            outside [−2^(r−1), 2^r).
    """
    if isinstance(state, ClientAwaitingSetup):
        return replace(state, input=as_integer_vector(values))
    if isinstance(state, ClientKeysAdvertised | ClientSharesSent):
        params = state.ctx.params
        vec = as_ring_vector(values, ring_bits=params.ring_bits, length=params.vector_length)
        return replace(state, input=vec)
    raise WrongStage(f"cannot attach an input in state {type(state).__name__}")


def _abort(
    state: ClientState, reason: str, code: ErrorCode = ErrorCode.PROTOCOL_ABORT
) -> ClientAborted:
    if isinstance(state, ClientAwaitingSetup):
        return ClientAborted(state.job_id, state.round, state.stage, reason, code)
    if isinstance(state, ClientAborted):
        return state
    return ClientAborted(state.ctx.job_id, state.ctx.round, state.stage, reason, code)


def _check_header(state: ClientState, message: ServerMessage) -> None:
    header = message.header
    if not isinstance(header, RoundHeader):
        raise StaleMessage("message without a RoundHeader")
    if isinstance(state, ClientAwaitingSetup | ClientAborted):
        job_id, round_ = state.job_id, state.round
        session = None
    else:
        job_id, round_, session = state.ctx.job_id, state.ctx.round, state.ctx.session_id
    if header.job_id != job_id or header.round != round_:
        raise StaleMessage(
            f"message of job {header.job_id!r} round {header.round}, expected {job_id!r} "
            f"round {round_}"
        )
    if session is not None and header.session_id != session:
        raise StaleMessage("message of another secure-aggregation session")
    expected = MESSAGE_STAGE.get(type(message))
    if expected is None:
        raise WrongStage(f"not a server request: {type(message).__name__}")
    if header.stage != expected:
        raise WrongStage(f"{type(message).__name__} carries stage {header.stage!r}")
    if isinstance(state, ClientAborted):
        raise WrongStage(f"the client left the round: {state.reason}")
    if (
        expected is Stage.CONSISTENCY
        and not isinstance(state, ClientAwaitingSetup)
        and not state.ctx.malicious
    ):
        raise WrongStage("a consistency request in a round that is not malicious-secure")
    if stage_rank(expected) < stage_rank(state.stage):
        raise DuplicateMessage(f"stage {expected.name} was already answered")
    if stage_rank(expected) > stage_rank(state.stage):
        raise WrongStage(f"got {expected.name} while expecting {state.stage.name}")


def step(state: ClientState, message: ServerMessage) -> tuple[ClientState, ClientMessage | None]:
    """Handle one server request.

    Returns:
        (new state, response to send) — or (ClientAborted, None) when the request's content breaks
        the protocol.

    Raises:
        StaleMessage, DuplicateMessage, WrongStage: the request is not for this state; nothing
            changed.
    """
    _check_header(state, message)
    try:
        if isinstance(state, ClientAwaitingSetup) and isinstance(message, AdvertiseKeysRequest):
            return _advertise(state, message)
        if isinstance(state, ClientKeysAdvertised) and isinstance(message, ShareKeysRequest):
            return _share_keys(state, message)
        if isinstance(state, ClientSharesSent) and isinstance(message, MaskedInputRequest):
            return _masked_input(state, message)
        if isinstance(state, ClientAwaitingConsistency) and isinstance(message, ConsistencyRequest):
            return _consistency(state, message)
        if isinstance(state, ClientMaskedInputSent | ClientConsistencySigned) and isinstance(
            message, UnmaskRequest
        ):
            return _unmask(state, message)
    except SecAggError as exc:
        return _abort(state, f"{type(exc).__name__}: {exc}", exc.code), None
    raise WrongStage(f"{type(message).__name__} does not apply to {type(state).__name__}")


# -- stage 1 --------------------------------------------------------------------------------------


def _advertise(
    state: ClientAwaitingSetup, message: AdvertiseKeysRequest
) -> tuple[ClientState, ClientMessage | None]:
    session = message.header.session_id
    if not isinstance(session, bytes) or len(session) != SESSION_ID_BYTES:
        raise ParameterError(f"session id must have {SESSION_ID_BYTES} bytes")
    # docs/secagg.md#stage-0-setup: the session id must be SHA-256(round_id ‖ server nonce), so that
    # a server cannot present one session's id (and hence its ciphertexts) in another round.
    if (
        compute_session_id(
            job_id=state.job_id, round=state.round, nonce=message.setup.session_nonce
        )
        != session
    ):
        raise ParameterError("session id does not match SHA-256(job ‖ round ‖ server nonce)")
    params = RoundParameters.from_setup(message.setup)
    index = message.setup.client_index
    identity, digest = _threat_model(state, message)
    ctx = ClientContext(
        state.job_id, state.round, session, index, params, state.rng, identity, digest
    )
    if state.input is not None:
        vector: RingVector | None = as_ring_vector(
            state.input, ring_bits=params.ring_bits, length=params.vector_length
        )
    else:
        vector = None
    stream = state.rng.stream(ctx.label("keys"))
    encryption = keypair_from_private(stream.read(32))
    masking = keypair_from_private(stream.read(32))
    new = ClientKeysAdvertised(ctx, encryption, masking, vector)
    signature = certificate = b""
    if identity is not None:
        signature = identity.signer.sign(
            signed.advertisement_message(
                session_id=session,
                index=index,
                encryption_key=encryption.public,
                masking_key=masking.public,
                setup=digest,
            )
        )
        certificate = identity.signer.certificate_der
    reply = AdvertiseKeysResponse(
        header=ctx.header(Stage.ADVERTISE_KEYS),
        encryption_public_key=encryption.public,
        masking_public_key=masking.public,
        signature=signature,
        certificate=certificate,
    )
    return new, reply


_THREAT_MODELS = frozenset(model.value for model in ThreatModel)


def _threat_model(
    state: ClientAwaitingSetup, message: AdvertiseKeysRequest
) -> tuple[ClientIdentity | None, bytes]:
    """(identity, setup digest) for a malicious-secure setup, (None, b"") otherwise."""
    threat = message.setup.threat_model
    if threat not in _THREAT_MODELS:
        raise ParameterError(f"unknown threat model {threat!r} in the setup")
    if threat != ThreatModel.MALICIOUS.value:
        return None, b""
    if state.identity is None:
        raise IdentityError(
            "malicious-secure setup refused: this agent has no peer identity (a federation CA "
            "to trust, a peer certificate and its signing key)"
        )
    return state.identity, signed.setup_digest(message.setup)


# -- stage 2 --------------------------------------------------------------------------------------


def _validate_peers(
    state: ClientKeysAdvertised, peers: tuple[PeerKeys, ...]
) -> dict[int, PeerKeys]:
    ctx = state.ctx
    params = ctx.params
    if not isinstance(peers, tuple):
        raise ParameterError("peers must be a sequence")
    if len(peers) < params.threshold:
        raise ParameterError(
            f"{len(peers)} neighbours listed, at least t={params.threshold} needed"
        )
    if len(peers) > params.degree + 1:
        raise ParameterError(f"{len(peers)} neighbours listed, at most k+1={params.degree + 1}")
    by_index: dict[int, PeerKeys] = {}
    keys_seen: set[bytes] = set()
    for peer in peers:
        if not isinstance(peer, PeerKeys):
            raise ParameterError("malformed peer entry")
        j = peer.index
        if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < params.num_clients:
            raise ParameterError(f"peer index {j!r} outside [0, {params.num_clients})")
        if j in by_index:
            raise ParameterError(f"peer {j} listed twice")
        for key in (peer.encryption_public_key, peer.masking_public_key):
            validate_public_key(key)
            if key in keys_seen:
                raise InvalidKey(f"public key of peer {j} duplicates another key")
            keys_seen.add(key)
        by_index[j] = peer
    own = by_index.get(ctx.index)
    if own is None:
        raise ParameterError("own entry missing from the neighbour list")
    if (own.encryption_public_key, own.masking_public_key) != (
        state.encryption_key.public,
        state.masking_key.public,
    ):
        raise InvalidKey("own entry does not carry own public keys")
    if ctx.identity is not None and own.certificate != ctx.identity.signer.certificate_der:
        raise IdentityError("own entry does not carry own peer certificate")
    return by_index


def _check_roster(state: ClientKeysAdvertised, roster: tuple[RosterEntry, ...]) -> dict[int, bytes]:
    """The roster as index -> d_j, after its structure checks."""
    params = state.ctx.params
    if not isinstance(roster, tuple) or not roster:
        raise VerificationFailed("malicious-secure share-keys request without a roster")
    digests: dict[int, bytes] = {}
    previous = -1
    for entry in roster:
        if not isinstance(entry, RosterEntry):
            raise ParameterError("malformed roster entry")
        j = entry.index
        if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < params.num_clients:
            raise ParameterError(f"roster index {j!r} outside [0, {params.num_clients})")
        if j <= previous:
            raise VerificationFailed("roster not in strictly increasing index order")
        if not isinstance(entry.digest, bytes) or len(entry.digest) != signed.DIGEST_BYTES:
            raise ParameterError(f"roster digest of {j} is not {signed.DIGEST_BYTES} bytes")
        digests[j] = entry.digest
        previous = j
    if len(digests) < params.min_survivors:
        raise VerificationFailed(
            f"roster lists {len(digests)} advertisements, fewer than min_survivors="
            f"{params.min_survivors}"
        )
    if state.ctx.index not in digests:
        raise VerificationFailed("this agent's advertisement is missing from the roster")
    return digests


def _verify_peers(
    state: ClientKeysAdvertised, message: ShareKeysRequest, peers: dict[int, PeerKeys]
) -> tuple[dict[int, PeerIdentity], frozenset[int]]:
    """Stage 2 of the malicious-secure variant: the roster fixes the graph, and every listed
    neighbour is a distinct certified peer that signed its keys over this agent's setup digest.
    Returns the neighbours' verified identities and the roster's indices (A1)."""
    ctx = state.ctx
    identity = ctx.identity
    if identity is None:  # pragma: no cover - called in malicious rounds only
        raise VerificationFailed("no identity")
    params = ctx.params
    digests = _check_roster(state, message.roster)
    seed = signed.graph_seed(ctx.session_id, message.roster)
    hood = signed.seeded_neighbours(params.num_clients, params.degree, seed, ctx.index)
    expected = {j for j in hood if j in digests}
    if set(peers) != expected:
        raise VerificationFailed(
            f"wrong neighbours for the seeded graph: listed {sorted(peers)}, the roster's graph "
            f"gives {sorted(expected)}"
        )
    identities: dict[int, PeerIdentity] = {}
    seen: dict[bytes, int] = {}
    for j in sorted(peers):
        peer = peers[j]
        try:
            pid = identity.authority.identity(peer.certificate, now=identity.now)
        except IdentityError as exc:
            raise IdentityError(f"uncertified peer {j}: {exc}") from None
        key_id = signed.public_key_id(pid.public_key)
        for what, value in (
            ("certificate", pid.fingerprint),
            ("signing key", key_id),
            ("peer name", pid.name.encode("utf-8")),
        ):
            other = seen.get(what.encode() + b"\x00" + value)
            if other is not None:
                raise IdentityError(f"duplicate identity: peers {other} and {j} have one {what}")
            seen[what.encode() + b"\x00" + value] = j
        pid.verify(
            signed.advertisement_message(
                session_id=ctx.session_id,
                index=j,
                encryption_key=peer.encryption_public_key,
                masking_key=peer.masking_public_key,
                setup=ctx.setup_digest,
            ),
            peer.signature,
            what=f"bad signature on the advertisement of peer {j} (keys, session and setup)",
        )
        entry = signed.roster_digest(
            index=j,
            encryption_key=peer.encryption_public_key,
            masking_key=peer.masking_public_key,
            key_id=key_id,
        )
        if entry != digests[j]:
            raise VerificationFailed(f"roster entry of peer {j} does not match its advertisement")
        identities[j] = pid
    return identities, frozenset(digests)


def _share_keys(
    state: ClientKeysAdvertised, message: ShareKeysRequest
) -> tuple[ClientState, ClientMessage | None]:
    ctx = state.ctx
    peers = _validate_peers(state, message.peers)
    identities: dict[int, PeerIdentity] = {}
    roster: frozenset[int] = frozenset()
    if ctx.malicious:
        identities, roster = _verify_peers(state, message, peers)
    order = sorted(peers)
    stream = ctx.rng.stream(ctx.label("shares"))
    self_seed = stream.read(shamir.SECRET_BYTES)
    b_shares, s_shares = shamir.share(
        [shamir.secret_to_int(self_seed), shamir.secret_to_int(state.masking_key.private)],
        xs=[j + 1 for j in order],
        threshold=ctx.params.threshold,
        rng=stream,
    )
    me = ctx.index
    others = [j for j in order if j != me]
    secrets = dict(
        zip(
            others,
            agree_many(
                state.encryption_key.private, [peers[j].encryption_public_key for j in others]
            ),
            strict=True,
        )
    )
    receive_keys = {
        j: share_key(secrets[j], session_id=ctx.session_id, sender=j, receiver=me) for j in others
    }
    out: list[EncryptedShare] = []
    own: tuple[int, int] = (0, 0)
    for j, b_share, s_share in zip(order, b_shares, s_shares, strict=True):
        if j == me:
            own = (b_share, s_share)
            continue
        key = share_key(secrets[j], session_id=ctx.session_id, sender=me, receiver=j)
        plaintext = (
            me.to_bytes(4, "big")
            + j.to_bytes(4, "big")
            + shamir.encode_share(b_share)
            + shamir.encode_share(s_share)
        )
        ciphertext = encrypt_share(
            key,
            session_id=ctx.session_id,
            sender=me,
            receiver=j,
            plaintext=plaintext,
            nonce=stream.read(NONCE_BYTES),
        )
        out.append(EncryptedShare(sender=me, receiver=j, ciphertext=ciphertext))
    new = ClientSharesSent(
        ctx,
        receive_keys,
        state.masking_key,
        peers,
        self_seed,
        own,
        state.input,
        identities,
        roster,
    )
    return new, ShareKeysResponse(header=ctx.header(Stage.SHARE_KEYS), shares=tuple(out))


# -- stage 3 --------------------------------------------------------------------------------------


def _decrypt_all(
    state: ClientSharesSent, shares: tuple[EncryptedShare, ...]
) -> dict[int, tuple[int, int]]:
    ctx = state.ctx
    me = ctx.index
    received: dict[int, tuple[int, int]] = {}
    for item in shares:
        if not isinstance(item, EncryptedShare):
            raise ParameterError("malformed encrypted share")
        i = item.sender
        if item.receiver != me:
            raise DecryptionError(f"share from {i} addressed to {item.receiver}, not to {me}")
        if i == me or i not in state.peers:
            raise DecryptionError(f"share from {i!r}, who is not a listed neighbour")
        if i in received:
            raise DecryptionError(f"two shares from {i}")
        plain = decrypt_share(
            state.receive_keys[i],
            session_id=ctx.session_id,
            sender=i,
            receiver=me,
            ciphertext=item.ciphertext,
        )
        if len(plain) != SHARE_PLAINTEXT_BYTES:
            raise DecryptionError(f"share from {i} has {len(plain)} bytes of plaintext")
        inner_i, inner_j = int.from_bytes(plain[:4], "big"), int.from_bytes(plain[4:8], "big")
        if (inner_i, inner_j) != (i, me):
            raise DecryptionError(f"share from {i} names ({inner_i}, {inner_j}) inside")
        b = shamir.decode_share(plain[8 : 8 + shamir.SHARE_BYTES])
        s = shamir.decode_share(plain[8 + shamir.SHARE_BYTES :])
        received[i] = (b, s)
    return received


def _masked_input(
    state: ClientSharesSent, message: MaskedInputRequest
) -> tuple[ClientState, ClientMessage | None]:
    ctx = state.ctx
    params = ctx.params
    if state.input is None:
        raise ParameterError("no input vector attached (use with_input before stage 3)")
    received = _decrypt_all(state, message.shares)
    if len(received) + 1 < params.threshold:
        raise InvalidShare(
            f"only {len(received)} neighbours shared; t={params.threshold} needs "
            f"{params.threshold - 1}"
        )
    me = ctx.index
    acc = MaskAccumulator(
        length=params.vector_length, ring_bits=params.ring_bits, session_id=ctx.session_id
    )
    acc.add_vector(state.input)
    acc.add_prg(state.self_seed, name=SELF_MASK)
    senders = sorted(received)
    secrets = agree_many(
        state.masking_key.private, [state.peers[i].masking_public_key for i in senders]
    )
    for i, secret in zip(senders, secrets, strict=True):
        seed = mask_seed(secret, session_id=ctx.session_id, a=me, b=i)
        acc.add_prg(seed, name=PAIR_MASK, sign=1 if me < i else -1)
    shares = dict(received)
    shares[me] = state.own_shares
    new: ClientState
    if ctx.malicious:
        new = ClientAwaitingConsistency(
            ctx,
            listed=frozenset(state.peers),
            senders=frozenset(received),
            shares=shares,
            identities=state.identities,
            roster=state.roster,
        )
    else:
        new = ClientMaskedInputSent(
            ctx, listed=frozenset(state.peers), senders=frozenset(received), shares=shares
        )
    return new, MaskedInputResponse(
        header=ctx.header(Stage.MASKED_INPUT), masked_input=acc.result()
    )


# -- consistency (malicious-secure variant) -------------------------------------------------------


def _consistency(
    state: ClientAwaitingConsistency, message: ConsistencyRequest
) -> tuple[ClientState, ClientMessage | None]:
    ctx = state.ctx
    identity = ctx.identity
    if identity is None:  # pragma: no cover - the state exists in malicious rounds only
        raise VerificationFailed("no identity")
    survivors = _id_tuple(message.survivors, "survivors")
    outside = sorted(set(survivors) - state.roster)
    if outside:
        raise VerificationFailed(f"the survivor set lists {outside[:5]}, not in the roster")
    if ctx.index not in survivors:
        raise VerificationFailed(
            "inconsistent survivor set: this agent sent its masked input but is not in S"
        )
    if len(survivors) < ctx.params.min_survivors:
        raise VerificationFailed(
            f"the survivor set has {len(survivors)} agents, fewer than min_survivors="
            f"{ctx.params.min_survivors}"
        )
    ordered = tuple(sorted(survivors))
    digest = signed.survivors_digest(ordered)
    signature = identity.signer.sign(
        signed.consistency_message(session_id=ctx.session_id, index=ctx.index, survivors=digest)
    )
    new = ClientConsistencySigned(
        ctx,
        listed=state.listed,
        senders=state.senders,
        shares=state.shares,
        identities=state.identities,
        survivors=ordered,
        survivors_digest=digest,
    )
    return new, ConsistencyResponse(header=ctx.header(Stage.CONSISTENCY), signature=signature)


def _check_attested(state: ClientConsistencySigned, message: UnmaskRequest) -> None:
    """Stage 4 of the malicious-secure variant: the request's S is the one this agent signed, t
    distinct neighbours (this agent included) signed it too, and alive/dropped follow from it."""
    ctx = state.ctx
    me = ctx.index
    t = ctx.params.threshold
    survivors = _id_tuple(message.survivors, "survivors")
    if tuple(sorted(survivors)) != state.survivors:
        raise VerificationFailed(
            "inconsistent survivor set: the unmask request's S is not the one this agent signed"
        )
    members = frozenset(state.survivors)
    if not isinstance(message.attestations, tuple):
        raise ParameterError("attestations must be a tuple")
    attested = {me}
    failed: list[int] = []
    seen: set[int] = set()
    for item in message.attestations:
        if not isinstance(item, Attestation):
            raise ParameterError("malformed attestation")
        i = item.index
        if i in seen:
            raise VerificationFailed(f"two attestations from {i!r}")
        seen.add(i)
        peer = state.identities.get(i)
        if peer is None:
            raise VerificationFailed(f"an attestation from {i!r}, who is not a neighbour")
        if i not in members:
            raise VerificationFailed(f"an attestation from {i}, who is not in the survivor set")
        try:
            peer.verify(
                signed.consistency_message(
                    session_id=ctx.session_id, index=i, survivors=state.survivors_digest
                ),
                item.signature,
                what="attestation",
            )
        except IdentityError:
            failed.append(i)  # relayed as received: a neighbour's junk counts as no signature
            continue
        attested.add(i)
    if len(attested) < t:
        raise VerificationFailed(
            f"too few attestations: {len(attested)} neighbours (this agent included) signed the "
            f"survivor set, t={t}"
            + (f"; those of {failed} do not verify over it" if failed else "")
        )
    alive, dropped = set(message.alive), set(message.dropped)
    if alive != state.listed & members:
        raise VerificationFailed(
            "alive does not match the attested survivor set: it must be N(j) ∩ S = "
            f"{sorted(state.listed & members)}"
        )
    if dropped != state.senders - members:
        raise VerificationFailed(
            "dropped does not match the attested survivor set: it must be the neighbours that "
            f"shared with this agent outside S = {sorted(state.senders - members)}"
        )


# -- stage 4 --------------------------------------------------------------------------------------


def _id_tuple(values: tuple[int, ...], name: str) -> tuple[int, ...]:
    if not isinstance(values, tuple) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in values
    ):
        raise ParameterError(f"{name} must be a tuple of client indices")
    if len(set(values)) != len(values):
        raise ParameterError(f"{name} lists a client twice")
    return values


def _unmask(
    state: ClientMaskedInputSent | ClientConsistencySigned, message: UnmaskRequest
) -> tuple[ClientState, ClientMessage | None]:
    ctx = state.ctx
    me = ctx.index
    alive = _id_tuple(message.alive, "alive")
    dropped = _id_tuple(message.dropped, "dropped")
    if isinstance(state, ClientConsistencySigned):
        _check_attested(state, message)
    alive_set, dropped_set = set(alive), set(dropped)
    if alive_set & dropped_set:
        raise ParameterError(
            f"clients {sorted(alive_set & dropped_set)} are both alive and dropped"
        )
    if me not in alive_set:
        raise ParameterError("the request does not list this client as alive")
    known = state.senders | {me}
    dead = state.listed - known
    if dropped_set & dead:
        raise ParameterError(f"clients {sorted(dropped_set & dead)} were already dead")
    if not (alive_set | dropped_set) <= known:
        raise ParameterError(
            f"clients {sorted((alive_set | dropped_set) - known)} did not share with this client"
        )
    if len(alive_set) < ctx.params.threshold:
        raise ParameterError(f"only {len(alive_set)} alive neighbours, t={ctx.params.threshold}")
    out = [
        UnmaskShare(
            owner=a, kind=ShareKind.SELF_MASK_SEED, share=shamir.encode_share(state.shares[a][0])
        )
        for a in alive
    ]
    out += [
        UnmaskShare(
            owner=d, kind=ShareKind.MASKING_KEY, share=shamir.encode_share(state.shares[d][1])
        )
        for d in dropped
    ]
    return ClientFinished(ctx), UnmaskResponse(header=ctx.header(Stage.UNMASK), shares=tuple(out))
