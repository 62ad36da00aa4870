"""Exact RDP of the Poisson-subsampled Gaussian mechanism at integer and fractional orders.

Mironov, Talwar & Zhang 2019, written as the expectation of a non-negative function so that there
is no cancellation: integer orders by the binomial expansion in log space, fractional orders by
the trapezoid rule, each inflated slightly to stay an upper bound and capped by convexity between
integer orders. Derivation and error bounds:
docs/accounting.md#exact-rdp-of-the-subsampled-gaussian.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from scipy import special

__all__ = ["gaussian_rdp", "poisson_subsampled_gaussian_rdp"]

FloatArray = NDArray[np.float64]

#: Relative inflation of quadrature results (their error is ~1e-15 relative).
_QUADRATURE_MARGIN = 1e-10
#: Relative inflation of the exact integer-order sums (floating-point rounding, ≤ ~1e-13).
_ROUNDING_MARGIN = 1e-11
#: Above this many grid points per order the convexity bound is used instead of quadrature.
_MAX_GRID = 60_000
#: Tail cut of the quadrature range, in standard deviations.
_TAIL = 13.0
#: Below this |y| the series of h_α is used.
_SERIES_RADIUS = 0.1
_SERIES_TERMS = 24


def gaussian_rdp(noise_multiplier: float, orders: Sequence[float]) -> FloatArray:
    """``α/(2z²)``: the RDP of the Gaussian mechanism with noise multiplier ``z`` (Mironov 2017)."""
    a = np.asarray(orders, dtype=np.float64)
    return a / (2.0 * noise_multiplier**2)


def _log_expm1(x: FloatArray) -> FloatArray:
    """``log(exp(x) − 1)`` for ``x > 0``, stable at both ends."""
    out = np.empty_like(x)
    big = x > 30.0
    out[big] = x[big] + np.log1p(-np.exp(-x[big]))
    out[~big] = np.log(np.expm1(x[~big]))
    return out


def _log_a_minus_1_integer(q: float, z: float, alpha: int) -> float:
    """``log(A_α − 1)`` for integer ``α ≥ 2`` by the exact binomial sum."""
    i = np.arange(2, alpha + 1, dtype=np.float64)
    log_binom = (
        special.gammaln(alpha + 1.0) - special.gammaln(i + 1.0) - special.gammaln(alpha - i + 1.0)
    )
    terms = (
        log_binom
        + i * math.log(q)
        + (alpha - i) * math.log1p(-q)
        + _log_expm1((i * i - i) / (2.0 * z * z))
    )
    return float(special.logsumexp(terms))


def _trapezoid_step(z: float) -> float:
    """The quadrature step for noise multiplier ``z``.

    The integrand ``φ_z(x)·h_α(y(x))`` is analytic in the strip ``|Im x| < π·z²`` (the first
    singularity of ``log(1 + y)``). For a strip half-height ``b`` the trapezoid error is about
    ``exp(−2π·b/step + b²/(2z²))`` (the second factor is the growth of the Gaussian off the real
    axis). With ``b = min(π·z²/2, 6·z)`` and ``step = min(z/8, z²/6)`` the exponent is below −40.
    """
    return min(z / 8.0, z * z / 6.0)


def _log_h(y: FloatArray, alpha: float) -> FloatArray:
    """``log h_α(y)`` with ``h_α(y) = (1+y)^α − 1 − α·y``, for ``y > −1``, α > 1 (so h ≥ 0)."""
    out = np.empty_like(y)
    small = np.abs(y) <= _SERIES_RADIUS
    if small.any():
        ys = y[small]
        # Σ_{k≥2} C(α,k)·y^k by Horner on the coefficients C(α,k); dominated by k = 2, no
        # cancellation for |y| ≤ 0.1 (the k = 3 term is at most (α−2)/3·0.1 of it).
        coef = [1.0, alpha]
        for k in range(2, _SERIES_TERMS + 1):
            coef.append(coef[-1] * (alpha - k + 1) / k)
        acc = np.full_like(ys, coef[_SERIES_TERMS])
        for k in range(_SERIES_TERMS - 1, 1, -1):
            acc = acc * ys + coef[k]
        with np.errstate(divide="ignore"):  # y = 0 exactly gives h = 0
            out[small] = np.log(acc) + 2.0 * np.log(np.abs(ys))
    pos = y > _SERIES_RADIUS
    if pos.any():
        yp = y[pos]
        la = alpha * np.log1p(yp)
        # h = (1+y)^α·(1 − (1+α·y)·(1+y)^−α); the ratio is ≤ 0.9999 here, and is formed in log
        # space because α·y may overflow.
        log_ratio = np.logaddexp(0.0, math.log(alpha) + np.log(yp)) - la
        out[pos] = la + np.log1p(-np.exp(log_ratio))
    neg = y < -_SERIES_RADIUS
    if neg.any():
        yn = y[neg]
        out[neg] = np.log(np.power(1.0 + yn, alpha) - 1.0 - alpha * yn)
    return out


def _log_a_minus_1_fractional(q: float, z: float, alphas: Sequence[float]) -> list[float]:
    """``log(A_α − 1)`` for each α by quadrature (NaN where the grid would be too fine)."""
    step = _trapezoid_step(z)
    hi_alpha = max(alphas)
    lo, hi = -_TAIL * z, hi_alpha + _TAIL * z + 1.0
    n = math.ceil((hi - lo) / step)
    if n > _MAX_GRID:
        return [math.nan] * len(alphas)
    x = lo + step * np.arange(n + 1, dtype=np.float64)
    log_phi = -0.5 * (x / z) ** 2 - math.log(z * math.sqrt(2.0 * math.pi))
    # y = q·expm1(w) with w = (2x−1)/(2z²); for large w compute it in a form that cannot overflow.
    w = (2.0 * x - 1.0) / (2.0 * z * z)
    with np.errstate(over="ignore"):
        y = q * np.expm1(w)
    out = []
    for alpha in alphas:
        finite = np.isfinite(y)
        log_int = np.full_like(x, -np.inf)
        log_int[finite] = log_phi[finite] + _log_h(y[finite], alpha)
        if not finite.all():
            # y = ∞ in floating point: h ≈ (q·e^w)^α; only far in the upper tail.
            wf = w[~finite]
            log_int[~finite] = log_phi[~finite] + alpha * (math.log(q) + wf)
        out.append(float(special.logsumexp(log_int)) + math.log(step))
    return out


def poisson_subsampled_gaussian_rdp(
    *, sampling_rate: float, noise_multiplier: float, orders: Sequence[float]
) -> FloatArray:
    """RDP of the Poisson-subsampled Gaussian at each order (add/remove-one neighbouring).

    Args:
        sampling_rate: q in (0, 1].
        noise_multiplier: z > 0, the noise std divided by the add/remove L2 sensitivity.
        orders: orders > 1.

    Returns:
        A float64 array, same length as ``orders`` (``inf`` where the value overflows).
    """
    q, z = float(sampling_rate), float(noise_multiplier)
    alphas = [float(a) for a in orders]
    if q >= 1.0:
        return gaussian_rdp(z, alphas)
    out = np.empty(len(alphas), dtype=np.float64)
    integer_cache: dict[int, float] = {1: 0.0}

    def cgf_integer(m: int) -> float:
        """``(m−1)·RDP(m) = log A_m``."""
        if m not in integer_cache:
            log_a = float(np.logaddexp(0.0, _log_a_minus_1_integer(q, z, m)))
            integer_cache[m] = log_a * (1.0 + _ROUNDING_MARGIN)
        return integer_cache[m]

    fractional = [a for a in alphas if not a.is_integer()]
    quad = (
        dict(zip(fractional, _log_a_minus_1_fractional(q, z, fractional), strict=True))
        if fractional
        else {}
    )
    for j, a in enumerate(alphas):
        if a.is_integer():
            out[j] = cgf_integer(int(a)) / (a - 1.0)
            continue
        lo = math.floor(a)
        t = a - lo
        convex = ((1.0 - t) * cgf_integer(lo) + t * cgf_integer(lo + 1)) / (a - 1.0)
        log_a1 = quad[a]
        if math.isnan(log_a1):
            out[j] = convex
        else:
            exact = float(np.logaddexp(0.0, log_a1)) / (a - 1.0) * (1.0 + _QUADRATURE_MARGIN)
            out[j] = min(exact, convex)
    return out
