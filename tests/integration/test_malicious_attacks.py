"""Each deviation of the malicious-secure protocol, scripted as a real gRPC coordinator against
an unmodified agent (docs/secagg.md#the-malicious-secure-variant).

The scripted coordinator runs the real secure-aggregation server and five peers of its own that
follow the protocol with certificates of the federation CA; it rewrites the requests it sends the
real agent (``tamper``). The agent must notice, leave the round naming the check, and reveal
nothing the deviation was after: its input before stage 3, its shares before stage 4.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from support import peer_pki
from support.agent_kit import DIGITS, JOB, Setup, fedavg_job, federation, publish

from dpfl.client.policy import Policy
from dpfl.client.summation import PeerCredentials
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.secagg import ClientIdentity, ThreatModel
from dpfl.secagg import messages as sm
from dpfl.secagg.primitives import keypair_from_private

PEERS = 5  # the coordinator's protocol-following peers, certified by the federation CA
Tamper = Callable[[int, sm.ServerMessage], sm.ServerMessage]


def _setup() -> Setup:
    """DP-FedAvg on digits for 6 agents, with dropouts allowed (min_survivors < 6)."""
    alg = get_algorithm("dp-fedavg")
    base = fedavg_job()
    job = base.model_copy(
        update={
            "secagg": base.secagg.model_copy(
                update={"corrupt_fraction": 0.2, "dropout_fraction": 0.2}
            )
        }
    )
    plan = alg.plan(job, population=PEERS + 1, data=DIGITS)
    state = alg.bind(job, plan).initial_state(DIGITS)
    return Setup(alg, job, plan, state, alg.bind(job, plan).round_task(state, round_number=1))


def _attack(tmp_path: Path, *tampers: Tamper | None) -> tuple[list[Any], list[str], list[Any]]:
    """One round per tamper (None: an honest round); the agent's errors, events, ledger."""
    ca = peer_pki.TestCA.make()
    peers = [
        ClientIdentity(ca.signer(f"peer-{i}"), ca.authority(), 0, peer_pki.NOW)
        for i in range(PEERS)
    ]
    me = PeerCredentials(signer=ca.signer("silo-0"), authority=ca.authority())
    policy = Policy(max_epsilon_per_job=1e4, max_epsilon_total=1e4, min_noise_multiplier=0.0)

    async def main() -> tuple[list[Any], list[str], list[Any]]:
        setup = _setup()
        async with federation(tmp_path, "grpc", 1, policy=policy, peer=me) as (coord, agents):
            publish(coord, setup)
            reports = []
            for number, tamper in enumerate(tampers, start=1):
                reports.append(
                    await coord.run_round(
                        job_id=JOB,
                        round=number,
                        agents=[agents[0].agent_id],
                        algorithm=setup.algorithm,
                        job=setup.job,
                        plan=setup.plan,
                        task=setup.task,
                        sybils=PEERS,
                        threat_model=ThreatModel.MALICIOUS,
                        sybil_identities=peers,
                        tamper=tamper,
                        timeout=30.0,
                    )
                )
            errors = [e.message for e in reports[-1].errors.get("agent-0", [])]
            return errors, agents[0].kinds(), agents[0].ledger.entries()

    return asyncio.run(asyncio.wait_for(main(), 180))


def _on(kind: type, change: Callable[[Any], Any]) -> Tamper:
    def tamper(index: int, message: sm.ServerMessage) -> sm.ServerMessage:
        return change(message) if index == 0 and isinstance(message, kind) else message

    return tamper


def _other(peers: tuple[sm.PeerKeys, ...]) -> int:
    return next(i for i, p in enumerate(peers) if p.index != 0)


def _substitute_key(message: sm.ShareKeysRequest) -> sm.ShareKeysRequest:
    peers = list(message.peers)
    i = _other(message.peers)
    fresh = keypair_from_private(os.urandom(32)).public
    peers[i] = replace(peers[i], encryption_public_key=fresh)
    return replace(message, peers=tuple(peers))


def _drop_a_neighbour(message: sm.ShareKeysRequest) -> sm.ShareKeysRequest:
    i = _other(message.peers)
    return replace(message, peers=message.peers[:i] + message.peers[i + 1 :])


def _assert_left_before_sending(kinds: list[str], entries: list[Any]) -> None:
    assert "masked-input-sent" not in kinds, kinds
    assert "charged" not in kinds, kinds
    assert entries == []


def test_a_substituted_key_is_refused_before_the_input_leaves(tmp_path: Path) -> None:
    errors, kinds, entries = _attack(tmp_path, _on(sm.ShareKeysRequest, _substitute_key))
    assert any("does not verify" in m for m in errors), errors
    _assert_left_before_sending(kinds, entries)


def test_a_key_replayed_from_another_session_is_refused(tmp_path: Path) -> None:
    recorded: dict[int, sm.PeerKeys] = {}

    def record(message: sm.ShareKeysRequest) -> sm.ShareKeysRequest:
        for p in message.peers:
            recorded.setdefault(p.index, p)
        return message

    def replay(message: sm.ShareKeysRequest) -> sm.ShareKeysRequest:
        i = _other(message.peers)
        peers = list(message.peers)
        peers[i] = recorded[peers[i].index]  # its keys, signature and certificate of round 1
        return replace(message, peers=tuple(peers))

    errors, kinds, _ = _attack(
        tmp_path, _on(sm.ShareKeysRequest, record), _on(sm.ShareKeysRequest, replay)
    )
    assert any("does not verify" in m for m in errors), errors
    assert kinds.count("masked-input-sent") == 1  # round 1's, honest; none in round 2


def test_a_graph_chosen_after_the_keys_is_refused(tmp_path: Path) -> None:
    errors, kinds, entries = _attack(tmp_path, _on(sm.ShareKeysRequest, _drop_a_neighbour))
    assert any("wrong neighbours for the seeded graph" in m for m in errors), errors
    _assert_left_before_sending(kinds, entries)


def test_a_survivor_set_other_than_the_attested_one_reveals_nothing(tmp_path: Path) -> None:
    def smaller(message: sm.ConsistencyRequest) -> sm.ConsistencyRequest:
        others = [i for i in message.survivors if i != 0]
        return replace(message, survivors=tuple(i for i in message.survivors if i != others[0]))

    errors, kinds, _ = _attack(tmp_path, _on(sm.ConsistencyRequest, smaller))
    assert any("inconsistent survivor set" in m for m in errors), errors
    assert "masked-input-sent" in kinds  # the deviation came after stage 3


def test_an_agent_selectively_reported_dropped_is_refused(tmp_path: Path) -> None:
    def drop_one(message: sm.UnmaskRequest) -> sm.UnmaskRequest:
        victim = next(i for i in message.alive if i != 0)
        alive = tuple(i for i in message.alive if i != victim)
        return replace(message, alive=alive, dropped=(*message.dropped, victim))

    errors, _, _ = _attack(tmp_path, _on(sm.UnmaskRequest, drop_one))
    assert any("does not match the attested survivor set" in m for m in errors), errors


def test_the_same_round_untampered_completes(tmp_path: Path) -> None:
    errors, kinds, entries = _attack(tmp_path, None)
    assert errors == []
    assert "masked-input-sent" in kinds
    assert len(entries) == 1
