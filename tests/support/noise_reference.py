"""The straightforward Poisson/Skellam samplers the fast paths of ``dpfl.secagg`` must reproduce.

Every step per entry, with per-entry error bounds and two transcendental bounds per comparison:
the samplers in ``mechanisms/noise.py`` and ``mechanisms/exact_draws.py`` take the same randomness
from the stream in the same order and must return the same samples
(tests/unit/mechanisms/test_noise_fast.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpfl.mechanisms.exact_draws import (
    _EXP_SLACK,
    _SCALE,
    _TOP_BITS,
    FloatArray,
    IntArray,
    _LazyUniform,
    bernoulli_half,
)
from dpfl.mechanisms.noise import _envelope_log_max, _exact_pmf_ratio, _log_pmf_ratio
from dpfl.secagg.randomness import RandomStream


def uniform_tops(count: int, stream: RandomStream) -> FloatArray:
    return (stream.uint64(count) >> np.uint64(64 - _TOP_BITS)).astype(np.float64)


def bernoulli_exp(log_p, error, exact, stream: RandomStream):  # type: ignore[no-untyped-def]
    u_top = uniform_tops(log_p.size, stream)
    p_lo = np.exp(log_p - error) * (1.0 - _EXP_SLACK)
    p_hi = np.exp(log_p + error) * (1.0 + _EXP_SLACK)
    accept = (u_top + 1.0) * _SCALE <= p_lo
    undecided = ~accept & (u_top * _SCALE < p_hi)
    for i in np.flatnonzero(undecided):
        f, g = exact(int(i))
        accept[i] = _LazyUniform(int(u_top[i]), stream).below(f, g)
    return accept


def geometric(scale: int, count: int, stream: RandomStream) -> IntArray:
    u_top = uniform_tops(count, stream)
    with np.errstate(divide="ignore"):
        low = -scale * np.log((u_top + 1.0) * _SCALE) * (1.0 - _EXP_SLACK)
        high = -scale * np.log(u_top * _SCALE) * (1.0 + _EXP_SLACK)
    out = np.floor(low).astype(np.int64)
    for i in np.flatnonzero(np.floor(high) != np.floor(low)):
        lazy = _LazyUniform(int(u_top[i]), stream)
        x = int(out[i])
        while lazy.below(Fraction(1), Fraction(x + 1) / Fraction(scale)):
            x += 1
        out[i] = x
    return out


def discrete_laplace(scale: int, count: int, stream: RandomStream) -> IntArray:
    out = np.empty(count, dtype=np.int64)
    todo = np.arange(count)
    while todo.size:
        x = geometric(scale, todo.size, stream)
        negative = bernoulli_half(todo.size, stream)
        ok = ~(negative & (x == 0))
        out[todo[ok]] = np.where(negative, -x, x)[ok]
        todo = todo[~ok]
    return out


def poisson(lam: float, count: int, stream: RandomStream) -> IntArray:
    m = math.floor(lam)
    s = max(1, round(math.sqrt(lam)))
    big_m = _envelope_log_max(lam, m, s)
    rel = 2.0**-46
    out = np.empty(count, dtype=np.int64)
    todo = np.arange(count)
    while todo.size:
        k = discrete_laplace(s, todo.size, stream)
        ok = (m + k) >= 0
        kv = k[ok]
        f, err = _log_pmf_ratio(lam, m, kv)
        log_a = f + np.abs(kv) / s - big_m
        err = err + rel * (np.abs(kv) / s + abs(big_m))

        def exact(i: int, kv: IntArray = kv) -> tuple[Fraction, Fraction]:
            ki = int(kv[i])
            return _exact_pmf_ratio(Fraction(lam), m, ki), Fraction(big_m) - Fraction(abs(ki), s)

        accepted = np.zeros(todo.size, dtype=np.bool_)
        accepted[np.flatnonzero(ok)] = bernoulli_exp(log_a, err, exact, stream)
        out[todo[accepted]] = m + k[accepted]
        todo = todo[~accepted]
    return out


def skellam(mu: float, count: int, stream: RandomStream) -> IntArray:
    return poisson(mu, count, stream) - poisson(mu, count, stream)
