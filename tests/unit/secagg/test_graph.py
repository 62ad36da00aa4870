"""The random Harary neighbour graph (docs/secagg.md#stage-0-setup)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpfl.secagg.errors import ParameterError
from dpfl.secagg.graph import NeighbourGraph, random_harary_graph, random_permutation
from dpfl.secagg.randomness import SeededRandomSource


@pytest.mark.parametrize(
    ("n", "k"), [(10, 2), (10, 8), (11, 10), (50, 6), (51, 50), (6, 5), (2, 1)]
)
def test_structure(n: int, k: int) -> None:
    graph = random_harary_graph(n, k, SeededRandomSource(b"g" * 16).stream(f"{n}/{k}"))
    for u in range(n):
        hood = graph.neighbours(u)
        assert len(hood) == k + 1
        assert u in hood
        assert list(hood) == sorted(set(hood))
        for v in hood:
            assert u in graph.neighbours(v)  # symmetric
    assert graph.complete == (k == n - 1)


def test_neighbours_are_ring_positions_of_the_permutation() -> None:
    order = (4, 0, 3, 1, 2, 5)
    graph = NeighbourGraph.from_order(order, 2)
    # client 3 sits at position 2, between clients 0 (position 1) and 1 (position 3)
    assert graph.neighbours(3) == (0, 1, 3)
    assert graph.neighbours(4) == (0, 4, 5)  # position 0 wraps to position 5


def test_permutation_is_uniform() -> None:
    stream = SeededRandomSource(b"perm" * 4).stream("uniform")
    counts = np.zeros((5, 5), dtype=int)
    for _ in range(3000):
        perm = random_permutation(5, stream)
        counts[np.arange(5), perm] += 1
    assert stats.chisquare(counts.ravel()).pvalue > 1e-6
    assert sorted(random_permutation(100, stream)) == list(range(100))


@pytest.mark.parametrize(
    ("order", "k"),
    [((0, 1, 2, 3), 1), ((0, 1, 2, 3), 4), ((0, 1, 2, 2), 2), ((0,), 0), ((0, 1, 2, 3, 4), 3)],
)
def test_invalid_graphs(order: tuple[int, ...], k: int) -> None:
    with pytest.raises(ParameterError):
        NeighbourGraph.from_order(order, k)


def test_neighbours_of_unknown_client() -> None:
    graph = NeighbourGraph.from_order((0, 1, 2), 2)
    with pytest.raises(ParameterError):
        graph.neighbours(3)
