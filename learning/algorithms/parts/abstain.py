"""When a PATE-FL teacher abstains: a nearest-neighbour test against the public pool.

A teacher that holds a few classes votes one of them on every query, so on a query of another
class it is wrong and outvotes the query's few holders. With ``public-share`` a teacher votes
only on the queries whose ``neighbours`` nearest records, among its own and the public pool's
(the query itself left out), are at least a ``share`` its own: an estimate of whether the query
looks like its data more than like the pool's mix of every class. Distances are taken in the
pool's first ``dim`` principal components. Abstaining sends the zero vector, whose norm is below
any vote's, so neither the sensitivities nor the charge change
(docs/accounting.md#abstaining-teachers).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from dpfl.learning.algorithms.base import Contract

__all__ = ["Abstention", "own_share"]

Floats = npt.NDArray[np.float64]
Records = npt.NDArray[np.floating[Any]]


class Abstention(Contract):
    """``none`` (every teacher votes on every query) or ``public-share`` (module docstring)."""

    method: Literal["none", "public-share"] = "none"
    share: float = Field(default=0.1, gt=0, le=1)
    neighbours: int = Field(default=20, ge=1, le=10_000)
    dim: int = Field(default=50, ge=1, le=4096)

    @model_validator(mode="after")
    def _options_need_a_method(self) -> Abstention:
        if self.method == "none" and (self.share, self.neighbours, self.dim) != (0.1, 20, 50):
            raise ValueError("share, neighbours and dim only apply to method public-share")
        return self

    def shares(self, own: Records, pool: Records, queries: npt.NDArray[np.int64]) -> Floats:
        """Per query (rows of ``pool`` at ``queries``), the teacher's :func:`own_share` (1
        everywhere with ``none``); it votes where this reaches ``share``."""
        if self.method == "none":
            return np.ones(len(queries), dtype=np.float64)
        return own_share(own, pool, queries, neighbours=self.neighbours, dim=self.dim)


def own_share(
    own: Records, pool: Records, queries: npt.NDArray[np.int64], *, neighbours: int, dim: int
) -> Floats:
    """Per query, the fraction of its ``neighbours`` nearest records (``own`` and ``pool``
    without the query itself) that are ``own``, in ``pool``'s first ``dim`` principal
    components. Rows are flattened records. The search is Private-kNN-FL's
    :func:`~dpfl.learning.algorithms.private_knn_fl.neighbours_of` (in chunks of queries, so
    memory stays bounded whatever the task's sizes; ties to the lower index)."""
    from dpfl.learning.algorithms.private_knn_fl import neighbours_of

    flat_pool = pool.reshape(len(pool), -1).astype(np.float64)
    mean = flat_pool.mean(0)
    _, _, vt = np.linalg.svd(flat_pool - mean, full_matrices=False)
    basis = vt[: min(dim, len(vt))].T
    projected = (flat_pool - mean) @ basis
    mine = (own.reshape(len(own), -1).astype(np.float64) - mean) @ basis
    k = min(neighbours, len(own) + len(pool) - 1)
    found = neighbours_of(np.concatenate([mine, projected]), projected[queries], k + 1)
    itself = (len(own) + queries)[:, None]
    # each row's k nearest other than the query itself (dropped where it is among the k + 1)
    order = np.argsort(found == itself, axis=1, kind="stable")[:, :k]
    nearest = np.take_along_axis(found, order, axis=1)
    share: Floats = (nearest < len(own)).mean(axis=1)
    return share
