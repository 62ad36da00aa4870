"""Client-side verification (docs/secagg.md#the-protocol, #invariants-and-their-tests)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpfl.secagg import client, shamir
from dpfl.secagg.client_states import (
    ClientAborted,
    ClientFinished,
    ClientKeysAdvertised,
    ClientMaskedInputSent,
)
from dpfl.secagg.errors import DuplicateMessage, ParameterError, StaleMessage, WrongStage
from dpfl.secagg.messages import (
    AdvertiseKeysRequest,
    EncryptedShare,
    MaskedInputRequest,
    PeerKeys,
    RoundHeader,
    ShareKeysRequest,
    Stage,
    UnmaskRequest,
)
from dpfl.secagg.primitives import encrypt_share

ME = 0


def _aborted(world: Any, i: int, message: object, match: str) -> ClientAborted:
    state, reply = client.step(world.clients[i], message)  # type: ignore[arg-type]
    assert reply is None
    assert isinstance(state, ClientAborted), state
    assert match in state.reason, state.reason
    return state


# -- setup ----------------------------------------------------------------------------------------


def test_keys_are_fresh_every_round(make_world: Callable[..., Any]) -> None:
    first = make_world(round=1)
    first.answer()
    second = make_world(round=2)  # same seed, same client randomness source, next round
    second.answer()
    for i in range(7):
        a, b = first.replies[i], second.replies[i]
        assert a.encryption_public_key != b.encryption_public_key  # type: ignore[union-attr]
        assert a.masking_public_key != b.masking_public_key  # type: ignore[union-attr]
    keys = [r.masking_public_key for r in first.replies.values()]  # type: ignore[union-attr]
    assert len(set(keys)) == 7


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda r: dataclasses.replace(r, header=dataclasses.replace(r.header, session_id=b"x")),
            "session id",
        ),
        (
            lambda r: dataclasses.replace(r, setup=dataclasses.replace(r.setup, threshold=9)),
            "threshold",
        ),
        (
            lambda r: dataclasses.replace(r, setup=dataclasses.replace(r.setup, client_index=7)),
            "client_index",
        ),
        (
            lambda r: dataclasses.replace(r, setup=dataclasses.replace(r.setup, vector_length=5)),
            "expected 5",
        ),
    ],
)
def test_bad_setup_aborts(world: Any, change: Callable, match: str) -> None:  # type: ignore[type-arg]
    _aborted(world, ME, change(world.requests[ME]), match)


def test_the_setups_encoding_json_is_carried_unread(world: Any) -> None:
    """How the inputs were made is the application's agreement with its clients: the protocol
    answers a setup whatever its ``encoding_json`` holds (the agent checks it:
    tests/unit/client/test_summation.py)."""
    request = world.requests[ME]
    odd = dataclasses.replace(request, setup=dataclasses.replace(request.setup, encoding_json="{"))
    state, reply = client.step(world.clients[ME], odd)
    assert isinstance(state, ClientKeysAdvertised)
    assert reply is not None


# -- headers: stale, wrong stage, duplicate -------------------------------------------------------


def test_stale_and_misplaced_messages_raise_and_change_nothing(world: Any) -> None:
    request = world.requests[ME]
    assert isinstance(request, AdvertiseKeysRequest)
    for header in (
        dataclasses.replace(request.header, round=0),
        dataclasses.replace(request.header, job_id="other"),
    ):
        with pytest.raises(StaleMessage):
            client.step(world.clients[ME], dataclasses.replace(request, header=header))
    wrong = dataclasses.replace(
        request, header=dataclasses.replace(request.header, stage=Stage.UNMASK)
    )
    with pytest.raises(WrongStage):
        client.step(world.clients[ME], wrong)
    world.advance(1)  # keys advertised, share-keys requests pending
    with pytest.raises(DuplicateMessage):
        client.step(world.clients[ME], request)
    share_request = world.requests[ME]
    with pytest.raises(StaleMessage, match="session"):
        client.step(
            world.clients[ME],
            dataclasses.replace(
                share_request,
                header=dataclasses.replace(share_request.header, session_id=b"s" * 32),
            ),
        )
    too_early = UnmaskRequest(header=world.ctx.header(Stage.UNMASK), alive=(ME,), dropped=())
    with pytest.raises(WrongStage):
        client.step(world.clients[ME], too_early)
    assert isinstance(world.clients[ME], ClientKeysAdvertised)


# -- stage 2: the neighbour list ------------------------------------------------------------------


def _peers(world: Any) -> tuple[PeerKeys, ...]:
    request = world.requests[ME]
    assert isinstance(request, ShareKeysRequest)
    return request.peers


def _with_peers(world: Any, peers: tuple[PeerKeys, ...]) -> ShareKeysRequest:
    request = world.requests[ME]
    assert isinstance(request, ShareKeysRequest)
    return dataclasses.replace(request, peers=peers)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda p: p[:2], "at least t=3"),
        (lambda p: tuple(x for x in p if x.index != ME), "own entry missing"),
        (lambda p: (*p[:-1], p[0]), "listed twice"),
        (lambda p: (p[0], dataclasses.replace(p[1], index=99), *p[2:]), "outside"),
        (
            lambda p: (
                *p[:-1],
                dataclasses.replace(p[-1], encryption_public_key=p[0].masking_public_key),
            ),
            "duplicates",
        ),
        (
            lambda p: (*p[:-1], dataclasses.replace(p[-1], masking_public_key=bytes(32))),
            "small order",
        ),
        (
            lambda p: (*p[:-1], dataclasses.replace(p[-1], encryption_public_key=b"k" * 31)),
            "32 bytes",
        ),
    ],
    ids=[
        "too-few",
        "own-missing",
        "duplicate-entry",
        "bad-index",
        "duplicate-key",
        "low-order",
        "short-key",
    ],
)
def test_bad_neighbour_lists_abort(world: Any, edit: Callable, match: str) -> None:  # type: ignore[type-arg]
    world.advance(1)
    _aborted(world, ME, _with_peers(world, edit(_peers(world))), match)


def test_own_keys_must_be_own(world: Any) -> None:
    world.advance(1)
    peers = _peers(world)
    swapped = tuple(
        dataclasses.replace(
            p,
            encryption_public_key=p.masking_public_key,
            masking_public_key=p.encryption_public_key,
        )
        if p.index == ME
        else p
        for p in peers
    )
    _aborted(world, ME, _with_peers(world, swapped), "own public keys")


# -- stage 3: the shares ---------------------------------------------------------------------------


def _masked_request(world: Any) -> MaskedInputRequest:
    world.advance(2)
    request = world.requests[ME]
    assert isinstance(request, MaskedInputRequest)
    return request


def test_flipped_bit_aborts(world: Any) -> None:
    request = _masked_request(world)
    first = request.shares[0]
    tampered = bytearray(first.ciphertext)
    tampered[40] ^= 0x80
    bad = (dataclasses.replace(first, ciphertext=bytes(tampered)), *request.shares[1:])
    _aborted(world, ME, dataclasses.replace(request, shares=bad), "failed authentication")


def test_misdelivered_share_aborts(world: Any) -> None:
    _masked_request(world)
    # a share that sender i encrypted for another receiver l, delivered to ME
    other = next(j for j, r in sorted(world.requests.items()) if j != ME and r.shares)  # type: ignore[union-attr]
    foreign = world.requests[other].shares[0]  # type: ignore[union-attr]
    request = world.requests[ME]
    assert isinstance(request, MaskedInputRequest)
    as_is = dataclasses.replace(request, shares=(*request.shares, foreign))
    _aborted(world, ME, as_is, "not to 0")
    relabelled = dataclasses.replace(foreign, receiver=ME)
    shares = tuple(s for s in request.shares if s.sender != foreign.sender)
    if foreign.sender in {s.sender for s in request.shares}:
        _aborted(
            world,
            ME,
            dataclasses.replace(request, shares=(*shares, relabelled)),
            "failed authentication",
        )
    else:
        _aborted(
            world, ME, dataclasses.replace(request, shares=(*shares, relabelled)), "not a listed"
        )


def test_ciphertext_replayed_from_an_old_session_aborts(make_world: Callable[..., Any]) -> None:
    old = make_world(round=1)
    old_request = _masked_request(old)
    new = make_world(round=2)
    request = _masked_request(new)
    old_by_sender = {o.sender: o for o in old_request.shares}
    common = next(x.sender for x in request.shares if x.sender in old_by_sender)
    replayed = tuple(old_by_sender[common] if x.sender == common else x for x in request.shares)
    _aborted(new, ME, dataclasses.replace(request, shares=replayed), "failed authentication")


def test_inner_ids_must_match_outer_ids(world: Any) -> None:
    request = _masked_request(world)
    sender = request.shares[0].sender
    # K_{sender→ME}, known to both ends: a correctly authenticated share whose inner ids lie
    key = world.clients[ME].receive_keys[sender]
    plaintext = (sender + 1).to_bytes(4, "big") + ME.to_bytes(4, "big") + shamir.encode_share(1) * 2
    forged = encrypt_share(
        key,
        session_id=world.ctx.session_id,
        sender=sender,
        receiver=ME,
        plaintext=plaintext,
        nonce=b"n" * 12,
    )
    bad = (EncryptedShare(sender, ME, forged), *request.shares[1:])
    _aborted(world, ME, dataclasses.replace(request, shares=bad), "names")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: (*s, s[0]), "two shares"),
        (lambda s: (*s[1:], dataclasses.replace(s[0], sender=ME)), "not a listed"),
        (lambda s: s[:1], "only 1 neighbours"),
    ],
    ids=["duplicate", "from-itself", "too-few"],
)
def test_bad_share_sets_abort(world: Any, edit: Callable, match: str) -> None:  # type: ignore[type-arg]
    request = _masked_request(world)
    _aborted(world, ME, dataclasses.replace(request, shares=edit(request.shares)), match)


def test_input_is_required_and_checked(make_world: Callable[..., Any]) -> None:
    world = make_world()
    world.clients[ME] = client.new_client(job_id="job", round=1, rng=world.rng.child("c0"))
    request = _masked_request(world)
    _aborted(world, ME, request, "no input")
    with pytest.raises(ParameterError, match="expected 6"):
        client.with_input(world.clients[ME], np.zeros(5, dtype=np.int64))
    with pytest.raises(ParameterError, match="integers"):
        client.with_input(world.clients[ME], np.zeros(6))
    with pytest.raises(ParameterError, match="outside"):
        client.with_input(world.clients[ME], np.full(6, 1 << 16))


def test_private_keys_are_dropped_after_masking(world: Any) -> None:
    world.advance(3)
    state = world.clients[ME]
    assert isinstance(state, ClientMaskedInputSent)
    assert not any("key" in f.name for f in dataclasses.fields(state))
    with pytest.raises(WrongStage):
        client.with_input(state, np.zeros(6, dtype=np.int64))


# -- stage 4: the unmask request -------------------------------------------------------------------


def _unmask_state(world: Any) -> tuple[ClientMaskedInputSent, UnmaskRequest]:
    world.advance(3)
    state = world.clients[ME]
    request = world.requests[ME]
    assert isinstance(state, ClientMaskedInputSent)
    assert isinstance(request, UnmaskRequest)
    return state, request


def test_honest_unmask_request_is_answered_once(world: Any) -> None:
    state, request = _unmask_state(world)
    new, reply = client.step(state, request)
    assert isinstance(new, ClientFinished)
    assert reply is not None
    assert {s.owner for s in reply.shares} == set(request.alive) | set(request.dropped)
    with pytest.raises(DuplicateMessage):
        client.step(new, request)
    with pytest.raises(DuplicateMessage):  # even with other sets: never a second answer
        client.step(new, dataclasses.replace(request, alive=request.alive[:3]))


def _unmask(
    state: ClientMaskedInputSent,
    request: UnmaskRequest,
    alive: tuple[int, ...],
    dropped: tuple[int, ...],
    match: str,
) -> None:
    message = dataclasses.replace(request, alive=alive, dropped=dropped)
    new, reply = client.step(state, message)
    assert reply is None
    assert isinstance(new, ClientAborted)
    assert match in new.reason, new.reason


def test_overlapping_alive_and_dropped(world: Any) -> None:
    state, request = _unmask_state(world)
    other = next(a for a in request.alive if a != ME)
    _unmask(state, request, request.alive, (other,), "both alive and dropped")


def test_itself_listed_as_dropped(world: Any) -> None:
    state, request = _unmask_state(world)
    alive = tuple(a for a in request.alive if a != ME)
    _unmask(state, request, alive, (ME,), "does not list this client as alive")


def test_non_neighbour_listed(world: Any) -> None:
    state, request = _unmask_state(world)
    stranger = next(j for j in range(7) if j not in state.listed)
    _unmask(state, request, (*request.alive, stranger), (), "did not share")


def test_duplicates_listed(world: Any) -> None:
    state, request = _unmask_state(world)
    _unmask(state, request, (*request.alive, request.alive[0]), (), "twice")


def test_too_few_alive(world: Any) -> None:
    state, request = _unmask_state(world)
    _unmask(state, request, (ME, next(a for a in request.alive if a != ME)), (), "t=3")


def test_already_dead_client_cannot_be_dropped(make_world: Callable[..., Any]) -> None:
    world = make_world()
    world.advance(1)
    listed = [p.index for p in world.requests[ME].peers if p.index != ME]  # type: ignore[union-attr]
    dead = listed[0]
    world.advance(1, skip=[dead])  # dead never shares keys: it is listed but sends ME nothing
    world.advance(1)
    state = world.clients[ME]
    assert isinstance(state, ClientMaskedInputSent)
    assert dead in state.listed
    assert dead not in state.senders
    request = world.requests[ME]
    assert isinstance(request, UnmaskRequest)
    assert dead not in request.dropped  # the honest server does not ask
    new, reply = client.step(state, dataclasses.replace(request, dropped=(dead,)))
    assert reply is None
    assert isinstance(new, ClientAborted)
    assert "already dead" in new.reason


def test_aborted_client_answers_nothing(world: Any) -> None:
    world.advance(1)
    state = _aborted(world, ME, _with_peers(world, _peers(world)[:2]), "at least")
    with pytest.raises(WrongStage, match="left the round"):
        client.step(state, world.requests[ME])


def test_header_for_other_job_round() -> None:
    state = client.new_client(job_id="j", round=1)
    with pytest.raises(ParameterError):
        client.new_client(job_id="j", round=-1)
    message = AdvertiseKeysRequest(
        header=RoundHeader("j", 2, Stage.ADVERTISE_KEYS, b"s" * 32), setup=None
    )  # type: ignore[arg-type]
    with pytest.raises(StaleMessage):
        client.step(state, message)


def test_signed_inputs_given_before_the_setup(make_world: Callable[..., Any]) -> None:
    world = make_world()
    signed = [np.array([-1, -2, 3, 0, -(2**15), 2**16 - 1], dtype=np.int64)] * 7
    for i in range(7):
        world.clients[i] = client.new_client(
            job_id="job", round=1, rng=world.rng.child(f"c{i}"), input=signed[i]
        )
    world.advance(4)
    expected = (7 * signed[0]) % (1 << 16)
    assert world.server.aggregate.tolist() == expected.tolist()
