"""The malicious-secure variant (docs/secagg.md#the-malicious-secure-variant): every attack is
scripted by tampering the coordinator's messages or its own state, and an honest agent must refuse
it with a ``ClientAborted`` naming the check."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from support.peer_pki import NOW, TestCA

from dpfl.secagg import RoundParameters, SeededRandomSource, SimulationAborted, client, server
from dpfl.secagg import signed as sg
from dpfl.secagg.client_states import (
    ClientAborted,
    ClientAwaitingConsistency,
    ClientConsistencySigned,
    ClientKeysAdvertised,
    ClientMaskedInputSent,
    ClientSharesSent,
    ClientState,
)
from dpfl.secagg.errors import DuplicateMessage, ProtocolViolation, WrongStage
from dpfl.secagg.graph import NeighbourGraph
from dpfl.secagg.identity import ClientIdentity, IdentityError, Signer
from dpfl.secagg.messages import (
    AdvertiseKeysRequest,
    AdvertiseKeysResponse,
    Attestation,
    ConsistencyRequest,
    ConsistencyResponse,
    PeerKeys,
    RosterEntry,
    ShareKeysRequest,
    ShareKind,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
)
from dpfl.secagg.parameters import ThreatModel
from dpfl.secagg.primitives import keypair_from_private
from dpfl.secagg.server_states import (
    ServerCollectingConsistency,
    ServerCollectingKeys,
    ServerCollectingShares,
    ServerReadyToUnmask,
)
from dpfl.secagg.simulate import simulate

MAL = ThreatModel.MALICIOUS
N, K, T = 9, 4, 4  # sparse: each agent has 5 neighbours, itself included


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA.make()


@pytest.fixture(scope="module")
def signers(ca: TestCA) -> list[Signer]:
    return [ca.signer(f"silo-{i}") for i in range(N)]


def _identities(
    ca: TestCA, signers: list[Signer], c: int = 1, n: int = N
) -> list[ClientIdentity | None]:
    return [ClientIdentity(signers[i], ca.authority(), c, NOW) for i in range(n)]


@pytest.fixture
def world(make_world: Callable[..., Any], ca: TestCA, signers: list[Signer]) -> Any:
    return make_world(
        n=N,
        k=K,
        t=T,
        min_survivors=6,
        threat_model=MAL,
        identities=_identities(ca, signers),
    )


def _step_all(
    world: Any, requests: Mapping[int, Any], skip: tuple[int, ...] = ()
) -> dict[int, tuple[ClientState, Any]]:
    """Each agent's answer to its request (the server's own slots in ``skip`` answer nothing)."""
    out = {}
    for i, request in sorted(requests.items()):
        if i not in skip:
            out[i] = client.step(world.clients[i], request)
    return out


def _reason(result: tuple[ClientState, Any]) -> str:
    state, reply = result
    assert reply is None, "the agent answered a request it had to refuse"
    assert isinstance(state, ClientAborted), state
    return state.reason


def _forged(
    world: Any, j: int, signer: Signer, setup: Any = None, session: bytes | None = None
) -> AdvertiseKeysResponse:
    """An advertisement for index j with fresh keys, signed by ``signer`` (held by the server)."""
    enc, mask = keypair_from_private(os.urandom(32)), keypair_from_private(os.urandom(32))
    digest = sg.setup_digest(setup or world.setups[j])
    signature = signer.sign(
        sg.advertisement_message(
            session_id=session or world.ctx.session_id,
            index=j,
            encryption_key=enc.public,
            masking_key=mask.public,
            setup=digest,
        )
    )
    return AdvertiseKeysResponse(
        world.ctx.header(Stage.ADVERTISE_KEYS),
        enc.public,
        mask.public,
        signature,
        signer.certificate_der,
    )


def _inject(world: Any, j: int, reply: AdvertiseKeysResponse) -> None:
    """The server puts an advertisement of its choice into its own state (no checks)."""
    state = world.server
    assert isinstance(state, ServerCollectingKeys)
    keys = dict(state.keys)
    keys[j] = (reply.encryption_public_key, reply.masking_public_key)
    adverts = dict(state.adverts)
    adverts[j] = (reply.signature, reply.certificate, sg.certificate_key_id(reply.certificate))
    world.server = dataclasses.replace(state, keys=keys, adverts=adverts)


def _advertise(world: Any, skip: tuple[int, ...] = ()) -> None:
    world.setups = {i: r.setup for i, r in world.requests.items()}
    world.answer(skip=skip)


def _share_requests(
    state: ServerCollectingKeys, roster: tuple[RosterEntry, ...], graph: NeighbourGraph
) -> dict[int, ShareKeysRequest]:
    """What a server that builds the neighbour lists from ``graph`` and sends ``roster`` sends."""
    header = state.ctx.header(Stage.SHARE_KEYS)
    out = {}
    for i in sorted(state.keys):
        peers = tuple(
            PeerKeys(j, *state.keys[j], state.adverts[j][0], state.adverts[j][1])
            for j in graph.neighbours(i)
            if j in state.keys
        )
        out[i] = ShareKeysRequest(header, peers, roster)
    return out


def _roster(state: ServerCollectingKeys) -> tuple[RosterEntry, ...]:
    return tuple(
        RosterEntry(
            j,
            sg.roster_digest(
                index=j,
                encryption_key=state.keys[j][0],
                masking_key=state.keys[j][1],
                key_id=state.adverts[j][2],
            ),
        )
        for j in sorted(state.keys)
    )


def _stage2_verdicts(world: Any, target: int, match: str) -> None:
    """Every honest neighbour of ``target`` refuses naming ``match``; the others go on."""
    graph = world.server.ctx.graph
    results = _step_all(world, world.requests, skip=(target,))
    assert any(target in graph.neighbours(i) for i in results if i != target)
    for i, result in results.items():
        if i == target:
            continue
        if target in graph.neighbours(i):
            assert match in _reason(result), (i, _reason(result))
        else:
            assert isinstance(result[0], ClientSharesSent), (i, result[0])


# -- stage 0/1: who takes part ------------------------------------------------------------------


def test_a_malicious_setup_to_an_agent_without_identity_is_refused(
    make_world: Callable[..., Any],
) -> None:
    world = make_world(n=N, k=K, t=T, min_survivors=6, threat_model=MAL)
    state, reply = client.step(world.clients[0], world.requests[0])
    assert reply is None
    assert isinstance(state, ClientAborted)
    assert "malicious-secure setup refused" in state.reason
    assert "no peer identity" in state.reason


def test_an_unknown_threat_model_is_refused(world: Any) -> None:
    request = world.requests[0]
    bad = dataclasses.replace(
        request, setup=dataclasses.replace(request.setup, threat_model="paranoid")
    )
    assert "unknown threat model 'paranoid'" in _reason(client.step(world.clients[0], bad))


def test_an_identity_with_a_semi_honest_setup_runs_the_plain_protocol(
    make_world: Callable[..., Any], ca: TestCA, signers: list[Signer]
) -> None:
    world = make_world(n=N, k=K, t=T, min_survivors=6, identities=_identities(ca, signers))
    world.answer()
    assert all(r.signature == b"" and r.certificate == b"" for r in world.replies.values())
    world.close()
    world.advance(1)
    assert all(isinstance(s, ClientSharesSent) for s in world.clients.values())
    assert client.verified_noise_shares(world.clients[0]) == 1
    world.advance(2)
    assert np.array_equal(world.server.aggregate, world.expected_sum(range(N)))


def test_an_advertisement_is_signed_and_certified(world: Any, signers: list[Signer]) -> None:
    setups = {i: r.setup for i, r in world.requests.items()}
    world.answer()
    for i, reply in world.replies.items():
        assert reply.certificate == signers[i].certificate_der
        signers[i].identity.verify(
            sg.advertisement_message(
                session_id=world.ctx.session_id,
                index=i,
                encryption_key=reply.encryption_public_key,
                masking_key=reply.masking_public_key,
                setup=sg.setup_digest(setups[i]),
            ),
            reply.signature,
            what="advertisement",
        )


# -- stage 2: certificates, identities, signatures -----------------------------------------------


def test_an_uncertified_peer_is_refused(world: Any) -> None:
    coordinator_ca = TestCA.make("coordinator CA")
    sybil = coordinator_ca.signer("sybil-1")
    _advertise(world, skip=(4,))
    _inject(world, 4, _forged(world, 4, sybil))
    world.close()
    _stage2_verdicts(world, 4, "uncertified peer 4")
    results = _step_all(world, world.requests, skip=(4,))
    assert "not issued by the federation CA" in _reason(
        next(r for i, r in results.items() if 4 in world.server.ctx.graph.neighbours(i) and i != 4)
    )


def test_two_peers_with_one_certificate_are_refused(world: Any, ca: TestCA) -> None:
    colluder = ca.signer("colluder")  # a certified peer that works with the server
    _advertise(world, skip=(2, 6))
    _inject(world, 2, _forged(world, 2, colluder))
    _inject(world, 6, _forged(world, 6, colluder))
    world.close()
    graph = world.server.ctx.graph
    results = _step_all(world, world.requests, skip=(2, 6))
    both = [i for i in results if {2, 6} <= set(graph.neighbours(i)) and i not in (2, 6)]
    assert both
    for i in both:
        assert "duplicate identity: peers 2 and 6 have one certificate" in _reason(results[i])


def test_two_certificates_of_one_key_are_one_peer(world: Any, ca: TestCA) -> None:
    """A re-issued (or re-encoded) certificate of the same key is not a second peer."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    first = Signer(*ca.issue("twin-a", key=key), authority=ca.authority(), now=NOW)
    second = Signer(*ca.issue("twin-b", key=key), authority=ca.authority(), now=NOW)
    _advertise(world, skip=(2, 6))
    _inject(world, 2, _forged(world, 2, first))
    _inject(world, 6, _forged(world, 6, second))
    world.close()
    graph = world.server.ctx.graph
    results = _step_all(world, world.requests, skip=(2, 6))
    both = [i for i in results if {2, 6} <= set(graph.neighbours(i)) and i not in (2, 6)]
    assert both
    for i in both:
        assert "duplicate identity: peers 2 and 6 have one signing key" in _reason(results[i])


def test_a_substituted_key_fails_the_signature(world: Any) -> None:
    _advertise(world)
    state = world.server
    keys = dict(state.keys)
    keys[3] = (keypair_from_private(os.urandom(32)).public, keys[3][1])
    world.server = dataclasses.replace(state, keys=keys)  # the roster and graph follow the new key
    world.close()
    results = _step_all(world, world.requests)
    assert "own entry does not carry own public keys" in _reason(results[3])
    graph = world.server.ctx.graph
    for i in results:
        if i != 3 and 3 in graph.neighbours(i):
            assert "bad signature on the advertisement of peer 3" in _reason(results[i])


def test_a_key_replayed_from_another_round_fails_the_signature(
    make_world: Callable[..., Any], ca: TestCA, signers: list[Signer]
) -> None:
    identities = _identities(ca, signers)
    old = make_world(n=N, k=K, t=T, min_survivors=6, threat_model=MAL, identities=identities)
    old.answer()
    replayed = old.replies[5]
    new = make_world(
        n=N, k=K, t=T, min_survivors=6, threat_model=MAL, identities=identities, round=2
    )
    _advertise(new, skip=(5,))
    _inject(new, 5, replayed)  # signed by silo-5 itself, over round 1's session
    new.close()
    _stage2_verdicts(new, 5, "bad signature on the advertisement of peer 5")


def test_an_advertisement_signed_over_another_setup_is_refused(world: Any) -> None:
    """The server tells agent 1 about less noise than the others: the setup digests differ."""
    request = world.requests[1]
    assert isinstance(request, AdvertiseKeysRequest)
    cheaper = dataclasses.replace(
        request, setup=dataclasses.replace(request.setup, encoding_json='{"noise": "less"}')
    )
    world.answer(tamper=lambda i, r: cheaper if i == 1 else r)
    world.close()
    results = _step_all(world, world.requests)
    graph = world.server.ctx.graph
    others = [j for j in graph.neighbours(1) if j != 1]
    assert f"bad signature on the advertisement of peer {others[0]}" in _reason(results[1])
    for i in results:
        if i != 1 and 1 in graph.neighbours(i):
            assert "bad signature on the advertisement of peer 1" in _reason(results[i])


# -- stage 2: the graph is fixed by the roster -----------------------------------------------------


def test_a_graph_chosen_after_the_keys_is_refused(world: Any) -> None:
    _advertise(world)
    keys_state = world.server
    roster = _roster(keys_state)
    world.close()
    assert [e.index for e in world.requests[0].roster] == list(range(N))
    assert world.requests[0].roster == roster
    for attempt in range(50):  # another graph, in which agent 0 has other neighbours
        other = sg.seeded_graph(N, K, bytes([attempt]) * 32)
        if set(other.neighbours(0)) != set(world.server.ctx.graph.neighbours(0)):
            break
    chosen = _share_requests(keys_state, roster, other)[0]
    assert "wrong neighbours for the seeded graph" in _reason(client.step(world.clients[0], chosen))
    honest = client.step(world.clients[0], world.requests[0])
    assert isinstance(honest[0], ClientSharesSent)


def test_a_tampered_roster_entry_is_refused(world: Any) -> None:
    _advertise(world)
    keys_state = world.server
    roster = list(_roster(keys_state))
    roster[7] = RosterEntry(7, bytes(32))
    tampered = tuple(roster)
    # the server derives the graph from its tampered roster, so the neighbour lists fit it
    graph = sg.seeded_graph(N, K, sg.graph_seed(keys_state.ctx.session_id, tampered))
    requests = _share_requests(keys_state, tampered, graph)
    results = _step_all(world, requests)
    for i, result in results.items():
        if 7 in graph.neighbours(i):
            assert "roster entry of peer 7 does not match its advertisement" in _reason(result)
        else:
            assert isinstance(result[0], ClientSharesSent)
    # the same tampered roster with the honest neighbour lists: an agent whose list does not fit
    # the tampered roster's graph refuses it; one whose list happens to fit checks the entries
    # of its neighbours, so it refuses when 7 is one and answers otherwise
    honest = sg.seeded_graph(N, K, sg.graph_seed(keys_state.ctx.session_id, _roster(keys_state)))
    world.close()
    results = _step_all(
        world, {i: dataclasses.replace(r, roster=tampered) for i, r in world.requests.items()}
    )
    for i, result in results.items():
        if set(honest.neighbours(i)) != set(graph.neighbours(i)):
            assert "wrong neighbours for the seeded graph" in _reason(result)
        elif 7 in graph.neighbours(i):
            assert "roster entry of peer 7 does not match its advertisement" in _reason(result)
        else:
            assert isinstance(result[0], ClientSharesSent)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda r: (), "without a roster"),
        (lambda r: r[::-1], "strictly increasing"),
        (lambda r: r[:5], "fewer than min_survivors=6"),
        (lambda r: tuple(e for e in r if e.index != 0), "missing from the roster"),
        (lambda r: (*r[:-1], dataclasses.replace(r[-1], digest=b"x")), "not 32 bytes"),
    ],
    ids=["empty", "order", "short", "self-missing", "digest-size"],
)
def test_malformed_rosters_are_refused(world: Any, edit: Callable, match: str) -> None:  # type: ignore[type-arg]
    world.advance(1)
    request = world.requests[0]
    bad = dataclasses.replace(request, roster=edit(request.roster))
    assert match in _reason(client.step(world.clients[0], bad))


def test_the_own_entry_must_carry_the_own_certificate(world: Any, ca: TestCA) -> None:
    world.advance(1)
    request = world.requests[0]
    other = ca.signer("someone-else").certificate_der
    peers = tuple(
        dataclasses.replace(p, certificate=other) if p.index == 0 else p for p in request.peers
    )
    reason = _reason(client.step(world.clients[0], dataclasses.replace(request, peers=peers)))
    assert "own entry does not carry own peer certificate" in reason


# -- the consistency round and stage 4 -------------------------------------------------------------


def _to_consistency(world: Any) -> None:
    world.advance(3)
    assert isinstance(world.server, ServerCollectingConsistency)
    assert all(isinstance(r, ConsistencyRequest) for r in world.requests.values())


def test_the_survivor_set_is_signed_once(world: Any, signers: list[Signer]) -> None:
    _to_consistency(world)
    request = world.requests[0]
    assert request.survivors == tuple(range(N))
    state, reply = client.step(world.clients[0], request)
    assert isinstance(state, ClientConsistencySigned)
    assert isinstance(reply, ConsistencyResponse)
    signers[0].identity.verify(
        sg.consistency_message(
            session_id=world.ctx.session_id, index=0, survivors=sg.survivors_digest(range(N))
        ),
        reply.signature,
        what="consistency",
    )
    other = dataclasses.replace(request, survivors=tuple(range(1, N)))
    with pytest.raises(DuplicateMessage):
        client.step(state, other)


@pytest.mark.parametrize(
    ("survivors", "match"),
    [
        (tuple(range(1, N)), "not in S"),
        ((0, 1, 2), "fewer than min_survivors=6"),
        ((0, 0, 1, 2, 3, 4, 5), "twice"),
    ],
    ids=["dropped-agent", "too-small", "duplicate"],
)
def test_a_bad_survivor_set_is_not_signed(
    world: Any, survivors: tuple[int, ...], match: str
) -> None:
    _to_consistency(world)
    request = dataclasses.replace(world.requests[0], survivors=survivors)
    assert match in _reason(client.step(world.clients[0], request))


def test_stages_come_in_order(world: Any, make_world: Callable[..., Any]) -> None:
    _to_consistency(world)
    early = UnmaskRequest(world.ctx.header(Stage.UNMASK), (0,), ())
    with pytest.raises(WrongStage, match="expecting CONSISTENCY"):
        client.step(world.clients[0], early)
    assert isinstance(world.clients[0], ClientAwaitingConsistency)
    plain = make_world()
    plain.advance(3)
    assert isinstance(plain.clients[0], ClientMaskedInputSent)
    consistency = ConsistencyRequest(plain.ctx.header(Stage.CONSISTENCY), tuple(range(7)))
    with pytest.raises(WrongStage, match="not malicious-secure"):
        client.step(plain.clients[0], consistency)


def _to_unmask(world: Any) -> None:
    _to_consistency(world)
    world.advance(1)
    assert all(isinstance(r, UnmaskRequest) for r in world.requests.values())


def test_an_unmask_request_for_another_survivor_set_is_refused(world: Any) -> None:
    _to_unmask(world)
    request = world.requests[0]
    assert request.survivors == tuple(range(N))
    assert {a.index for a in request.attestations} == set(world.server.ctx.graph.neighbours(0))
    smaller = dataclasses.replace(request, survivors=tuple(range(N - 1)))
    assert "inconsistent survivor set" in _reason(client.step(world.clients[0], smaller))


def test_alive_and_dropped_must_follow_the_attested_set(world: Any) -> None:
    """The selectively dropped agent: its neighbour is told it dropped although S holds it."""
    _to_unmask(world)
    request = world.requests[0]
    victim = next(a for a in request.alive if a != 0)
    told_dead = dataclasses.replace(
        request,
        alive=tuple(a for a in request.alive if a != victim),
        dropped=(*request.dropped, victim),
    )
    reason = _reason(client.step(world.clients[0], told_dead))
    assert "alive does not match the attested survivor set" in reason
    extra_dropped = dataclasses.replace(request, dropped=(*request.dropped, victim))
    reason = _reason(client.step(world.clients[0], extra_dropped))
    assert "both alive and dropped" in reason or "does not match" in reason


def test_too_few_attestations(world: Any) -> None:
    _to_unmask(world)
    request = world.requests[0]
    others = tuple(a for a in request.attestations if a.index != 0)
    few = dataclasses.replace(request, attestations=others[: T - 2])
    assert "too few attestations: 3 neighbours" in _reason(client.step(world.clients[0], few))
    junk = dataclasses.replace(
        request, attestations=tuple(Attestation(a.index, b"\x30\x00") for a in others)
    )
    reason = _reason(client.step(world.clients[0], junk))
    assert "too few attestations: 1 neighbours" in reason
    assert "do not verify" in reason
    foreign = dataclasses.replace(
        request,
        attestations=(
            *request.attestations,
            Attestation(next(j for j in range(N) if j not in request.alive), b"sig"),
        ),
    )
    assert "not a neighbour" in _reason(client.step(world.clients[0], foreign))
    _, reply = client.step(world.clients[0], request)  # the honest request is answered
    assert isinstance(reply, UnmaskResponse)


def test_inconsistent_survivor_sets_cannot_reveal_both_secrets(world: Any) -> None:
    """Half the agents are asked to sign S1 = A3, half S2 = A3 \\ {x}: an agent reveals shares
    only with t signatures on its own set, so x's b and s are never both rebuildable."""
    _to_consistency(world)
    graph = world.server.ctx.graph
    a3 = tuple(range(N))
    group1 = set(a3[: N // 2 + 1])
    x = 0
    s2 = tuple(i for i in a3 if i != x)
    world.answer(tamper=lambda i, r: r if i in group1 else dataclasses.replace(r, survivors=s2))
    world.close()
    assert isinstance(world.server, type(world.server))
    requests = {}
    for j, request in world.requests.items():
        if j in group1:
            requests[j] = request
            continue
        hood = graph.neighbours(j)
        requests[j] = dataclasses.replace(
            request,
            survivors=s2,
            alive=tuple(i for i in hood if i in s2),
            dropped=tuple(i for i in hood if i == x),
            attestations=tuple(a for a in request.attestations if a.index in s2),
        )
    results = _step_all(world, requests)
    b_shares = s_shares = 0
    for j, (state, reply) in results.items():
        same = sum(1 for i in graph.neighbours(j) if (i in group1) == (j in group1))
        if same < T:
            assert isinstance(state, ClientAborted), (j, state)
            assert "too few attestations" in state.reason
            continue
        assert isinstance(reply, UnmaskResponse), (j, state)
        for share in reply.shares:
            if share.owner == x:
                b_shares += share.kind is ShareKind.SELF_MASK_SEED
                s_shares += share.kind is ShareKind.MASKING_KEY
    assert any(isinstance(s, ClientAborted) for s, _ in results.values())
    assert not (b_shares >= T and s_shares >= T)


# -- the server -----------------------------------------------------------------------------------


def test_the_server_checks_the_structure_of_what_it_relays(world: Any) -> None:
    setups = {i: r.setup for i, r in world.requests.items()}
    replies = {i: client.step(world.clients[i], r)[1] for i, r in world.requests.items()}
    state = world.server
    reply = replies[0]
    for bad, match in (
        (dataclasses.replace(reply, signature=b""), "signature has 1 to 72 bytes"),
        (dataclasses.replace(reply, signature=b"s" * 73), "signature has 1 to 72 bytes"),
        (dataclasses.replace(reply, certificate=b""), "no certificate"),
        (dataclasses.replace(reply, certificate=b"not der"), "not a DER X.509"),
    ):
        with pytest.raises(ProtocolViolation, match=match):
            server.receive(state, 0, bad)
    state = server.receive(state, 0, reply)
    copy = dataclasses.replace(
        replies[1], certificate=reply.certificate, signature=replies[1].signature
    )
    with pytest.raises(ProtocolViolation, match="certificate key of another advertisement"):
        server.receive(state, 1, copy)
    assert setups  # the setups all announce the malicious variant
    assert {s.threat_model for s in setups.values()} == {"malicious"}


def test_the_server_derives_the_graph_only_from_the_roster(world: Any) -> None:
    assert world.server.ctx.graph_or_none is None
    with pytest.raises(WrongStage, match="fixed by the roster"):
        _ = world.server.ctx.graph
    _advertise(world)
    roster = _roster(world.server)
    world.close()
    assert isinstance(world.server, ServerCollectingShares)
    expected = sg.seeded_graph(N, K, sg.graph_seed(world.ctx.session_id, roster))
    assert world.server.ctx.graph.order == expected.order
    for i in range(N):
        assert sg.seeded_neighbours(N, K, sg.graph_seed(world.ctx.session_id, roster), i) == (
            expected.neighbours(i)
        )


def test_consistency_comes_before_the_ledger_hook(world: Any) -> None:
    world.advance(2)
    world.answer()
    state, out = server.close_stage(world.server)
    assert isinstance(state, ServerCollectingConsistency)
    assert {o.recipient for o in out} == set(range(N))
    replies = {o.recipient: client.step(world.clients[o.recipient], o.message) for o in out}
    with pytest.raises(ProtocolViolation, match="signature has 1 to 72"):
        server.receive(state, 0, dataclasses.replace(replies[0][1], signature=b""))
    for i in range(N - 1):  # agent N-1 never attests: it is summed but not asked to unmask
        state = server.receive(state, i, replies[i][1])
    with pytest.raises(DuplicateMessage):
        server.receive(state, 0, replies[0][1])
    ready, none = server.close_stage(state)
    assert none == ()
    assert isinstance(ready, ServerReadyToUnmask)
    assert ready.survivors.attested == frozenset(range(N - 1))
    collecting, requests = server.begin_unmask(ready)
    assert {o.recipient for o in requests} == set(range(N - 1))
    assert collecting.pending == frozenset(range(N - 1))


# -- the noise the agent can count on -------------------------------------------------------------


@pytest.mark.parametrize(("c", "expected"), [(0, T), (1, T - 1), (2, T - 2), (3, 1), (9, 1)])
def test_verified_noise_shares(
    make_world: Callable[..., Any], ca: TestCA, signers: list[Signer], c: int, expected: int
) -> None:
    """t − c once stage 2 verified, while 2t > k + 1 + c (here 8 > 5 + c: c ≤ 2); 1 otherwise."""
    world = make_world(
        n=N, k=K, t=T, min_survivors=6, threat_model=MAL, identities=_identities(ca, signers, c)
    )
    world.answer()
    assert isinstance(world.clients[0], ClientKeysAdvertised)
    assert client.verified_noise_shares(world.clients[0]) == 1  # nothing verified yet
    world.close()
    world.advance(1)
    assert client.verified_noise_shares(world.clients[0]) == expected
    world.advance(3)
    assert client.verified_noise_shares(world.clients[0]) == expected  # ClientFinished
    aborted = ClientAborted("job", 1, Stage.UNMASK, "x")
    assert client.verified_noise_shares(aborted) == 1


def test_a_client_identity_is_checked(ca: TestCA, signers: list[Signer]) -> None:
    with pytest.raises(IdentityError, match="max_colluding_peers"):
        ClientIdentity(signers[0], ca.authority(), -1, NOW)
    with pytest.raises(IdentityError, match="not issued by the federation CA"):
        ClientIdentity(signers[0], TestCA.make("other").authority(), 0, NOW)


# -- honest rounds --------------------------------------------------------------------------------


def _vectors(n: int, m: int, seed: int) -> list[np.ndarray]:
    gen = np.random.default_rng(seed)  # test data only
    return [gen.integers(0, 1 << 20, m, dtype=np.uint64) for _ in range(n)]


@pytest.mark.parametrize(
    "dropouts",
    [
        {},
        {Stage.ADVERTISE_KEYS: [0], Stage.SHARE_KEYS: [1], Stage.MASKED_INPUT: [2]},
        {Stage.SHARE_KEYS: [3], Stage.CONSISTENCY: [4], Stage.UNMASK: [5]},
    ],
    ids=["all", "before-masking", "after-masking"],
)
def test_an_honest_malicious_round_sums_like_the_semi_honest_one(
    ca: TestCA, dropouts: dict[Stage, list[int]]
) -> None:
    n, m = 16, 5
    params = RoundParameters(
        num_clients=n, degree=8, threshold=6, ring_bits=24, vector_length=m, min_survivors=12
    )
    vectors = _vectors(n, m, 3)
    pool = [ca.signer(f"agent-{i}") for i in range(n)]
    identities = [ClientIdentity(s, ca.authority(), 1, NOW) for s in pool]
    result = simulate(
        vectors,
        params=params,
        rng=SeededRandomSource(b"malicious-honest"),
        threat_model=MAL,
        identities=identities,
        dropouts=dropouts,
    )
    assert result.client_aborts == {}
    assert result.rejected == {}
    gone_before = {
        i
        for s, ids in dropouts.items()
        if s in (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT)
        for i in ids
    }
    a3 = frozenset(range(n)) - gone_before
    assert result.survivors.a3 == a3
    expected = sum((vectors[i] for i in a3), np.zeros(m, np.uint64)) % np.uint64(1 << 24)
    assert np.array_equal(result.aggregate, expected)
    plain_drops = {
        (Stage.UNMASK if s is Stage.CONSISTENCY else s): ids for s, ids in dropouts.items()
    }
    plain = simulate(
        vectors, params=params, rng=SeededRandomSource(b"semi-honest-run!"), dropouts=plain_drops
    )
    assert np.array_equal(plain.aggregate, result.aggregate)
    assert set(result.timings) == {
        Stage.ADVERTISE_KEYS,
        Stage.SHARE_KEYS,
        Stage.MASKED_INPUT,
        Stage.CONSISTENCY,
        Stage.UNMASK,
    }


def test_a_malicious_round_without_identities_aborts() -> None:
    params = RoundParameters(
        num_clients=5, degree=4, threshold=3, ring_bits=8, vector_length=2, min_survivors=4
    )
    with pytest.raises(SimulationAborted, match="advertised keys"):
        simulate(_vectors(5, 2, 1), params=params, threat_model=MAL)


def test_malicious_parameters_are_the_semi_malicious_ones() -> None:
    for n in (100, 1000):
        mal = RoundParameters.choose(num_clients=n, vector_length=1, ring_bits=32, model=MAL)
        semi = RoundParameters.choose(
            num_clients=n, vector_length=1, ring_bits=32, model=ThreatModel.SEMI_MALICIOUS
        )
        assert (mal.degree, mal.threshold) == (semi.degree, semi.threshold)
