"""Server-side rules (docs/secagg.md#the-protocol, #invariants-and-their-tests): what it accepts,
aborts on and asks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpfl.secagg import server, shamir
from dpfl.secagg.errors import (
    DuplicateMessage,
    InvalidKey,
    InvalidShare,
    ProtocolViolation,
    StaleMessage,
    WrongStage,
)
from dpfl.secagg.messages import (
    AdvertiseKeysResponse,
    MaskedInputResponse,
    ShareKeysResponse,
    ShareKind,
    Stage,
    UnmaskResponse,
    UnmaskShare,
)
from dpfl.secagg.server_states import (
    ServerAborted,
    ServerCollectingKeys,
    ServerCollectingUnmask,
    ServerCompleted,
    ServerReadyToUnmask,
)


def _answers(world: Any) -> dict[int, Any]:
    """Each client's reply to its pending request, without delivering them."""
    from dpfl.secagg import client

    out = {}
    for i, request in sorted(world.requests.items()):
        state, reply = client.step(world.clients[i], request)
        world.clients[i] = state
        out[i] = reply
    world.requests = {}
    return out


# -- receive ---------------------------------------------------------------------------------------


def test_header_checks(world: Any) -> None:
    replies = _answers(world)
    reply = replies[0]
    with pytest.raises(StaleMessage):
        server.receive(
            world.server,
            0,
            dataclasses.replace(reply, header=dataclasses.replace(reply.header, round=9)),
        )
    with pytest.raises(StaleMessage):
        server.receive(
            world.server,
            0,
            dataclasses.replace(
                reply, header=dataclasses.replace(reply.header, session_id=b"x" * 32)
            ),
        )
    with pytest.raises(WrongStage):
        server.receive(
            world.server,
            0,
            dataclasses.replace(
                reply, header=dataclasses.replace(reply.header, stage=Stage.UNMASK)
            ),
        )
    with pytest.raises(ProtocolViolation, match="outside"):
        server.receive(world.server, 7, reply)
    state = server.receive(world.server, 0, reply)
    with pytest.raises(DuplicateMessage):
        server.receive(state, 0, reply)
    assert isinstance(world.server, ServerCollectingKeys)
    assert 0 not in world.server.keys  # the refused messages changed nothing


def test_key_checks(world: Any) -> None:
    replies = _answers(world)
    state = server.receive(world.server, 0, replies[0])
    same = dataclasses.replace(replies[1], masking_public_key=replies[1].encryption_public_key)
    copied = dataclasses.replace(replies[1], encryption_public_key=replies[0].masking_public_key)
    low = dataclasses.replace(replies[1], masking_public_key=(1).to_bytes(32, "little"))
    for bad, match in ((same, "one key"), (copied, "already uses"), (low, "small order")):
        with pytest.raises(InvalidKey, match=match):
            server.receive(state, 1, bad)


def test_share_count_checks(world: Any) -> None:
    world.advance(1)
    replies = _answers(world)
    reply: ShareKeysResponse = replies[0]
    shares = reply.shares
    edits = {
        "sent no share": shares[1:],
        "two shares": (*shares[:-1], shares[0]),
        "labelled from": (dataclasses.replace(shares[0], sender=1), *shares[1:]),
        "non-neighbour": (dataclasses.replace(shares[0], receiver=0), *shares[1:]),
        "bytes": (
            dataclasses.replace(shares[0], ciphertext=shares[0].ciphertext[:-1]),
            *shares[1:],
        ),
    }
    for match, bad in edits.items():
        with pytest.raises(ProtocolViolation, match=match):
            server.receive(world.server, 0, dataclasses.replace(reply, shares=bad))
    server.receive(world.server, 0, reply)  # the original is fine


def test_masked_input_checks(world: Any) -> None:
    world.advance(2)
    reply: MaskedInputResponse = _answers(world)[0]
    for bad, match in (
        (reply.masked_input[:-1], "expected 6"),
        (np.full(6, 1 << 16, dtype=np.uint64), "fit"),
        (reply.masked_input.astype(np.float64), "integers"),
    ):
        with pytest.raises(ProtocolViolation, match=match):
            server.receive(world.server, 0, dataclasses.replace(reply, masked_input=bad))


def test_unmask_response_checks(world: Any) -> None:
    world.advance(3)
    reply: UnmaskResponse = _answers(world)[0]
    first = reply.shares[0]
    flipped_kind = (
        ShareKind.MASKING_KEY
        if first.kind is ShareKind.SELF_MASK_SEED
        else ShareKind.SELF_MASK_SEED
    )
    edits: dict[str, Any] = {
        "unrequested": (dataclasses.replace(first, kind=flipped_kind), *reply.shares[1:]),
        "left out": reply.shares[1:],
        "two shares": (*reply.shares, first),
    }
    for match, bad in edits.items():
        with pytest.raises(ProtocolViolation, match=match):
            server.receive(world.server, 0, dataclasses.replace(reply, shares=bad))
    with pytest.raises(InvalidShare):
        server.receive(
            world.server,
            0,
            dataclasses.replace(
                reply, shares=(dataclasses.replace(first, share=b"\xff" * 66), *reply.shares[1:])
            ),
        )


def test_unasked_sender_is_refused(world: Any) -> None:
    world.advance(1, skip=[3])  # 3 never advertised keys: not in A1
    uninvited = ShareKeysResponse(header=world.ctx.header(Stage.SHARE_KEYS), shares=())
    with pytest.raises(ProtocolViolation, match="not asked"):
        server.receive(world.server, 3, uninvited)


# -- aborts and survivor sets ---------------------------------------------------------------------


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_abort_below_min_survivors(make_world: Callable[..., Any], stage: int) -> None:
    world = make_world(min_survivors=6)
    world.advance(stage)
    world.answer(skip=[1, 2])
    world.close()
    assert isinstance(world.server, ServerAborted)
    assert "fewer than 6" in world.server.reason
    assert world.requests == {}  # nothing more is sent: all or nothing


def test_abort_before_unmask_when_a_secret_cannot_reach_t(make_world: Callable[..., Any]) -> None:
    world = make_world(n=9, k=2, t=3, min_survivors=3)  # every secret has only 3 holders
    world.advance(2)
    world.answer(skip=[5])
    state, out = server.close_stage(world.server)
    assert isinstance(state, ServerAborted)
    assert "live holders" in state.reason
    assert out == ()


def test_survivor_sets_and_counted_after_masking(make_world: Callable[..., Any]) -> None:
    world = make_world(n=12, k=6, t=3, min_survivors=5)
    world.advance(1, skip=[0])  # 0 never advertises: not in A1
    world.advance(1, skip=[1])  # 1 advertises but never shares: in A1 \ A2
    world.advance(1, skip=[2])  # 2 shares but never masks: in A2 \ A3, its s is rebuilt
    world.answer(skip=[3])  # 3 masked its input, then went silent: still counted
    world.close()
    done = world.server
    assert isinstance(done, ServerCompleted)
    s = done.survivors
    assert s.a1 == frozenset(range(1, 12))
    assert s.a2 == frozenset(range(2, 12))
    assert s.a3 == frozenset(range(3, 12))
    assert s.unmask == frozenset(range(4, 12))
    assert s.a1 >= s.a2 >= s.a3 >= s.unmask
    assert np.array_equal(done.aggregate, world.expected_sum(range(3, 12)))


def test_never_both_shares_of_one_client(make_world: Callable[..., Any]) -> None:
    world = make_world(n=12, k=6, t=3, min_survivors=5)
    world.advance(2, skip=[4])
    world.answer(skip=[7, 8])
    world.server, _ = server.close_stage(world.server)
    assert isinstance(world.server, ServerReadyToUnmask)
    unmasking, requests = server.begin_unmask(world.server)
    alive_asked = {a for o in requests for a in o.message.alive}  # type: ignore[union-attr]
    dropped_asked = {d for o in requests for d in o.message.dropped}  # type: ignore[union-attr]
    assert alive_asked & dropped_asked == set()
    assert alive_asked <= unmasking.a3
    assert dropped_asked == {7, 8}
    assert 4 not in alive_asked | dropped_asked  # dropped before sharing: nobody masked with it


def test_ledger_hook_comes_before_any_unmask_request(world: Any) -> None:
    world.advance(2)
    world.answer()
    ready, out = server.close_stage(world.server)
    assert isinstance(ready, ServerReadyToUnmask)
    assert out == ()  # closing the masked inputs sends nothing: commit the ledger now
    with pytest.raises(WrongStage):
        server.receive(ready, 0, world.replies[0])
    with pytest.raises(WrongStage):
        server.close_stage(ready)
    unmasking, requests = server.begin_unmask(ready)
    assert len(requests) == 7
    with pytest.raises(WrongStage):
        server.begin_unmask(unmasking)  # type: ignore[arg-type]


def test_unmask_is_all_or_nothing(make_world: Callable[..., Any]) -> None:
    world = make_world(n=9, k=4, t=4, min_survivors=5)
    world.advance(3)
    world.answer(skip=[0, 1, 2, 3, 4])  # too few shares for several secrets
    unmasking = world.server
    assert isinstance(unmasking, ServerCollectingUnmask)
    assert not unmasking.ready
    world.close()
    assert isinstance(world.server, ServerAborted)
    assert "shares, t=4" in world.server.reason
    assert not hasattr(world.server, "aggregate")


def test_ready_becomes_true_once_every_secret_has_t_shares(world: Any) -> None:
    world.advance(3)
    pending = sorted(world.requests)
    replies = _answers(world)
    state = world.server
    readiness = []
    for i in pending:
        state = server.receive(state, i, replies[i])
        readiness.append(state.ready)
    assert readiness[-1]
    assert not readiness[0]
    assert readiness == sorted(readiness)  # monotone


def _tamper_unmask(world: Any, kind: ShareKind, victim_holder: int) -> None:
    replies = _answers(world)
    reply = replies[victim_holder]
    shares = tuple(
        dataclasses.replace(
            s, share=shamir.encode_share((shamir.decode_share(s.share) + 1) % shamir.PRIME)
        )
        if s.kind is kind and s.owner != victim_holder
        else s
        for s in reply.shares
    )
    replies[victim_holder] = dataclasses.replace(reply, shares=shares)
    for i, r in sorted(replies.items()):
        world.server = server.receive(world.server, i, r)
    world.close()


def test_a_bad_masking_key_share_is_routed_around(make_world: Callable[..., Any]) -> None:
    world = make_world(n=10, k=8, t=3, min_survivors=5)
    world.advance(2)
    world.answer(skip=[9])
    world.close()
    holder = min(j for j in world.server.ctx.graph.neighbours(9) if j != 9)  # its share comes first
    _tamper_unmask(world, ShareKind.MASKING_KEY, holder)
    assert isinstance(world.server, ServerCompleted)  # pub(s_9) check rejects the first subset
    assert np.array_equal(world.server.aggregate, world.expected_sum(range(9)))


def test_inconsistent_self_mask_shares_abort(make_world: Callable[..., Any]) -> None:
    world = make_world(n=10, k=8, t=3, min_survivors=5)
    world.advance(3)
    _tamper_unmask(world, ShareKind.SELF_MASK_SEED, 0)
    assert isinstance(world.server, ServerAborted)
    assert "inconsistent" in world.server.reason


def test_nothing_to_close_after_the_end(world: Any) -> None:
    world.advance(4)
    assert isinstance(world.server, ServerCompleted)
    with pytest.raises(WrongStage):
        server.close_stage(world.server)
    with pytest.raises(WrongStage):
        server.receive(
            world.server, 0, AdvertiseKeysResponse(world.ctx.header(Stage.ADVERTISE_KEYS), b"", b"")
        )


def test_unmask_share_from_an_unknown_owner(world: Any) -> None:
    world.advance(3)
    reply = _answers(world)[0]
    extra = UnmaskShare(owner=99, kind=ShareKind.SELF_MASK_SEED, share=b"\x00" * 66)
    with pytest.raises(ProtocolViolation, match="unrequested"):
        server.receive(world.server, 0, dataclasses.replace(reply, shares=(*reply.shares, extra)))


def test_a_batch_accepts_exactly_what_single_messages_would(make_world: Callable[..., Any]) -> None:
    for stages in range(4):
        one, batch = make_world(), make_world()
        one.advance(stages)
        batch.advance(stages)
        replies = _answers(one)
        _answers(batch)
        items = sorted(replies.items())
        items.insert(2, items[0])  # a duplicate inside the batch
        state = one.server
        singles = []
        for i, r in items:
            try:
                state = server.receive(state, i, r)
            except ProtocolViolation as exc:
                singles.append((i, type(exc)))
        batched, refused = server.receive_many(batch.server, items)
        assert [(i, type(e)) for i, e in refused] == singles == [(items[0][0], DuplicateMessage)]
        assert batched.survivors == state.survivors
        assert batched.pending == state.pending
        if stages == 2:
            assert np.array_equal(batched.total, state.total)


def test_batches_after_the_end_are_refused(world: Any) -> None:
    world.advance(4)
    reply = AdvertiseKeysResponse(world.ctx.header(Stage.ADVERTISE_KEYS), b"", b"")
    state, refused = server.receive_many(world.server, [(0, reply), (1, reply)])
    assert state is world.server
    assert [type(e) for _, e in refused] == [WrongStage, WrongStage]


def test_masking_keys_that_fail_the_public_key_check_abort(make_world: Callable[..., Any]) -> None:
    """pub(s_d^SK) must equal s_d^PK: with every share of s_9 corrupted no subset passes."""
    world = make_world(n=10, k=8, t=3, min_survivors=5)
    world.advance(2)
    world.answer(skip=[9])
    world.close()
    replies = _answers(world)
    for i, reply in sorted(replies.items()):
        shares = tuple(
            dataclasses.replace(s, share=shamir.encode_share(12345 + i))
            if s.kind is ShareKind.MASKING_KEY
            else s
            for s in reply.shares
        )
        world.server = server.receive(world.server, i, dataclasses.replace(reply, shares=shares))
    world.close()
    assert isinstance(world.server, ServerAborted)
    assert "masking key of client 9" in world.server.reason


def test_unmask_shares_from_a_dropped_client_are_refused(make_world: Callable[..., Any]) -> None:
    world = make_world(n=10, k=8, t=3, min_survivors=5)
    world.advance(2)
    world.answer(skip=[9])  # 9 never sends its masked input: dead from stage 3 on
    world.close()
    stray = UnmaskResponse(world.ctx.header(Stage.UNMASK), shares=())
    with pytest.raises(ProtocolViolation, match="not asked"):
        server.receive(world.server, 9, stray)
