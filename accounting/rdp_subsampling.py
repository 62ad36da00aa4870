"""RDP amplification by subsampling for any inner mechanism, and the convexity extension.

Pure functions of RDP curves given at the integer orders ``2..A`` (``inner[m]`` for order ``m``):
Poisson sampling (Zhu & Wang 2019; the exact symmetric expansion for symmetric pairs), sampling
without replacement (Wang, Balle & Kasiviswanathan 2019, general and Gaussian), and fractional
orders by convexity. Which theorem each function applies, and why:
docs/accounting.md#subsampling-bounds-for-any-inner-mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray
from scipy import special

__all__ = [
    "integer_orders_needed",
    "interpolate_fractional",
    "poisson_general_rdp",
    "poisson_symmetric_rdp",
    "without_replacement_gaussian_rdp",
    "without_replacement_general_rdp",
]

FloatArray = NDArray[np.float64]


def integer_orders_needed(orders: Sequence[float]) -> int:
    """The largest integer order a bound on ``orders`` needs (ceil of the largest order)."""
    return max(2, math.ceil(max(orders)))


def _log_binom(n: int, k: FloatArray) -> FloatArray:
    out: FloatArray = (
        special.gammaln(n + 1.0) - special.gammaln(k + 1.0) - special.gammaln(n - k + 1.0)
    )
    return out


def poisson_general_rdp(rate: float, inner: FloatArray, alpha: int) -> float:
    """Zhu & Wang 2019, Thm. 6, at integer ``alpha ≥ 2`` (``inner[m]`` = inner RDP at order m)."""
    g = float(rate)
    if g >= 1.0:
        return float(inner[alpha])
    log1mg = math.log1p(-g)
    terms = [
        (alpha - 1) * log1mg + math.log(alpha * g - g + 1.0),
        float(_log_binom(alpha, np.array(2.0))) + 2 * math.log(g) + (alpha - 2) * log1mg + inner[2],
    ]
    if alpha >= 3:
        ell = np.arange(3, alpha + 1, dtype=np.float64)
        rest = (
            math.log(3.0)
            + _log_binom(alpha, ell)
            + (alpha - ell) * log1mg
            + ell * math.log(g)
            + (ell - 1.0) * inner[3 : alpha + 1]
        )
        terms.extend(rest.tolist())
    bound = float(special.logsumexp(terms)) / (alpha - 1)
    return min(max(bound, 0.0), float(inner[alpha]))


#: Relative inflation of :func:`poisson_symmetric_rdp` (float64 rounding of a sum of non-negative
#: terms and of log1p is below ~1e-13 relative).
_SYMMETRIC_ROUNDING_MARGIN = 1e-11


def poisson_symmetric_rdp(rate: float, inner: FloatArray, alpha: int) -> float:
    """RDP at integer ``alpha ≥ 2`` of Poisson sampling of a mechanism with SYMMETRIC pairs.

    ``inner[m]`` bounds ``D_m(P‖Q)`` for every neighbouring pair ``P = M(S ∪ {x})``,
    ``Q = M(S)`` at each integer m in 2..alpha. The bound is

        ε'(α) = log(1 + Σ_{j=2..α} C(α,j)·(1−γ)^{α−j}·γ^j·(e^{(j−1)·ε(j)} − 1)) / (α−1),

    which is ``log((1−γ)^{α−1}(1+(α−1)γ) + Σ_{j≥2} C(α,j)(1−γ)^{α−j}γ^j e^{(j−1)ε(j)})/(α−1)``
    written without cancellation (the j = 0, 1 terms and the "−1"s sum to zero exactly).

    **Remove direction**, any mechanism: with ``L = dP/dQ``,
    ``e^{(α−1)·D_α((1−γ)Q+γP ‖ Q)} = E_Q[(1−γ+γL)^α] = Σ_j C(α,j)(1−γ)^{α−j}γ^j E_Q[L^j]`` and
    ``E_Q[L^j] = e^{(j−1)·D_j(P‖Q)}`` (binomial theorem; for the Gaussian this is the exact RDP of
    Mironov, Talwar & Zhang 2019, and it is the expression Steinke 2022, arXiv:2210.00597, and Zhu
    & Wang 2019 state for Poisson sampling). It is increasing in each ``ε(j)``.

    **Add direction**, ``D_α(Q ‖ (1−γ)Q+γP)``: the expansion is not an identity for it, and for a
    general pair it can exceed the remove direction (tests/unit/accounting/
    test_subsampled_skellam.py has a two-point example); Zhu & Wang's general bound pays for it
    with the factor 3. It is bounded by the remove direction when the pair is *symmetric*: P and
    Q mutually absolutely continuous and the law of ``L`` under Q equals the law of ``1/L`` under
    P. Proof (docs/accounting.md): the add-direction moment is
    ``E_Q[f_A(L)]``, ``f_A(t) = (1−γ+γt)^{1−α}``, the remove one ``E_Q[f_R(L)]``,
    ``f_R(t) = (1−γ+γt)^α``; symmetry gives ``E_Q[f(L)] = E_Q[L·f(1/L)]`` for f ≥ 0, so
    ``E_Q[f_R(L)] − E_Q[f_A(L)] = E_Q[ĝ(L)]`` with ``2ĝ(t) = g(t) + t·g(1/t)``, ``g = f_R − f_A``.
    For t ≥ 1, with ``h = γ(t−1)``, ``ψ(x) = x^α − x^{1−α}`` and ``F(s) = s·ψ(1 + h/s)``:
    ``2ĝ(t) = F(1) − F(t−h)``; ψ is convex on [1, ∞) (``ψ'' = α(α−1)(x^{α−2} − x^{−α−1}) ≥ 0``)
    with ψ(1) = 0, so the perspective F is non-increasing, and ``t − h ≥ 1`` gives ĝ(t) ≥ 0;
    for t < 1, ``ĝ(t) = t·ĝ(1/t) ≥ 0``. Hence ``D_α(Q‖mix) ≤ D_α(mix‖Q)`` at every α > 1 (for the
    Gaussian this is MTZ19's Thm. 5).

    **When the hypothesis holds**: additive noise with a symmetric law N (``N(x) = N(−x)``) of
    full support on the lattice, ``Q = N(· − c)``, ``P = N(· − c − v)``: the reflection
    ``x ↦ 2c + v − x`` swaps P and Q, so the pair is symmetric. The multidimensional Skellam
    mechanism (product of ``Poisson(μ) − Poisson(μ)``, integer query) is such a mechanism for
    every shift v, and Poisson sampling reduces to these pairs by joint quasi-convexity of D_α
    over the other records' sample (van Erven & Harremoës 2014, Thm. 13). It does NOT hold when
    the inner mechanism's noise itself depends on whether x takes part, nor, in general, for an
    adaptive composition of several releases on one sample; callers use it for a bare Skellam
    event only.

    Args:
        rate: γ in (0, 1].
        inner: ``inner[m]`` = an upper bound on ``D_m(P‖Q)`` for m = 2..alpha (inf allowed).
        alpha: the integer order ≥ 2.

    Returns:
        The bound, also capped by ``inner[alpha]`` (sampling never increases the divergence).
    """
    g = float(rate)
    if g >= 1.0:
        return float(inner[alpha])
    j = np.arange(2, alpha + 1, dtype=np.float64)
    eps = np.asarray(inner[2 : alpha + 1], dtype=np.float64)
    if not np.all(np.isfinite(eps)):
        return float(inner[alpha])
    x = (j - 1.0) * np.maximum(eps, 0.0)
    log_expm1 = np.empty_like(x)  # log(e^x − 1), stable at both ends
    big = x > 30.0
    log_expm1[big] = x[big] + np.log1p(-np.exp(-x[big]))
    with np.errstate(divide="ignore"):  # ε(j) = 0: the term vanishes (log 0 = −inf)
        log_expm1[~big] = np.log(np.expm1(x[~big]))
    terms = _log_binom(alpha, j) + (alpha - j) * math.log1p(-g) + j * math.log(g) + log_expm1
    log_a_minus_1 = float(special.logsumexp(terms))
    bound = float(np.logaddexp(0.0, log_a_minus_1)) / (alpha - 1)
    bound *= 1.0 + _SYMMETRIC_ROUNDING_MARGIN
    return min(max(bound, 0.0), float(inner[alpha]))


def without_replacement_general_rdp(ratio: float, inner: FloatArray, alpha: int) -> float:
    """Wang, Balle & Kasiviswanathan 2019, Thm. 9 with ``ε(∞) = ∞``, at integer ``alpha ≥ 2``."""
    g = float(ratio)
    if g >= 1.0:
        return float(inner[alpha])
    e2 = float(inner[2])
    # min{4·(e^{ε(2)} − 1), 2·e^{ε(2)}} in log space
    log_first = min(
        math.log(4.0) + (e2 + math.log1p(-math.exp(-e2)) if e2 > 0 else -math.inf),
        math.log(2.0) + e2,
    )
    terms = [0.0, 2 * math.log(g) + float(_log_binom(alpha, np.array(2.0))) + log_first]
    if alpha >= 3:
        j = np.arange(3, alpha + 1, dtype=np.float64)
        rest = (
            j * math.log(g)
            + _log_binom(alpha, j)
            + math.log(2.0)
            + (j - 1.0) * inner[3 : alpha + 1]
        )
        terms.extend(rest.tolist())
    bound = float(special.logsumexp(terms)) / (alpha - 1)
    return min(max(bound, 0.0), float(inner[alpha]))


def _dp_accounting_wor_gaussian(
    population: int, sample_size: int, noise_multiplier: float, alphas: Sequence[int]
) -> FloatArray:
    """dp_accounting's Theorem-27 bound; ``noise_multiplier`` is std / replace-one sensitivity.

    dp_accounting (0.6) feeds the multiplier of ``GaussianDpEvent`` straight into the base RDP
    ``α/(2z²)``, i.e. it treats it as relative to the replace-one sensitivity (its upstream
    issue #378 / PR #464 discuss changing that). We pass exactly that ratio, and the tests pin this
    behaviour against an independent computation so that a change upstream cannot go unnoticed.
    """
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant(
        orders=[float(a) for a in alphas],
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    accountant.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(
            population, sample_size, dp_accounting.GaussianDpEvent(noise_multiplier)
        )
    )
    out: FloatArray = np.asarray(accountant.rdp, dtype=np.float64)
    return out


#: dp_accounting computes Theorem 27 exactly up to this order (above, it falls back to Thm. 9).
_DPA_MAX_ALPHA = 256


def without_replacement_gaussian_rdp(
    *, population: int, sample_size: int, noise_multiplier: float, alphas: Sequence[int]
) -> FloatArray:
    """RDP at integer ``alphas`` of sampling without replacement + Gaussian (replace-one).

    Args:
        population: n.
        sample_size: m ≤ n.
        noise_multiplier: the noise std divided by the **replace-one** L2 sensitivity.
        alphas: integer orders ≥ 2.
    """
    g = sample_size / population
    z = float(noise_multiplier)
    top = max(alphas)
    inner = np.arange(top + 1, dtype=np.float64) / (2.0 * z * z)
    general = np.array([without_replacement_general_rdp(g, inner, a) for a in alphas])
    if g >= 1.0:
        return general
    small = [a for a in alphas if a <= _DPA_MAX_ALPHA]
    if small:
        tight = dict(
            zip(small, _dp_accounting_wor_gaussian(population, sample_size, z, small), strict=True)
        )
        for i, a in enumerate(alphas):
            if a in tight and math.isfinite(tight[a]) and tight[a] >= 0.0:
                general[i] = min(general[i], tight[a])
    return general


def interpolate_fractional(cgf_at: Callable[[int], float], orders: Sequence[float]) -> FloatArray:
    """Extend a bound known at integer orders to any orders, by convexity of the CGF.

    Args:
        cgf_at: ``m -> (m−1)·RDP(m)`` for integer m ≥ 1 (must return 0 at m = 1).
        orders: orders > 1.

    Returns:
        ``RDP(α) ≤ ((1−t)·K(⌊α⌋) + t·K(⌊α⌋+1))/(α−1)`` with ``t = α − ⌊α⌋`` (exact at integers).
    """
    out = np.empty(len(orders), dtype=np.float64)
    for i, a in enumerate(orders):
        a = float(a)
        if a.is_integer():
            out[i] = cgf_at(int(a)) / (a - 1.0)
            continue
        lo = math.floor(a)
        t = a - lo
        k = (1.0 - t) * cgf_at(lo) + t * cgf_at(lo + 1)
        out[i] = k / (a - 1.0)
    return out
