"""The server (coordinator) side: pure transitions over the states of :mod:`.server_states`.

A driver calls :func:`start_round` (graph, session id, the advertise-keys requests),
:func:`receive` for each response (a violation raises a typed
:class:`~dpfl.secagg.errors.ProtocolViolation` and changes nothing), :func:`close_stage` when
everyone answered or at the deadline, and :func:`begin_unmask` once the privacy ledger is
committed: closing the masked-input stage stops at :class:`ServerReadyToUnmask` for that. The
rules enforced (one ciphertext per neighbour, A1 ⊇ A2 ⊇ A3, all or nothing, never both shares of
one client, clients counted once their masked input arrived) are in docs/secagg.md#the-protocol.

A malicious-secure round (``threat_model=ThreatModel.MALICIOUS``) derives the graph from the roster
of signed advertisements when stage 1 closes, and runs the consistency stage between the masked
inputs and :class:`ServerReadyToUnmask`, which stays the last gate before any share is requested
(docs/secagg.md#the-malicious-secure-variant). The coordinator relays signatures; the agents
verify them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import signed
from .config import RoundParameters
from .errors import (
    ProtocolViolation,
    WrongStage,
)
from .graph import NeighbourGraph, random_harary_graph
from .messages import (
    AdvertiseKeysRequest,
    Attestation,
    ConsistencyRequest,
    MaskedInputRequest,
    Outbound,
    PeerKeys,
    RosterEntry,
    ShareKeysRequest,
    ShareKind,
    Stage,
    UnmaskRequest,
)
from .parameters import ThreatModel
from .prg import container_dtype
from .primitives import compute_session_id
from .randomness import RandomSource, SystemRandomSource
from .server_receive import receive, receive_many
from .server_states import (
    ServerAborted,
    ServerCollectingConsistency,
    ServerCollectingKeys,
    ServerCollectingMaskedInputs,
    ServerCollectingShares,
    ServerCollectingUnmask,
    ServerCompleted,
    ServerContext,
    ServerReadyToUnmask,
    ServerState,
)
from .unmask import UnmaskFailed, recover_aggregate

__all__ = [
    "ServerAborted",
    "ServerCollectingConsistency",
    "ServerCollectingKeys",
    "ServerCollectingMaskedInputs",
    "ServerCollectingShares",
    "ServerCollectingUnmask",
    "ServerCompleted",
    "ServerReadyToUnmask",
    "ServerState",
    "begin_unmask",
    "close_stage",
    "receive",
    "receive_many",
    "start_round",
]


def start_round(
    *,
    job_id: str,
    round: int,
    params: RoundParameters,
    rng: RandomSource | None = None,
    encoding_json: str = "",
    threat_model: ThreatModel = ThreatModel.SEMI_HONEST,
) -> tuple[ServerCollectingKeys, tuple[Outbound, ...]]:
    """Stage 0: draw the session nonce (and, unless the round is malicious-secure, the graph),
    and invite every client to advertise keys.

    ``encoding_json`` is copied into every client's setup unread: how the inputs were made is
    the application's agreement with its clients, not the protocol's. ``threat_model`` goes into
    every setup; the (k, t) of ``params`` should come from the solver for the same model.
    """
    rng = rng or SystemRandomSource()
    if not isinstance(params, RoundParameters):
        raise ProtocolViolation("params must be RoundParameters")
    if not isinstance(threat_model, ThreatModel):
        raise ProtocolViolation(f"threat_model must be a ThreatModel, got {threat_model!r}")
    stream = rng.stream(f"server/{job_id}/{round}")
    nonce = stream.read(32)
    session_id = compute_session_id(job_id=job_id, round=round, nonce=nonce)
    graph = (
        None
        if threat_model is ThreatModel.MALICIOUS
        else random_harary_graph(params.num_clients, params.degree, stream)
    )
    ctx = ServerContext(job_id, round, session_id, params, graph, threat_model)
    header = ctx.header(Stage.ADVERTISE_KEYS)
    out = tuple(
        Outbound(
            i,
            AdvertiseKeysRequest(
                header=header,
                setup=params.setup_for(
                    i,
                    session_nonce=nonce,
                    encoding_json=encoding_json,
                    threat_model=threat_model.value,
                ),
            ),
        )
        for i in range(params.num_clients)
    )
    return ServerCollectingKeys(ctx), out


def _listed(state: ServerCollectingKeys, graph: NeighbourGraph, client: int) -> list[int]:
    """N(client) ∩ A1, in index order: the neighbour list client receives in stage 2."""
    return [j for j in graph.neighbours(client) if j in state.keys]


def _roster(state: ServerCollectingKeys) -> tuple[RosterEntry, ...]:
    """Every advertisement of A1 as (j, d_j), in index order."""
    return tuple(
        RosterEntry(
            index=j,
            digest=signed.roster_digest(
                index=j,
                encryption_key=state.keys[j][0],
                masking_key=state.keys[j][1],
                key_id=state.adverts[j][2],
            ),
        )
        for j in sorted(state.keys)
    )


# -- close -----------------------------------------------------------------------------------------


def _abort(state: ServerState, reason: str) -> ServerAborted:
    return ServerAborted(state.ctx, state.stage, reason, state.survivors)


def close_stage(state: ServerState) -> tuple[ServerState, tuple[Outbound, ...]]:
    """End the current stage with whoever answered; returns the next state and its requests.

    From the masked-input stage it returns :class:`ServerReadyToUnmask` and no requests: commit
    the ledger, then call :func:`begin_unmask`. From the unmask stage it returns
    :class:`ServerCompleted` or :class:`ServerAborted`.

    Raises:
        WrongStage: the state is not collecting anything.
    """
    if isinstance(state, ServerCollectingKeys):
        return _close_keys(state)
    if isinstance(state, ServerCollectingShares):
        return _close_shares(state)
    if isinstance(state, ServerCollectingMaskedInputs):
        return _close_masked(state)
    if isinstance(state, ServerCollectingConsistency):
        return _close_consistency(state), ()
    if isinstance(state, ServerCollectingUnmask):
        return _close_unmask(state), ()
    raise WrongStage(f"nothing to close in {type(state).__name__}")


def _close_keys(state: ServerCollectingKeys) -> tuple[ServerState, tuple[Outbound, ...]]:
    params = state.ctx.params
    if len(state.keys) < params.min_survivors:
        return _abort(
            state, f"{len(state.keys)} clients advertised keys, fewer than {params.min_survivors}"
        ), ()
    ctx = state.ctx
    roster: tuple[RosterEntry, ...] = ()
    if ctx.malicious:  # the graph is fixed only now, by the committed advertisements
        roster = _roster(state)
        seed = signed.graph_seed(ctx.session_id, roster)
        ctx = replace(
            ctx, graph_or_none=signed.seeded_graph(params.num_clients, params.degree, seed)
        )
    graph = ctx.graph
    header = ctx.header(Stage.SHARE_KEYS)
    no_advert = (b"", b"", b"")
    out = []
    for i in sorted(state.keys):
        peers = tuple(
            PeerKeys(
                index=j,
                encryption_public_key=state.keys[j][0],
                masking_public_key=state.keys[j][1],
                signature=state.adverts.get(j, no_advert)[0],
                certificate=state.adverts.get(j, no_advert)[1],
            )
            for j in _listed(state, graph, i)
        )
        out.append(Outbound(i, ShareKeysRequest(header=header, peers=peers, roster=roster)))
    return ServerCollectingShares(ctx, state.keys), tuple(out)


def _close_shares(state: ServerCollectingShares) -> tuple[ServerState, tuple[Outbound, ...]]:
    params = state.ctx.params
    a2 = frozenset(state.shares)
    if len(a2) < params.min_survivors:
        return _abort(
            state, f"{len(a2)} clients shared keys, fewer than {params.min_survivors}"
        ), ()
    header = state.ctx.header(Stage.MASKED_INPUT)
    out = []
    for j in sorted(a2):
        forwarded = tuple(
            state.shares[i][j]
            for i in state.ctx.graph.neighbours(j)
            if i != j and i in a2 and j in state.shares[i]
        )
        out.append(Outbound(j, MaskedInputRequest(header=header, shares=forwarded)))
    total = np.zeros(params.vector_length, dtype=container_dtype(params.ring_bits))
    new = ServerCollectingMaskedInputs(state.ctx, state.keys, a2, total)
    return new, tuple(out)


def _close_masked(state: ServerCollectingMaskedInputs) -> tuple[ServerState, tuple[Outbound, ...]]:
    closed = _check_masked(state)
    if not isinstance(closed, ServerReadyToUnmask) or not state.ctx.malicious:
        return closed, ()
    # malicious-secure: every agent of S = A3 signs S before anything can be unmasked
    survivors = tuple(sorted(state.a3))
    header = state.ctx.header(Stage.CONSISTENCY)
    out = tuple(
        Outbound(j, ConsistencyRequest(header=header, survivors=survivors)) for j in survivors
    )
    new = ServerCollectingConsistency(state.ctx, state.keys, state.a2, state.a3, state.total)
    return new, out


def _check_masked(state: ServerCollectingMaskedInputs) -> ServerState:
    params = state.ctx.params
    graph = state.ctx.graph
    a2, a3 = state.a2, state.a3
    t = params.threshold
    if len(a3) < params.min_survivors:
        return _abort(state, f"{len(a3)} masked inputs, fewer than {params.min_survivors}")
    for i in sorted(a3):  # b_i is rebuilt from N(i) ∩ A3
        holders = sum(1 for j in graph.neighbours(i) if j in a3)
        if holders < t:
            return _abort(state, f"b of client {i} has {holders} live holders, t={t}")
    for d in sorted(a2 - a3):  # s_d is rebuilt from N(d) ∩ A3 when d masked with someone alive
        holders = sum(1 for j in graph.neighbours(d) if j in a3)
        if 0 < holders < t:
            return _abort(state, f"s of dropped client {d} has {holders} live holders, t={t}")
    return ServerReadyToUnmask(state.ctx, state.keys, a2, a3, state.total)


def _close_consistency(state: ServerCollectingConsistency) -> ServerState:
    """Every secret must keep t holders among the agents that attested S (only they are asked
    for shares; an agent of A3 that did not attest is summed like one that fell silent)."""
    graph = state.ctx.graph
    t = state.ctx.params.threshold
    attested = frozenset(state.attestations)
    for i in sorted(state.a3):
        holders = sum(1 for j in graph.neighbours(i) if j in attested)
        if holders < t:
            return _abort(state, f"b of client {i} has {holders} attested holders, t={t}")
    for d in sorted(state.a2 - state.a3):
        hood = graph.neighbours(d)
        if any(j in state.a3 for j in hood):
            holders = sum(1 for j in hood if j in attested)
            if holders < t:
                return _abort(
                    state, f"s of dropped client {d} has {holders} attested holders, t={t}"
                )
    return ServerReadyToUnmask(
        state.ctx, state.keys, state.a2, state.a3, state.total, state.attestations
    )


def begin_unmask(state: ServerReadyToUnmask) -> tuple[ServerCollectingUnmask, tuple[Outbound, ...]]:
    """Stage 4: ask each j ∈ A3 for b-shares of N(j) ∩ A3 and s-shares of N(j) ∩ (A2 \\ A3).

    In a malicious-secure round only the agents that attested S are asked, and each request
    carries S and the consistency signatures of j's attesting neighbours, as received.
    Call only after the round's privacy events are committed
    (docs/architecture.md#rule-1-never-under-count).
    """
    if not isinstance(state, ServerReadyToUnmask):
        raise WrongStage(f"begin_unmask needs ServerReadyToUnmask, got {type(state).__name__}")
    graph = state.ctx.graph
    header = state.ctx.header(Stage.UNMASK)
    gone = state.a2 - state.a3
    malicious = state.ctx.malicious
    survivors = tuple(sorted(state.a3)) if malicious else ()
    asked = sorted(state.attestations) if malicious else sorted(state.a3)
    requests: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    needed: set[tuple[ShareKind, int]] = set()
    out = []
    for j in asked:
        hood = graph.neighbours(j)
        alive = tuple(i for i in hood if i in state.a3)
        dropped = tuple(d for d in hood if d in gone)
        requests[j] = (alive, dropped)
        needed.update((ShareKind.SELF_MASK_SEED, a) for a in alive)
        needed.update((ShareKind.MASKING_KEY, d) for d in dropped)
        attestations = tuple(
            Attestation(i, state.attestations[i]) for i in hood if i in state.attestations
        )
        out.append(
            Outbound(
                j,
                UnmaskRequest(
                    header=header,
                    alive=alive,
                    dropped=dropped,
                    survivors=survivors,
                    attestations=attestations,
                ),
            )
        )
    new = ServerCollectingUnmask(
        state.ctx,
        state.keys,
        state.a2,
        state.a3,
        state.total,
        requests,
        frozenset(needed),
        attested=frozenset(state.attestations),
    )
    return new, tuple(out)


def _close_unmask(state: ServerCollectingUnmask) -> ServerState:
    try:
        aggregate = recover_aggregate(state)
    except UnmaskFailed as exc:
        return _abort(state, str(exc))
    return ServerCompleted(state.ctx, state.survivors, aggregate)
