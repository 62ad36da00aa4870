"""Reconstruction and removal of the masks (docs/secagg.md#reconstruction).

z = Σ_{A3} y_i − Σ_{A3} PRG(b_i) − Σ_{d∈A2\\A3} Σ_{i∈A3∩N(d)} sgn(i,d)·PRG(KA(s_d^SK, s_i^PK)),
sgn(i,d) = +1 if i < d else −1.

All secrets of the round are rebuilt together (:func:`dpfl.secagg.shamir.reconstruct_many`), each
from a t-subset of its holders that the owners next to it on the ring share (:func:`_pick`), so the
Lagrange coefficients are computed for a few x-sets only and taken from the cache otherwise.
Checks: each rebuilt s_d^SK must give s_d^PK (otherwise other t-subsets are tried); each b_i with
more than t shares is rebuilt from a second t-subset and must agree. Any failure aborts the round
(all or nothing).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import numpy.typing as npt

from . import shamir
from .errors import InvalidShare, SecAggError
from .messages import ShareKind
from .prg import PAIR_MASK, SELF_MASK, MaskAccumulator
from .primitives import agree_many, keypair_from_private, mask_seed
from .server_states import ServerCollectingUnmask

_MAX_SUBSETS = 16


class UnmaskFailed(SecAggError):  # noqa: N818
    """The secrets could not be rebuilt (too few or inconsistent shares)."""


#: owner -> [(holder, y)], holders in ring order around the owner
ShareLists = dict[int, list[tuple[int, int]]]


def _collect(state: ServerCollectingUnmask) -> tuple[ShareLists, ShareLists]:
    """The shares of each secret, ordered by the holder's ring offset from the owner."""
    graph = state.ctx.graph
    n = graph.num_clients
    position = {u: p for p, u in enumerate(graph.order)}
    b: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    s: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for holder, shares in state.responses.items():
        for owner, kind, y in shares:
            offset = (position[holder] - position[owner]) % n
            if offset > n // 2:
                offset -= n
            (b if kind is ShareKind.SELF_MASK_SEED else s)[owner].append((offset, holder, y))
    t = state.ctx.params.threshold
    for kind, owner in sorted(state.needed):
        have = len((b if kind is ShareKind.SELF_MASK_SEED else s).get(owner, ()))
        if have < t:
            raise UnmaskFailed(f"{kind.name} of client {owner} has {have} shares, t={t}")
    return (
        {o: [(h, y) for _, h, y in sorted(v)] for o, v in b.items()},
        {o: [(h, y) for _, h, y in sorted(v)] for o, v in s.items()},
    )


def _pick(
    lists: ShareLists, t: int, order: list[int], *, ahead: bool
) -> dict[int, list[tuple[int, int]]]:
    """A t-subset of each owner's shares, chosen so that neighbouring owners share it.

    Owners are visited along the ring; the previous owner's holder set is reused whenever all its
    holders also hold shares of this owner (neighbours on the ring have k of their k + 1
    neighbours in common), otherwise the t holders furthest ``ahead`` (or behind) on the ring
    are taken, which stay common to the following owners the longest. The x-sets then repeat over
    runs of about k + 2 − t owners and their Lagrange coefficients come from the cache.
    """
    out: dict[int, list[tuple[int, int]]] = {}
    current: tuple[int, ...] = ()
    for owner in order if ahead else reversed(order):
        shares = lists.get(owner)
        if shares is None:
            continue
        by_holder = dict(shares)
        if not current or any(h not in by_holder for h in current):
            ends = shares[-t:] if ahead else shares[:t]
            current = tuple(sorted(h for h, _ in ends))
        out[owner] = [(h + 1, by_holder[h]) for h in current]
    return out


def _windows(shares: list[tuple[int, int]], t: int) -> list[list[tuple[int, int]]]:
    """Distinct t-subsets to try after a failed check: consecutive windows along the ring."""
    count = min(len(shares) - t + 1, _MAX_SUBSETS)
    return [[(h + 1, y) for h, y in shares[i : i + t]] for i in range(count)]


def _rebuild_self_seeds(b: ShareLists, t: int, order: list[int]) -> dict[int, bytes]:
    first = _pick(b, t, order, ahead=True)
    second = _pick({o: v for o, v in b.items() if len(v) > t}, t, order, ahead=False)
    owners = sorted(first)
    values = shamir.reconstruct_many([first[o] for o in owners], threshold=t)
    checks = sorted(o for o in second if second[o] != first[o])
    check = dict(
        zip(checks, shamir.reconstruct_many([second[o] for o in checks], threshold=t), strict=True)
    )
    out: dict[int, bytes] = {}
    for owner, value in zip(owners, values, strict=True):
        if owner in check and check[owner] != value:
            raise UnmaskFailed(f"inconsistent shares of b for client {owner}")
        try:
            out[owner] = shamir.int_to_secret(value)
        except InvalidShare as exc:
            raise UnmaskFailed(f"b of client {owner}: {exc}") from exc
    return out


def _private_if_matches(value: int, public: bytes) -> bytes | None:
    try:
        private = shamir.int_to_secret(value)
    except InvalidShare:
        return None
    return private if keypair_from_private(private).public == public else None


def _rebuild_masking_keys(
    s: ShareLists, t: int, order: list[int], public: dict[int, bytes]
) -> dict[int, bytes]:
    first = _pick(s, t, order, ahead=True)
    owners = sorted(first)
    values = shamir.reconstruct_many([first[o] for o in owners], threshold=t)
    out: dict[int, bytes] = {}
    for owner, value in zip(owners, values, strict=True):
        private = _private_if_matches(value, public[owner])
        for window in _windows(s[owner], t):  # other subsets, only after a mismatch
            if private is not None:
                break
            private = _private_if_matches(shamir.reconstruct(window, threshold=t), public[owner])
        if private is None:
            raise UnmaskFailed(f"no subset of shares rebuilds the masking key of client {owner}")
        out[owner] = private
    return out


def recover_aggregate(state: ServerCollectingUnmask) -> npt.NDArray[np.uint64]:
    """Σ_{i∈A3} x_i mod 2^r from the collected shares.

    Raises:
        UnmaskFailed: a secret has fewer than t shares or its shares are inconsistent.
    """
    ctx = state.ctx
    params = ctx.params
    t = params.threshold
    b_shares, s_shares = _collect(state)
    order = list(ctx.graph.order)
    seeds = _rebuild_self_seeds(b_shares, t, order)
    masking_public = {d: state.keys[d][1] for d in s_shares}
    keys = _rebuild_masking_keys(s_shares, t, order, masking_public)
    acc = MaskAccumulator(
        length=params.vector_length, ring_bits=params.ring_bits, session_id=ctx.session_id
    )
    acc.add_vector(state.total)
    for i in sorted(state.a3):
        acc.add_prg(seeds[i], name=SELF_MASK, sign=-1)
    for d in sorted(keys):
        partners = [i for i in ctx.graph.neighbours(d) if i != d and i in state.a3]
        secrets = agree_many(keys[d], [state.keys[i][1] for i in partners])
        for i, secret in zip(partners, secrets, strict=True):
            seed = mask_seed(secret, session_id=ctx.session_id, a=i, b=d)
            acc.add_prg(seed, name=PAIR_MASK, sign=-1 if i < d else 1)
    return acc.result()
