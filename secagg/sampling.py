"""Exact, vectorised Bernoulli(F·exp(−G)) and discrete Laplace sampling from a CSPRNG stream.

:func:`bernoulli_exp` decides ``U < p`` for a whole array by lazy comparison: a float estimate of
p with a rigorous error bound settles almost every entry from the first 52 bits of U, and the
rare undecided ones are resolved exactly (``decimal`` brackets of p, more bits of U) until the
intervals separate. Floating point only decides when the exact arithmetic runs, never the
answer, which avoids both leaky float samplers (Mironov 2012) and per-element Python loops.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from .errors import ParameterError
from .randomness import RandomStream

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: Exact (F, G) of p = F·exp(−G) for one index of the batch.
ExactProbability = Callable[[int], tuple[Fraction, Fraction]]

_TOP_BITS = 52
_SCALE = 2.0**-_TOP_BITS
_EXP_SLACK = 2.0**-50


class _LazyUniform:
    """One uniform U ∈ [0, 1) whose binary expansion is drawn only as far as a comparison needs."""

    __slots__ = ("_bits", "_numerator", "_stream")

    def __init__(self, top: int, stream: RandomStream) -> None:
        self._numerator, self._bits, self._stream = top, _TOP_BITS, stream

    def below(self, f: Fraction, g: Fraction) -> bool:
        """U < F·exp(−G), decided exactly (F ≥ 0; G any rational)."""
        if f <= 0:
            return False
        precision = 40
        while True:
            ctx = decimal.Context(
                prec=precision,
                rounding=decimal.ROUND_HALF_EVEN,
                Emin=decimal.MIN_EMIN,
                Emax=decimal.MAX_EMAX,
            )
            g_dec = ctx.divide(decimal.Decimal(g.numerator), decimal.Decimal(g.denominator))
            e_dec = ctx.exp(-g_dec)
            # relative error of e_dec: ½ulp from the division amplified by |G|, ½ulp from exp
            eta = Fraction(abs(g) + 2) * Fraction(10) ** (1 - precision)
            center = Fraction(e_dec) * f
            if Fraction(self._numerator + 1, 1 << self._bits) <= center * (1 - eta):
                return True
            if Fraction(self._numerator, 1 << self._bits) >= center * (1 + eta):
                return False
            self._numerator = (self._numerator << 64) | int(self._stream.uint64(1)[0])
            self._bits += 64
            precision += 30


def _uniform_tops(count: int, stream: RandomStream) -> FloatArray:
    """The first 52 bits of ``count`` uniforms, as exact floats in [0, 2^52)."""
    return (stream.uint64(count) >> np.uint64(64 - _TOP_BITS)).astype(np.float64)


def bernoulli_exp(
    log_p: FloatArray,
    error: FloatArray | float,
    exact: ExactProbability,
    stream: RandomStream,
) -> BoolArray:
    """Exact Bernoulli(p_i) for each i, given float log p_i with absolute error ≤ ``error``.

    Args:
        log_p: float approximation of log p_i (≤ about 0; p_i may not exceed 1).
        error: rigorous bound on |log p_i − computed log p_i| (scalar or per entry).
        exact: returns the exact (F, G) with p_i = F·exp(−G), called for undecided entries only.
        stream: the CSPRNG stream U comes from.
    """
    count = log_p.size
    if count == 0:
        return np.zeros(0, dtype=np.bool_)
    u_top = _uniform_tops(count, stream)
    with np.errstate(over="ignore", under="ignore"):
        p_lo = np.exp(log_p - error) * (1.0 - _EXP_SLACK)
        p_hi = np.exp(log_p + error) * (1.0 + _EXP_SLACK)
    u_lo = u_top * _SCALE
    u_hi = (u_top + 1.0) * _SCALE
    accept = u_hi <= p_lo
    undecided = ~accept & (u_lo < p_hi)
    for i in np.flatnonzero(undecided):
        f, g = exact(int(i))
        accept[i] = _LazyUniform(int(u_top[i]), stream).below(f, g)
    return accept


def bernoulli_half(count: int, stream: RandomStream) -> BoolArray:
    """``count`` fair coins."""
    raw = np.frombuffer(stream.read((count + 7) // 8), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:count].astype(np.bool_)


def geometric_exp(scale: int, count: int, stream: RandomStream) -> IntArray:
    """``count`` exact samples of X with P[X ≥ x] = exp(−x/scale), x = 0, 1, 2, ...

    X = ⌊−scale·ln U⌋ for one uniform U per sample. The float logarithm brackets −scale·ln U
    within a relative 2^−50 (a few ulps); when the bracket holds one integer, that is X. Otherwise
    (the bracket straddles an integer: probability about 2^−50·X per sample) X is found exactly:
    X ≥ x ⇔ U < exp(−x/scale), decided by the lazy uniform.
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ParameterError(f"the geometric scale must be an integer ≥ 1, got {scale!r}")
    u_top = _uniform_tops(count, stream)
    with np.errstate(divide="ignore"):
        low = -scale * np.log((u_top + 1.0) * _SCALE) * (1.0 - _EXP_SLACK)
        high = -scale * np.log(u_top * _SCALE) * (1.0 + _EXP_SLACK)
    x_low = np.floor(low)
    out = x_low.astype(np.int64)
    scale_frac = Fraction(scale)
    for i in np.flatnonzero(np.floor(high) != x_low):
        lazy = _LazyUniform(int(u_top[i]), stream)
        x = int(out[i])
        while lazy.below(Fraction(1), Fraction(x + 1) / scale_frac):
            x += 1
        out[i] = x
    return out


def discrete_laplace(scale: int, count: int, stream: RandomStream) -> IntArray:
    """``count`` exact samples with P[X = x] ∝ exp(−|x|/scale), ``scale`` a positive integer.

    The output distribution of Canonne, Kamath & Steinke (2020), Algorithm 2, drawn with one
    uniform per magnitude (:func:`geometric_exp`) instead of their loop of Bernoulli trials: a
    magnitude with P ∝ exp(−x/scale), a random sign, and (sign −, magnitude 0) rejected so that 0
    is not counted twice.
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ParameterError(f"the discrete Laplace scale must be an integer ≥ 1, got {scale!r}")
    out = np.empty(count, dtype=np.int64)
    todo = np.arange(count)
    while todo.size:
        x = geometric_exp(scale, todo.size, stream)
        negative = bernoulli_half(todo.size, stream)
        ok = ~(negative & (x == 0))
        out[todo[ok]] = np.where(negative, -x, x)[ok]
        todo = todo[~ok]
    return out
