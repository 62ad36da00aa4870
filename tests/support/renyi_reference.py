"""Exact Rényi divergences of Skellam releases, computed from the probability mass functions and
nothing of ``dpfl.accounting``: the reference the charge tests compare the ledger's figures to.

A released sum with ``Sk(μ)`` noise on each of d coordinates is a product law, so the divergence
of two such releases is a sum of one-dimensional ones; a Poisson-subsampled release at an
integer order follows from the binomial expansion of ``E_Q[(1 − q + qL)^α]`` with
``E_Q[L^j] = exp((j − 1)·D_j(P‖Q))``, an identity. One-dimensional sums run over a window of
±30 standard deviations, and each asserts that the window's edges are negligible.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from scipy import special

Array = NDArray[np.float64]


def skellam_logpmf(k: NDArray[np.int64], mu: float) -> Array:
    """``log P[Sk(μ) = k] = log(e^{−2μ} I_|k|(2μ))`` at every k, the far tails included (where
    the pmf is below float range): a table from :func:`_log_bessel_table`."""
    orders = np.abs(k)
    table = _log_bessel_table(mu, int(orders.max()))
    out: Array = table[orders]
    return out


@functools.lru_cache(maxsize=64)
def _log_bessel_table(mu: float, top: int) -> Array:
    """``log(e^{−x} I_ν(x))`` for ν = 0..top, x = 2μ: the ratios ``r_ν = I_{ν+1}/I_ν`` by
    Miller's backward recurrence ``r_{ν−1} = 1/(2ν/x + r_ν)`` (I_ν is the recurrence's minimal
    solution, so the backward direction is stable), summed in log space from scipy's
    ``ive(0, x)``. Checked against ``ive`` wherever that is in float range."""
    x = 2.0 * mu
    start = top + int(4.0 * math.sqrt(x)) + 200
    ratio = 0.0
    log_ratios = np.empty(top, dtype=np.float64)
    for nu in range(start, 0, -1):
        ratio = 1.0 / (2.0 * nu / x + ratio)  # now r_{ν−1}
        if nu - 1 < top:
            log_ratios[nu - 1] = math.log(ratio)
    table = np.empty(top + 1, dtype=np.float64)
    table[0] = math.log(special.ive(0, x))
    table[1:] = table[0] + np.cumsum(log_ratios)
    direct = special.ive(np.arange(top + 1, dtype=np.float64), x)
    usable = direct > 1e-280
    assert np.allclose(table[usable], np.log(direct[usable]), rtol=0.0, atol=1e-9)
    return table


def _window(*mus: float, shift: int, alpha: float = 1.0) -> NDArray[np.int64]:
    """±30 standard deviations around both laws and around the order-α tilt's peak (at α·shift
    for a pure shift)."""
    reach = math.ceil(30.0 * math.sqrt(2.0 * max(mus)) + (alpha + 1.0) * abs(shift)) + 20
    return np.arange(-reach, reach + 1, dtype=np.int64)


def _checked_logsumexp(terms: Array) -> float:
    """log Σ exp(terms), asserting that the window's edges are negligible and the largest term
    lies well inside it (a pmf below float range reads as −inf, which the second check covers)."""
    total = float(special.logsumexp(terms))
    assert max(terms[0], terms[-1]) < total - 60.0, "the window's edges are not negligible"
    peak = int(np.argmax(terms))
    assert terms.size // 8 < peak < terms.size - terms.size // 8, "the peak is near an edge"
    return total


@functools.lru_cache(maxsize=4096)
def renyi_1d(alpha: float, mu_p: float, mu_q: float, shift: int = 0) -> float:
    """``D_α(shift + Sk(μ_p) ‖ Sk(μ_q))`` for α > 1 (``inf`` where the sum diverges)."""
    k = _window(mu_p, mu_q, shift=shift, alpha=alpha)
    log_p = skellam_logpmf(k - shift, mu_p)
    log_q = skellam_logpmf(k, mu_q)
    terms = alpha * log_p + (1.0 - alpha) * log_q
    return _checked_logsumexp(terms) / (alpha - 1.0)


def renyi_product(
    alpha: float, mu_p: float, mu_q: float, shifts: Sequence[int], dimension: int
) -> float:
    """``D_α(v + Sk(μ_p)^d ‖ Sk(μ_q)^d)`` for the shift v whose non-zero coordinates are
    ``shifts`` (the other ``d − len(shifts)`` coordinates differ only in the noise law)."""
    if len(shifts) > dimension:
        raise ValueError("more shifted coordinates than the dimension")
    same = 0.0 if mu_p == mu_q else renyi_1d(alpha, mu_p, mu_q)
    return sum(renyi_1d(alpha, mu_p, mu_q, s) for s in shifts) + (dimension - len(shifts)) * same


def poisson_remove(
    alpha: int, rate: float, mu_p: float, mu_q: float, shifts: Sequence[int], dimension: int
) -> float:
    """``D_α((1 − q)Q + qP ‖ Q)`` at an integer order, with ``P = v + Sk(μ_p)^d`` and
    ``Q = Sk(μ_q)^d``: the Poisson-sampled release against the one without the agent."""
    if alpha < 2 or alpha != int(alpha):
        raise ValueError("the binomial expansion needs an integer order >= 2")
    if rate == 1.0:
        return renyi_product(alpha, mu_p, mu_q, shifts, dimension)
    terms = []
    for j in range(alpha + 1):
        # E_Q[L^0] = E_Q[L] = 1: P and Q are probability laws on the same support
        log_moment = 0.0 if j <= 1 else (j - 1) * renyi_product(j, mu_p, mu_q, shifts, dimension)
        log_binomial = (
            special.gammaln(alpha + 1) - special.gammaln(j + 1) - special.gammaln(alpha - j + 1)
        )
        terms.append(
            log_binomial + (alpha - j) * math.log1p(-rate) + j * math.log(rate) + log_moment
        )
    return float(special.logsumexp(terms)) / (alpha - 1)


def poisson_add_1d(alpha: float, rate: float, mu_p: float, mu_q: float, shift: int) -> float:
    """``D_α(Q ‖ (1 − q)Q + qP)`` in one dimension, summed directly over the window."""
    k = _window(mu_p, mu_q, shift=shift, alpha=alpha)
    log_p = skellam_logpmf(k - shift, mu_p)
    log_q = skellam_logpmf(k, mu_q)
    log_mix = np.logaddexp(math.log1p(-rate) + log_q, math.log(rate) + log_p)
    terms = alpha * log_q + (1.0 - alpha) * log_mix
    return _checked_logsumexp(terms) / (alpha - 1.0)
