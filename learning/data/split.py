"""Deterministic, stratified train/test splitting shared by the loaders.

Splits use numpy's PCG64 generator, whose stream is stable across numpy versions and platforms, so
a (labels, fraction, seed) triple names one split everywhere: two agents (or a CI run and a laptop)
always agree on which records are held out.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["stratified_split", "stratified_take"]


def stratified_split(
    labels: NDArray[np.int64], *, test_fraction: float, seed: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Split indices into (train, test), keeping each class's share in both parts.

    Uses numpy's PCG64 stream (stable across numpy versions), so a given ``seed`` always gives the
    same split on every machine; both index arrays are sorted.
    """
    rng = np.random.default_rng(seed)
    test: list[NDArray[np.int64]] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        take = round(test_fraction * members.size)
        test.append(rng.permutation(members)[:take])
    test_idx = np.sort(np.concatenate(test)) if test else np.empty(0, dtype=np.int64)
    mask = np.ones(labels.size, dtype=bool)
    mask[test_idx] = False
    return np.flatnonzero(mask).astype(np.int64), test_idx.astype(np.int64)


def stratified_take(labels: NDArray[np.int64], *, count: int, seed: int) -> NDArray[np.int64]:
    """Exactly ``count`` indices, each class's share proportional to its size (sorted).

    Classes get ``floor(count * n_c / n)`` records and the remaining ones go to the largest
    remainders (ties to the smaller class label), so a count is met exactly where rounding per
    class, as :func:`stratified_split` does, could miss it by a few records.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if not 0 <= count <= labels.size:
        raise ValueError(f"count {count} outside [0, {labels.size}]")
    classes, sizes = np.unique(labels, return_counts=True)
    exact = count * sizes / max(labels.size, 1)
    quota = np.floor(exact).astype(np.int64)
    extra = count - int(quota.sum())
    order = sorted(range(classes.size), key=lambda i: (-(exact[i] - quota[i]), int(classes[i])))
    for i in order[:extra]:
        quota[i] += 1
    rng = np.random.default_rng(seed)
    taken = [
        rng.permutation(np.flatnonzero(labels == c))[:q]
        for c, q in zip(classes, quota, strict=True)
    ]
    out = np.sort(np.concatenate(taken)) if taken else np.empty(0, dtype=np.int64)
    return out.astype(np.int64)
