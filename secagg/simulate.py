"""The whole protocol in one process: n client state machines and the server, no transport.

Tests and benchmarks use it, and so do large simulations (``--transport inproc``). It drives
exactly the state machines the gRPC layer drives, in the same order: the server's requests of a
stage go out, each client answers (or has dropped out), the server adds each answer as it arrives
and closes the stage.

Dropouts: ``dropouts[stage]`` lists the clients that stop answering at ``stage`` (they send nothing
for it nor for any later stage). Dropping "after" stage s is dropping at the next stage; a client in
``dropouts[Stage.UNMASK]`` has sent its masked input and must still be counted in the sum.

A malicious-secure round (``threat_model=ThreatModel.MALICIOUS``) runs its consistency stage
between the masked inputs and the unmasking (a client in ``dropouts[Stage.CONSISTENCY]`` sent its
masked input, never attests S and is summed all the same); each client takes part with its
``identities[i]``, and one without an identity refuses the setup.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from . import client as client_sm
from . import server as server_sm
from .client_states import ClientAborted, ClientState
from .config import RoundParameters
from .errors import ParameterError, ProtocolAborted, ProtocolViolation
from .graph import NeighbourGraph
from .identity import ClientIdentity
from .messages import ClientMessage, ServerMessage, Stage
from .parameters import ThreatModel
from .randomness import RandomSource, SystemRandomSource
from .server_states import (
    ServerAborted,
    ServerCompleted,
    ServerReadyToUnmask,
    ServerState,
    Survivors,
)

PROTOCOL_STAGES = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)
MALICIOUS_STAGES = (
    Stage.ADVERTISE_KEYS,
    Stage.SHARE_KEYS,
    Stage.MASKED_INPUT,
    Stage.CONSISTENCY,
    Stage.UNMASK,
)
_MASKED_BATCH = 16


@dataclass(frozen=True, slots=True)
class StageTiming:
    """Wall-clock seconds spent in one stage."""

    client_seconds: float  # all clients together
    clients: int  # how many clients computed a response
    server_seconds: float  # receiving every response and closing the stage
    client_times: tuple[float, ...] = field(default=(), repr=False)  # per client, in order

    @property
    def client_mean_seconds(self) -> float:
        return self.client_seconds / self.clients if self.clients else 0.0

    @property
    def client_median_seconds(self) -> float:
        return float(np.median(self.client_times)) if self.client_times else 0.0


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    """One message: ``to_server`` is False for a request, True for a response."""

    client: int
    to_server: bool
    message: ServerMessage | ClientMessage


@dataclass(frozen=True, slots=True)
class SimulationResult:
    aggregate: npt.NDArray[np.uint64] = field(repr=False)
    survivors: Survivors
    graph: NeighbourGraph = field(repr=False)
    timings: Mapping[Stage, StageTiming]
    server_unmask_seconds: float  # closing the unmask stage: reconstruction and mask removal
    total_seconds: float
    client_aborts: Mapping[int, str] = field(default_factory=dict)
    rejected: Mapping[int, str] = field(default_factory=dict)  # responses the server refused
    transcript: tuple[TranscriptEntry, ...] = field(default=(), repr=False)


class SimulationAborted(ProtocolAborted):
    """The simulated round aborted; ``state`` says at which stage, why, and who survived."""

    def __init__(self, state: ServerAborted) -> None:
        super().__init__(f"aborted at {state.at_stage.name}: {state.reason}")
        self.state = state


def _check_dropouts(
    dropouts: Mapping[Stage, Collection[int]] | None, n: int, stages: tuple[Stage, ...]
) -> dict[Stage, frozenset[int]]:
    out: dict[Stage, frozenset[int]] = {}
    for stage, clients in (dropouts or {}).items():
        if stage not in stages:
            raise ParameterError(f"dropouts can only happen at {[s.name for s in stages]}")
        ids = frozenset(int(c) for c in clients)
        if any(not 0 <= c < n for c in ids):
            raise ParameterError(f"dropout indices must lie in [0, {n})")
        out[Stage(stage)] = ids
    return out


def _deliver(
    server: ServerState, batch: list[tuple[int, ClientMessage]], rejected: dict[int, str]
) -> tuple[ServerState, float]:
    """Hand a batch of responses to the server; record refusals; empty the batch."""
    tick = time.perf_counter()
    server, refused = server_sm.receive_many(server, batch)
    for sender, exc in refused:
        rejected[sender] = f"{type(exc).__name__}: {exc}"
    batch.clear()
    return server, time.perf_counter() - tick


def simulate(
    vectors: Sequence[npt.ArrayLike],
    *,
    params: RoundParameters,
    dropouts: Mapping[Stage, Collection[int]] | None = None,
    rng: RandomSource | None = None,
    job_id: str = "simulation",
    round: int = 0,
    before_unmask: Callable[[ServerReadyToUnmask], None] | None = None,
    record: bool = False,
    threat_model: ThreatModel = ThreatModel.SEMI_HONEST,
    identities: Sequence[ClientIdentity | None] | None = None,
) -> SimulationResult:
    """Run one secure-aggregation round for ``len(vectors)`` clients.

    Args:
        vectors: client i's ring vector (integers in [−2^(r−1), 2^r), length m); read lazily, when
            client i builds its masked input, so a lazy sequence keeps memory at O(m).
        params: the round's parameters (``num_clients`` must equal ``len(vectors)``).
        dropouts: per stage, the clients that stop answering from that stage on.
        rng: randomness (None: the system CSPRNG); client i uses ``rng.child(f"client/{i}")``.
        job_id, round: the round's identity in every header.
        before_unmask: called with the :class:`ServerReadyToUnmask` state, where the coordinator
            commits the privacy ledger.
        record: keep every message in ``transcript`` (for golden tests; costs memory).
        threat_model: the model the setup announces; MALICIOUS runs the malicious-secure variant.
        identities: client i's peer identity (None, or a None entry: the client has none).

    Returns:
        The aggregate Σ_{i∈A3} x_i mod 2^r, the survivor sets and per-stage timings.

    Raises:
        SimulationAborted: the protocol aborted (too few survivors or shares); no aggregate.
        ParameterError: inconsistent arguments.
    """
    n = params.num_clients
    if len(vectors) != n:
        raise ParameterError(f"{len(vectors)} vectors for {n} clients")
    stages = MALICIOUS_STAGES if threat_model is ThreatModel.MALICIOUS else PROTOCOL_STAGES
    schedule = _check_dropouts(dropouts, n, stages)
    if identities is not None and len(identities) != n:
        raise ParameterError(f"{len(identities)} identities for {n} clients")
    rng = rng or SystemRandomSource()
    started = time.perf_counter()
    server: ServerState
    server, outbound = server_sm.start_round(
        job_id=job_id, round=round, params=params, rng=rng, threat_model=threat_model
    )
    clients: dict[int, ClientState] = {
        i: client_sm.new_client(
            job_id=job_id,
            round=round,
            rng=rng.child(f"client/{i}"),
            identity=None if identities is None else identities[i],
        )
        for i in range(n)
    }
    gone: set[int] = set()
    aborts: dict[int, str] = {}
    rejected: dict[int, str] = {}
    transcript: list[TranscriptEntry] = []
    timings: dict[Stage, StageTiming] = {}
    unmask_seconds = 0.0
    for stage in stages:
        gone |= schedule.get(stage, frozenset())
        client_time = server_time = 0.0
        computed = 0
        per_client: list[float] = []
        batch: list[tuple[int, ClientMessage]] = []
        # responses reach the server in batches (one copy of its collections per batch); masked
        # inputs in small ones, so that only a few vectors of length m wait at any time
        batch_size = _MASKED_BATCH if stage is Stage.MASKED_INPUT else n

        for item in outbound:
            i = item.recipient
            if record:
                transcript.append(TranscriptEntry(i, False, item.message))
            if i in gone:
                continue
            state = clients[i]
            if stage is Stage.MASKED_INPUT:
                state = client_sm.with_input(state, vectors[i])
            tick = time.perf_counter()
            try:
                state, reply = client_sm.step(state, item.message)
            except ProtocolViolation as exc:
                aborts[i] = f"{type(exc).__name__}: {exc}"
                gone.add(i)
                continue
            finally:
                spent = time.perf_counter() - tick
                client_time += spent
                per_client.append(spent)
            computed += 1
            clients[i] = state
            if reply is None:
                aborts[i] = state.reason if isinstance(state, ClientAborted) else "no reply"
                gone.add(i)
                continue
            if record:
                transcript.append(TranscriptEntry(i, True, reply))
            batch.append((i, reply))
            if len(batch) >= batch_size:
                server, spent = _deliver(server, batch, rejected)
                server_time += spent
        server, spent = _deliver(server, batch, rejected)
        server_time += spent
        tick = time.perf_counter()
        server, outbound = server_sm.close_stage(server)
        closing = time.perf_counter() - tick
        server_time += closing
        if stage is Stage.UNMASK:
            unmask_seconds = closing
        if isinstance(server, ServerReadyToUnmask):
            if before_unmask is not None:
                before_unmask(server)
            tick = time.perf_counter()
            server, outbound = server_sm.begin_unmask(server)
            server_time += time.perf_counter() - tick
        timings[stage] = StageTiming(client_time, computed, server_time, tuple(per_client))
        if isinstance(server, ServerAborted):
            raise SimulationAborted(server)
    if not isinstance(server, ServerCompleted):  # pragma: no cover - the loop always ends here
        raise ProtocolAborted(f"simulation ended in {type(server).__name__}")
    return SimulationResult(
        aggregate=server.aggregate,
        survivors=server.survivors,
        graph=server.ctx.graph,
        timings=timings,
        server_unmask_seconds=unmask_seconds,
        total_seconds=time.perf_counter() - started,
        client_aborts=aborts,
        rejected=rejected,
        transcript=tuple(transcript),
    )
