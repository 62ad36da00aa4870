"""The neighbour graph: a Harary graph H(k, n) with random labels plus a self-edge
(docs/secagg.md#the-protocol).

A CSPRNG permutation π places client π[p] at ring position p; the neighbours of u are the clients at
positions pos(u) + d mod n for d ∈ [−k/2, k/2]. So |N(u)| = k + 1 (u keeps one share of its own
secrets) and v ∈ N(u) ⇔ u ∈ N(v). With k = n − 1 (any parity) the graph is complete, the Bonawitz
2017 setting that small cohorts fall back to.

The permutation sorts the clients by independent uniform 128-bit keys; two keys collide with
probability ≤ n²/2^129, the only deviation from a uniform permutation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import ParameterError
from .randomness import RandomStream


@dataclass(frozen=True, slots=True)
class NeighbourGraph:
    """Who shares with whom. Build with :func:`random_harary_graph` or :meth:`from_order`.

    Attributes:
        num_clients: n.
        degree: k, the number of neighbours other than oneself (even, or n − 1 for complete).
        order: order[p] is the client at ring position p (the permutation π).
    """

    num_clients: int
    degree: int
    order: tuple[int, ...]
    _neighbourhoods: tuple[tuple[int, ...], ...] = field(repr=False, compare=False, default=())

    @classmethod
    def from_order(cls, order: tuple[int, ...] | list[int], degree: int) -> NeighbourGraph:
        """The graph for a given permutation (tests, or a graph fixed by someone else).

        Raises:
            ParameterError: ``order`` is not a permutation of 0..n−1, or k is odd and < n − 1,
                or k outside [1, n − 1].
        """
        order = tuple(int(u) for u in order)
        n = len(order)
        if n < 2:
            raise ParameterError(f"a graph needs at least 2 clients, got {n}")
        if sorted(order) != list(range(n)):
            raise ParameterError("order is not a permutation of 0..n-1")
        if not 1 <= degree <= n - 1:
            raise ParameterError(f"degree {degree} outside [1, {n - 1}]")
        if degree % 2 and degree != n - 1:
            raise ParameterError(f"degree {degree} must be even unless the graph is complete")
        if degree == n - 1:
            everyone = tuple(range(n))
            hoods = tuple(everyone for _ in range(n))
        else:
            position = [0] * n
            for p, u in enumerate(order):
                position[u] = p
            half = degree // 2
            hoods = tuple(
                tuple(sorted(order[(position[u] + d) % n] for d in range(-half, half + 1)))
                for u in range(n)
            )
        return cls(num_clients=n, degree=degree, order=order, _neighbourhoods=hoods)

    @property
    def complete(self) -> bool:
        """True when everyone is everyone's neighbour."""
        return self.degree == self.num_clients - 1

    def neighbours(self, client: int) -> tuple[int, ...]:
        """N(u), sorted, u included (k + 1 entries)."""
        if not 0 <= client < self.num_clients:
            raise ParameterError(f"client {client} outside [0, {self.num_clients})")
        return self._neighbourhoods[client]


def harary_neighbours(order: tuple[int, ...], degree: int, client: int) -> tuple[int, ...]:
    """N(client), sorted, in the graph ``NeighbourGraph.from_order(order, degree)``, computed
    for that one client (O(n) to find its position, not O(nk) for every neighbourhood)."""
    n = len(order)
    if not 0 <= client < n:
        raise ParameterError(f"client {client} outside [0, {n})")
    if not 1 <= degree <= n - 1:
        raise ParameterError(f"degree {degree} outside [1, {n - 1}]")
    if degree == n - 1:
        return tuple(range(n))
    if degree % 2:
        raise ParameterError(f"degree {degree} must be even unless the graph is complete")
    position = order.index(client)
    half = degree // 2
    return tuple(sorted(order[(position + d) % n] for d in range(-half, half + 1)))


def random_permutation(n: int, rng: RandomStream) -> tuple[int, ...]:
    """A uniform permutation of 0..n−1 (up to a key collision, probability ≤ n²/2^129)."""
    if n < 1:
        raise ParameterError(f"cannot permute {n} elements")
    hi = rng.uint64(n)
    lo = rng.uint64(n)
    return tuple(int(u) for u in np.lexsort((lo, hi)))


def random_harary_graph(n: int, degree: int, rng: RandomStream) -> NeighbourGraph:
    """H(k, n) with CSPRNG-random labels and self-edges (docs/secagg.md#stage-0-setup)."""
    return NeighbourGraph.from_order(random_permutation(n, rng), degree)
