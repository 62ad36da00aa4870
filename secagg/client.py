"""The client (agent) side of the protocol: one frozen state per stage, one pure step function.

``step(state, request) -> (state, response | None)``. A client verifies every request and answers
each stage at most once: an out-of-place message raises (the caller keeps its state), a request
whose content breaks the protocol returns a :class:`ClientAborted` state. Keys are fresh every
round; all randomness comes from the injected source. The rules:
docs/secagg.md#how-a-client-treats-a-request.
"""

from __future__ import annotations

from dataclasses import replace

import numpy.typing as npt

from . import shamir
from .client_states import (
    SESSION_ID_BYTES,
    SHARE_PLAINTEXT_BYTES,
    ClientAborted,
    ClientAwaitingSetup,
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
    WrongStage,
)
from .messages import (
    MESSAGE_STAGE,
    AdvertiseKeysRequest,
    AdvertiseKeysResponse,
    ClientMessage,
    EncryptedShare,
    MaskedInputRequest,
    MaskedInputResponse,
    PeerKeys,
    RoundHeader,
    ServerMessage,
    ShareKeysRequest,
    ShareKeysResponse,
    ShareKind,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    UnmaskShare,
)
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
) -> ClientAwaitingSetup:
    """A client ready for the setup of round ``round`` of ``job_id``.

    Args:
        job_id: the job, as in every ``RoundHeader``.
        round: the round number.
        rng: randomness (production: None → :class:`SystemRandomSource`).
        input: the ring vector to sum (encoded and noised already), or None to attach it later with
            :func:`with_input` (any time before the masked-input request).
    """
    if not isinstance(job_id, str):
        raise ParameterError("job_id must be a string")
    if isinstance(round, bool) or not isinstance(round, int) or round < 0:
        raise ParameterError(f"round must be an integer ≥ 0, got {round!r}")
    vector = None if input is None else as_integer_vector(input)
    return ClientAwaitingSetup(
        job_id=job_id, round=round, rng=rng or SystemRandomSource(), input=vector
    )


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
    if expected < state.stage:
        raise DuplicateMessage(f"stage {expected.name} was already answered")
    if expected > state.stage:
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
        if isinstance(state, ClientMaskedInputSent) and isinstance(message, UnmaskRequest):
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
    ctx = ClientContext(state.job_id, state.round, session, index, params, state.rng)
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
    reply = AdvertiseKeysResponse(
        header=ctx.header(Stage.ADVERTISE_KEYS),
        encryption_public_key=encryption.public,
        masking_public_key=masking.public,
    )
    return new, reply


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
    return by_index


def _share_keys(
    state: ClientKeysAdvertised, message: ShareKeysRequest
) -> tuple[ClientState, ClientMessage | None]:
    ctx = state.ctx
    peers = _validate_peers(state, message.peers)
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
    new = ClientSharesSent(ctx, receive_keys, state.masking_key, peers, self_seed, own, state.input)
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
    new = ClientMaskedInputSent(
        ctx, listed=frozenset(state.peers), senders=frozenset(received), shares=shares
    )
    return new, MaskedInputResponse(
        header=ctx.header(Stage.MASKED_INPUT), masked_input=acc.result()
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
    state: ClientMaskedInputSent, message: UnmaskRequest
) -> tuple[ClientState, ClientMessage | None]:
    ctx = state.ctx
    me = ctx.index
    alive = _id_tuple(message.alive, "alive")
    dropped = _id_tuple(message.dropped, "dropped")
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
