"""RDP bounds of the discrete and voting mechanisms of dpfl (pure functions of parameters).

- :func:`skellam_rdp`: the multidimensional Skellam mechanism (Agarwal, Kairouz & Liu 2021),
  integer orders only; docs/accounting.md#skellam-and-voting-rdp states the bound;
- :func:`voting_rdp`: PATE-FL / Private-kNN-FL, data-independent (docs/algorithms.md#pate-fl);
- :func:`data_dependent_voting_rdp`: the per-query data-dependent bound of
  docs/algorithms.md#why-no-data-dependent-charge, capped by the data-independent one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from .rdp_subsampling import interpolate_fractional

if TYPE_CHECKING:  # the events call these functions: no import cycle at run time
    from .events import DataDependentVotingEvent, SkellamEvent, VotingEvent

__all__ = [
    "data_dependent_voting_rdp",
    "skellam_effective_sensitivities",
    "skellam_rdp",
    "skellam_rdp_integer",
    "voting_rdp",
    "voting_rdp_coefficient",
]

FloatArray = NDArray[np.float64]


def skellam_effective_sensitivities(event: SkellamEvent) -> tuple[float, float]:
    """``(Δ1, Δ2)`` after the norm inequalities ``‖x‖₂ ≤ ‖x‖₁ ≤ √d·‖x‖₂``.

    Both tightenings are valid for any vector of dimension d, so a loose declared sensitivity is
    never charged above what the other one implies.
    """
    l1 = min(event.l1_sensitivity, math.sqrt(event.dimension) * event.l2_sensitivity)
    l2 = min(event.l2_sensitivity, event.l1_sensitivity)
    return l1, l2


def skellam_rdp_integer(event: SkellamEvent, alpha: int) -> float:
    """The bound of Agarwal, Kairouz & Liu 2021 (Thm. 3.5 / Cor. 3.6) at integer ``alpha ≥ 2``."""
    l1, l2 = skellam_effective_sensitivities(event)
    v = 2.0 * event.mu  # variance of Sk(mu) = Poisson(mu) − Poisson(mu)
    lead = alpha * l2 * l2 / (2.0 * v)
    correction = min(((2 * alpha - 1) * l2 * l2 + 6.0 * l1) / (4.0 * v * v), 3.0 * l1 / (2.0 * v))
    return lead + correction


def skellam_rdp(event: SkellamEvent, orders: Sequence[float]) -> FloatArray:
    """Skellam RDP on ``orders``; fractional orders by convexity between integers."""

    def cgf(m: int) -> float:
        return 0.0 if m == 1 else (m - 1) * skellam_rdp_integer(event, m)

    return interpolate_fractional(cgf, orders)


def voting_rdp_coefficient(event: VotingEvent) -> float:
    """ρ such that the event is ``(α, ρ·α)``-RDP at every α (docs/algorithms.md#pate-fl).

    - agent level (add/remove one agent; its vote vector has L2 norm ≤ 1): ``Q/(2σ²)``;
    - instance level, PATE-FL (k = 1; replacing one record moves one one-hot vote: L2 √2):
      ``Q/σ²``;
    - instance level, Private-kNN-FL: ``Q/(k·σ²)``. Replacing one record changes at most one of
      the k neighbours, moving the vote ``(1/k)·Σ one-hot`` by at most √2/k, which would give
      ``Q/(k²·σ²)``; this event keeps the conservative ``1/k`` closed form (k ≥ 1), while the
      algorithm charges the exact sensitivity (docs/algorithms.md#private-knn-fl).
    """
    q, s2 = event.queries, event.sigma**2
    if event.level == "agent":
        return q / (2.0 * s2)
    return q / (event.k * s2)


def voting_rdp(event: VotingEvent, orders: Sequence[float]) -> FloatArray:
    """``ρ·α`` on ``orders`` (see :func:`voting_rdp_coefficient`)."""
    return voting_rdp_coefficient(event) * np.asarray(orders, dtype=np.float64)


def data_dependent_voting_rdp(
    event: DataDependentVotingEvent, orders: Sequence[float]
) -> FloatArray:
    """Σ over queries of ``min(data-independent, data-dependent)``, per order.

    For a query with margin γ between the top two coordinates of the averaged vote, N agents,
    C classes, noise std σ on the summed votes and vote sensitivity s:

        ε_α ≤ C·exp(−N²γ²/(8σ²)) + log(1 + exp((2α−1)·σ²/(2s²) − N²γ²/(16σ²) + log C)) / (α−1).

    The first term is a bound ``p`` on the probability that the noisy argmax differs from the
    true one; the bound is only used where it is meaningful, ``p < 1`` (and γ > 0); elsewhere the
    query is charged the data-independent ``ρ·α`` of the equivalent :class:`VotingEvent`. Where
    ``σ < s`` the factor ``σ²/s²`` is replaced by the larger ``s²/σ²`` (the form a Cauchy–Schwarz
    derivation of such bounds produces); the two agree with the formula of
    docs/algorithms.md#why-no-data-dependent-charge whenever ``σ ≥ s``, which is every practical
    setting (s ≤ 1 ≤ σ).

    **The result depends on the private votes** (through the margins): it is reported separately
    and marked data-dependent; budgets are enforced on :func:`dpfl.accounting.guaranteed_event`.
    """
    a = np.asarray(orders, dtype=np.float64)
    per_query_independent = (
        1.0 / (2.0 * event.sigma**2) if event.level == "agent" else 1.0 / (event.k * event.sigma**2)
    ) * a
    total = np.zeros_like(a)
    if not event.margins:
        return total
    gamma = np.asarray(event.margins, dtype=np.float64)
    n, c, s2 = float(event.num_agents), float(event.num_classes), event.sigma**2
    ratio = max(s2 / event.s**2, event.s**2 / s2)
    g2 = (n * gamma) ** 2
    log_p = math.log(c) - g2 / (8.0 * s2)  # log of the first term
    valid = (gamma > 0.0) & (log_p < 0.0)
    # For each valid query and order: p + log1p(exp(u))/(α−1)
    u = (2.0 * a[None, :] - 1.0) * ratio / 2.0 - g2[:, None] / (16.0 * s2) + math.log(c)
    dependent = np.exp(log_p)[:, None] + np.logaddexp(0.0, u) / (a[None, :] - 1.0)
    per_query = np.where(
        valid[:, None], np.minimum(dependent, per_query_independent[None, :]), per_query_independent
    )
    out: FloatArray = np.minimum(per_query.sum(axis=0), len(event.margins) * per_query_independent)
    return out
