"""A small secure-aggregation world driven stage by stage, for the client and server tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pytest

from dpfl.secagg import client, server
from dpfl.secagg.client_states import ClientState
from dpfl.secagg.config import RoundParameters
from dpfl.secagg.identity import ClientIdentity
from dpfl.secagg.messages import ClientMessage, ServerMessage
from dpfl.secagg.parameters import ThreatModel
from dpfl.secagg.randomness import SeededRandomSource
from dpfl.secagg.server_states import ServerReadyToUnmask, ServerState


class World:
    """n clients and a server with seeded randomness; each stage is run explicitly.

    ``requests`` holds the server's pending request per client, ``replies`` the last replies.
    """

    def __init__(
        self,
        *,
        n: int = 7,
        k: int = 4,
        t: int = 3,
        m: int = 6,
        ring_bits: int = 16,
        min_survivors: int | None = None,
        seed: bytes = b"world-seed-world",
        job_id: str = "job",
        round: int = 1,
        threat_model: ThreatModel = ThreatModel.SEMI_HONEST,
        identities: Sequence[ClientIdentity | None] | None = None,
    ) -> None:
        self.params = RoundParameters(
            num_clients=n,
            degree=k,
            threshold=t,
            ring_bits=ring_bits,
            vector_length=m,
            min_survivors=min_survivors or t,
        )
        self.rng = SeededRandomSource(seed)
        self.inputs = [
            np.arange(m, dtype=np.uint64) * np.uint64(i + 1) % np.uint64(1 << ring_bits)
            for i in range(n)
        ]
        self.server: ServerState
        self.server, out = server.start_round(
            job_id=job_id, round=round, params=self.params, rng=self.rng, threat_model=threat_model
        )
        self.requests: dict[int, ServerMessage] = {o.recipient: o.message for o in out}
        self.clients: dict[int, ClientState] = {
            i: client.new_client(
                job_id=job_id,
                round=round,
                rng=self.rng.child(f"c{i}"),
                input=self.inputs[i],
                identity=None if identities is None else identities[i],
            )
            for i in range(n)
        }
        self.replies: dict[int, ClientMessage] = {}

    @property
    def ctx(self):  # type: ignore[no-untyped-def]
        return self.server.ctx

    def answer(
        self,
        *,
        skip: Iterable[int] = (),
        tamper: Callable[[int, ServerMessage], ServerMessage] | None = None,
    ) -> None:
        """Every client with a pending request answers it (except ``skip``); the server receives."""
        skipped = set(skip)
        self.replies = {}
        for i, request in sorted(self.requests.items()):
            if i in skipped:
                continue
            if tamper is not None:
                request = tamper(i, request)
            state, reply = client.step(self.clients[i], request)
            self.clients[i] = state
            if reply is not None:
                self.replies[i] = reply
                self.server = server.receive(self.server, i, reply)
        self.requests = {}

    def close(self) -> None:
        self.server, out = server.close_stage(self.server)
        if isinstance(self.server, ServerReadyToUnmask):
            self.server, out = server.begin_unmask(self.server)
        self.requests = {o.recipient: o.message for o in out}

    def advance(self, stages: int, *, skip: Iterable[int] = ()) -> None:
        for _ in range(stages):
            self.answer(skip=skip)
            self.close()

    def expected_sum(self, clients: Iterable[int]) -> np.ndarray:
        total = sum(
            (self.inputs[i] for i in clients), np.zeros(self.params.vector_length, np.uint64)
        )
        return total & np.uint64((1 << self.params.ring_bits) - 1)


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def make_world() -> Callable[..., World]:
    return World
