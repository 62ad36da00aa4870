"""Exact, vectorised Bernoulli(F·exp(−G)) and discrete Laplace sampling from a CSPRNG stream.

:func:`bernoulli_exp` decides ``U < p`` for a whole array by lazy comparison: a float estimate of
p with a rigorous error bound settles almost every entry from the first 52 bits of U, and the
rare undecided ones are resolved exactly (``decimal`` brackets of p, more bits of U) until the
intervals separate. Floating point only decides when the exact arithmetic runs, never the
answer, which avoids both leaky float samplers (Mironov 2012) and per-element Python loops.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpfl.secagg.errors import ParameterError
from dpfl.secagg.randomness import RandomStream

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: Exact (F, G) of p = F·exp(−G) for one index of the batch.
ExactProbability = Callable[[int], tuple[Fraction, Fraction]]

_TOP_BITS = 52
_SCALE = 2.0**-_TOP_BITS
_EXP_SLACK = 2.0**-50
_ONE_EXP_ERROR_MAX = 0.5
_GEOMETRIC_MIN_TOP = 2.0**40  # the one-logarithm bracket needs U ≥ 2^−12


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
    words = np.frombuffer(stream.read(8 * count), dtype="<u8")
    return (words >> np.uint64(64 - _TOP_BITS)).astype(np.float64)


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
    if float(np.max(error)) <= _ONE_EXP_ERROR_MAX:
        accept, undecided = _decide_one_exp(log_p, error, u_top)
    else:
        accept, undecided = _decide_per_entry(log_p, error, u_top)
    for i in np.flatnonzero(undecided):
        f, g = exact(int(i))
        accept[i] = _LazyUniform(int(u_top[i]), stream).below(f, g)
    return accept


def _decide_per_entry(
    log_p: FloatArray, error: FloatArray | float, u_top: FloatArray
) -> tuple[BoolArray, BoolArray]:
    with np.errstate(over="ignore", under="ignore"):
        p_lo = np.exp(log_p - error) * (1.0 - _EXP_SLACK)
        p_hi = np.exp(log_p + error) * (1.0 + _EXP_SLACK)
    u_lo = u_top * _SCALE
    u_hi = (u_top + 1.0) * _SCALE
    accept = u_hi <= p_lo
    return accept, ~accept & (u_lo < p_hi)


def _decide_one_exp(
    log_p: FloatArray, error: FloatArray | float, u_top: FloatArray
) -> tuple[BoolArray, BoolArray]:
    """One exponential per entry when every error bound e ≤ 1/2.

    The computed p̂ = exp(log p̂) is within a factor e^{±e}(1 ± 2^−50) of p ≤ 1, so
    |p − p̂| ≤ p̂(2e + 2^−49) =: Δ (e^e − 1 ≤ 1.3e for e ≤ 1/2) and p̂ < 2. With u = u_top·2^−52
    exact and d = fl(u − p̂) within 2^−52 of u − p̂: U < p surely when d ≤ −(2^−52 + Δ + 2^−52),
    and U ≥ p surely when d ≥ Δ + 2^−52; in between the exact comparison decides.
    """
    with np.errstate(over="ignore", under="ignore"):
        p_hat = np.exp(log_p)
    delta = np.multiply(error, 2.0)
    delta += 2.0**-49
    delta *= p_hat
    delta += _SCALE
    d = u_top * _SCALE
    d -= p_hat
    accept = d <= -(delta + _SCALE)
    undecided = ~accept
    undecided &= d < delta
    return accept, undecided


def bernoulli_half(count: int, stream: RandomStream) -> BoolArray:
    """``count`` fair coins."""
    return _bits(count, stream).astype(np.bool_)


def _bits(count: int, stream: RandomStream) -> npt.NDArray[np.uint8]:
    raw = np.frombuffer(stream.read((count + 7) // 8), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little", count=count)


def geometric_exp(scale: int, count: int, stream: RandomStream) -> IntArray:
    """``count`` exact samples of X with P[X ≥ x] = exp(−x/scale), x = 0, 1, 2, ...

    X = ⌊−scale·ln U⌋ for one uniform U per sample (:func:`_geometric_floats`).
    """
    _check_scale("geometric", scale)
    return _geometric_floats(scale, count, stream).astype(np.int64)


def _geometric_floats(scale: int, count: int, stream: RandomStream) -> FloatArray:
    """X = ⌊−scale·ln U⌋ as exact integer-valued floats, from the top 52 bits u of each U.

    One logarithm per sample: c = −scale·ln((u + ½)·2^−52) is within scale·(½/u + 2^−49·8.4)
    ≤ scale·2^−40.9 of every value −scale·ln U can take when u ≥ 2^40, so X = ⌊c⌋ whenever c is
    farther than scale·2^−39 from an integer. The rest (u < 2^40, or c that close: probability
    about 2^−38·scale each) are bracketed by two logarithms and, where the bracket straddles an
    integer, decided exactly: X ≥ x ⇔ U < exp(−x/scale), by the lazy uniform.
    """
    u_top = _uniform_tops(count, stream)
    c = np.log((u_top + 0.5) * _SCALE)
    c *= -float(scale)
    x = np.floor(c)
    np.subtract(c, x, out=c)  # the fractional part, exact
    width = scale * 2.0**-39
    unsure = c <= width
    unsure |= c >= 1.0 - width
    unsure |= u_top < _GEOMETRIC_MIN_TOP
    for i in np.flatnonzero(unsure):
        x[i] = _geometric_one(scale, float(u_top[i]), stream)
    return x


def _geometric_one(scale: int, top: float, stream: RandomStream) -> float:
    low = -scale * math.log((top + 1.0) * _SCALE) * (1.0 - _EXP_SLACK)
    x = math.floor(low)
    if top > 0 and math.floor(-scale * math.log(top * _SCALE) * (1.0 + _EXP_SLACK)) == x:
        return float(x)
    lazy = _LazyUniform(int(top), stream)
    scale_frac = Fraction(scale)
    while lazy.below(Fraction(1), Fraction(x + 1) / scale_frac):
        x += 1
    return float(x)


def discrete_laplace(scale: int, count: int, stream: RandomStream) -> IntArray:
    """``count`` exact samples with P[X = x] ∝ exp(−|x|/scale), ``scale`` a positive integer.

    The output distribution of Canonne, Kamath & Steinke (2020), Algorithm 2, drawn with one
    uniform per magnitude (:func:`geometric_exp`) instead of their loop of Bernoulli trials: a
    magnitude with P ∝ exp(−x/scale), a random sign, and (sign −, magnitude 0) rejected so that 0
    is not counted twice.
    """
    _check_scale("discrete Laplace", scale)
    return discrete_laplace_floats(scale, count, stream).astype(np.int64)


def discrete_laplace_floats(scale: int, count: int, stream: RandomStream) -> FloatArray:
    """:func:`discrete_laplace` as exact integer-valued floats (what the samplers compute with)."""
    _check_scale("discrete Laplace", scale)
    out = np.empty(count, dtype=np.float64)
    todo: IntArray | None = None  # None: every index, in order
    size = count
    while size:
        x = _geometric_floats(scale, size, stream)
        bits = _bits(size, stream)
        sign = bits.astype(np.float64)
        sign *= -2.0
        sign += 1.0
        x *= sign  # a multiplication: much faster than a masked negation
        retry = np.flatnonzero(bits.view(np.bool_) & (x == 0.0))
        if todo is None:
            out[:] = x
            todo = retry
        else:
            out[todo] = x
            todo = todo[retry]
        size = todo.size
    return out


def _check_scale(what: str, scale: int) -> None:
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ParameterError(f"the {what} scale must be an integer ≥ 1, got {scale!r}")
