"""A fractional-order moment bound from integer-order ones, by a verified polynomial majorant.

If ``p(x) ≥ x^α`` on the support and ``p`` has non-negative coefficients beyond degree 1, then
``E[X^α] ≤ E[p(X)]``, bounded by the integer moments (weak duality). An LP (HiGHS) proposes the
coefficients; soundness rests only on the check of ``p ≥ x^α`` on the whole half-line made here.
Used for the Poisson-subsampled Skellam; derivation, check and numbers:
docs/accounting.md#skellam-at-fractional-orders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from scipy import optimize

__all__ = ["fractional_moment_log_bound"]

#: Relative float64 margin on the final moment (a sum of a few dozen non-negative terms).
_ROUNDING_MARGIN = 1e-9
#: Cells of the verification grid: x_{k+1} = x_k·(1 + _CELL).
_CELL = 1e-3
#: The verification gives up (returns +inf) past this many cells or this end point.
_MAX_CELLS = 2_000_000
_MAX_END = 1e8


def _lp_coefficients(
    alpha: float, lower: float, js: list[int], log_m: np.ndarray
) -> tuple[float, float, np.ndarray] | None:
    """Dual coefficients of the grid LP (a candidate majorant), or None if the LP failed."""
    top = float(np.max(log_m / np.asarray(js, dtype=np.float64)))
    end = max(4.0, 2.0 * lower, math.exp(min(top + 30.0 / js[-1], 50.0)))
    xs = np.unique(
        np.concatenate(
            [np.linspace(lower, min(3.0, end), 200), np.geomspace(max(lower, 1e-6), end, 200)]
        )
    )
    xs = xs[xs >= lower]
    logx = np.log(np.maximum(xs, 1e-300))
    log_a = np.asarray(js, dtype=np.float64)[:, None] * logx[None, :] - log_m[:, None]
    # column scaling keeps every coefficient ≤ 1 (HiGHS reads 1e20 as infinite)
    scale = np.maximum(0.0, np.maximum(log_a.max(axis=0), alpha * logx))
    weight = np.exp(-scale)
    res = optimize.linprog(
        -np.exp(alpha * logx - scale),
        A_ub=np.exp(log_a - scale[None, :]),
        b_ub=np.ones(len(js)),
        A_eq=np.vstack([weight, xs * weight]),
        b_eq=[1.0, 1.0],
        bounds=(0.0, None),
        method="highs",
    )
    if res.status != 0:
        return None
    c0 = -float(res.eqlin.marginals[0])
    c1 = -float(res.eqlin.marginals[1])
    cj = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0) / np.exp(log_m)
    return c0, c1, cj


def _deficit(
    alpha: float, lower: float, c0: float, c1: float, js: np.ndarray, cj: np.ndarray
) -> float:
    """How much ``p − x^α`` may dip below 0 on ``[lower, ∞)`` (≥ 0), or +inf if unverifiable."""
    above = (js > alpha) & (cj > 0.0)
    if not above.any():
        return math.inf
    k = int(np.nonzero(above)[0][-1])
    n, cn = float(js[k]), float(cj[k])
    end = max(
        1.0,
        lower,
        (3.0 / cn) ** (1.0 / (n - alpha)),
        (3.0 * abs(c0) / cn) ** (1.0 / n),
        (3.0 * abs(c1) / cn) ** (1.0 / (n - 1.0)),
    )
    if not math.isfinite(end) or end > _MAX_END:
        return math.inf
    cells = math.ceil(math.log(end / lower) / math.log1p(_CELL)) + 1
    if cells > _MAX_CELLS:
        return math.inf
    a = lower * np.power(1.0 + _CELL, np.arange(cells, dtype=np.float64))
    b = a * (1.0 + _CELL)
    h = b - a
    jf = js.astype(np.float64)[:, None]
    cjc = cj[:, None]
    g = c0 + c1 * a + np.sum(cjc * a[None, :] ** jf, axis=0) - a**alpha
    g1 = c1 + np.sum(cjc * jf * a[None, :] ** (jf - 1.0), axis=0) - alpha * a ** (alpha - 1.0)
    second = np.sum(cjc * jf * (jf - 1.0) * b[None, :] ** np.maximum(jf - 2.0, 0.0), axis=0)
    second += alpha * (alpha - 1.0) * np.maximum(a ** (alpha - 2.0), b ** (alpha - 2.0))
    size = abs(c0) + abs(c1) * b + np.sum(cjc * b[None, :] ** jf, axis=0) + b**alpha
    low = np.minimum(g, g + g1 * h) - 0.5 * second * h * h - 1e-12 * size
    worst = float(np.min(low))
    if not math.isfinite(worst):
        return math.inf
    return max(0.0, -worst)


def fractional_moment_log_bound(
    alpha: float, lower: float, log_moments: Mapping[int, float]
) -> float:
    """An upper bound on ``log E[X^α]`` for X ≥ ``lower`` > 0, ``E[X] = 1``,
    ``log E[X^j] ≤ log_moments[j]`` (integers j ≥ 2); +inf when no majorant is verified.

    Args:
        alpha: a real order > 1.
        lower: the least value X can take (``1 − γ`` for a Poisson-subsampled mixture).
        log_moments: upper bounds on ``log E[X^j]``; non-finite ones are ignored.
    """
    js = sorted(j for j, v in log_moments.items() if j >= 2 and math.isfinite(v) and v < 600.0)
    if not js or js[-1] <= alpha or not lower > 0.0:
        return math.inf
    log_m = np.array([float(log_moments[j]) for j in js], dtype=np.float64)
    found = _lp_coefficients(float(alpha), float(lower), js, log_m)
    if found is None:
        return math.inf
    c0, c1, cj = found
    js_arr = np.asarray(js, dtype=np.int64)
    c0 += _deficit(float(alpha), float(lower), c0, c1, js_arr, cj)
    if not math.isfinite(c0):
        return math.inf
    moment = c0 + c1 + float(np.sum(cj * np.exp(log_m)))
    if not moment > 0.0:
        return math.inf
    return math.log(moment * (1.0 + _ROUNDING_MARGIN))
