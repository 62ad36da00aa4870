"""Integer noise for secure aggregation, sampled exactly from a CSPRNG stream.

Skellam ``Sk(μ) = Poisson(μ) − Poisson(μ)`` is the default because independent Skellams sum to a
Skellam, so the summed noise is exactly what the accountant analyses; the discrete Gaussian
(Canonne, Kamath & Steinke 2020) is offered too, its sums only close to one. Each agent draws its
share of the total (:meth:`NoiseSpec.skellam_share`, :meth:`NoiseSpec.discrete_gaussian_share`;
docs/algorithms.md#distributed-noise-rule). Poisson variates come from exact rejection against a
discrete Laplace proposal, every acceptance decided exactly by
:func:`dpfl.mechanisms.exact_draws.bernoulli_exp`, in batches (docs/mechanisms.md#integer-noise).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpfl.secagg.errors import ParameterError
from dpfl.secagg.randomness import RandomStream

from .exact_draws import (
    FloatArray,
    IntArray,
    bernoulli_exp,
    discrete_laplace,
    discrete_laplace_floats,
)

MAX_POISSON_MEAN = 2.0**50
_SMALL = 32
_LOG_FACTORIAL_TABLE = np.array([math.lgamma(n + 1) for n in range(_SMALL)], dtype=np.float64)
_REL = 2.0**-46  # generous relative error of a handful of float64 operations
_TRUNCATION = 4e-14  # Stirling series remainder after the n^-5 term, n ≥ 32, plus table ulps
_ONE_TERM = 2.0**16  # from here 1/(12n) alone is S(n) within 10^-17 (see _log_acceptance_large)


def _stirling_tail(n: FloatArray) -> FloatArray:
    """S(n) = 1/(12n) − 1/(360n³) + 1/(1260n⁵) (error < 1/(1680 n⁷))."""
    inv = 1.0 / n
    inv2 = inv * inv
    return inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 / 1260.0))


def _log_factorial(n: IntArray) -> FloatArray:
    nf = n.astype(np.float64)
    big = np.maximum(nf, float(_SMALL))
    stirling = big * np.log(big) - big + 0.5 * np.log(2.0 * math.pi * big) + _stirling_tail(big)
    return np.where(n < _SMALL, _LOG_FACTORIAL_TABLE[np.minimum(n, _SMALL - 1)], stirling)


def _log_pmf_ratio(lam: float, m: int, k: IntArray) -> tuple[FloatArray, FloatArray]:
    """log(p(m+k)/p(m)) for Poisson(λ) and a rigorous error bound; requires m + k ≥ 0."""
    kf = k.astype(np.float64)
    n1 = m + k
    large = (m >= _SMALL) & (n1 >= _SMALL)
    value = np.empty(k.size, dtype=np.float64)
    error = np.empty(k.size, dtype=np.float64)
    if large.any():
        kl = kf[large]
        n1l = n1[large].astype(np.float64)
        lead = math.log1p((lam - m) / m) if m else 0.0
        r = np.log1p(kl / m)
        big_term = n1l * r
        value[large] = (
            kl * lead
            - big_term
            + kl
            - 0.5 * r
            - (_stirling_tail(n1l) - _stirling_tail(np.array(float(m))))
        )
        error[large] = _REL * (np.abs(kl) * (2.0 + abs(lead)) + np.abs(big_term) + 1.0)
    small = ~large
    if small.any():
        ks = kf[small]
        lf1 = _log_factorial(n1[small])
        lf0 = float(_log_factorial(np.array([m]))[0])
        k_log_lam = ks * math.log(lam)
        value[small] = k_log_lam - (lf1 - lf0)
        error[small] = _REL * (np.abs(k_log_lam) + np.abs(lf1) + abs(lf0) + 1.0)
    return value, error + _TRUNCATION


def _exact_pmf_ratio(lam: Fraction, m: int, k: int) -> Fraction:
    """p(m+k)/p(m) = λ^k m!/(m+k)!, exactly."""
    if k >= 0:
        return lam**k / math.prod(range(m + 1, m + k + 1))
    return Fraction(math.prod(range(m + k + 1, m + 1))) / lam ** (-k)


def _envelope_log_max(lam: float, m: int, s: int) -> float:
    """An upper bound M on max_k f(k), f(k) = log(p(m+k)/p(m)) + |k|/s (k ≥ −m)."""
    k_up = math.floor(lam * math.exp(1.0 / s) - m)
    j_down = math.floor(m - lam * math.exp(-1.0 / s)) + 1
    candidates = {0}
    candidates.update(k for k in range(k_up - 3, k_up + 4) if k >= 0)
    candidates.update(-j for j in range(j_down - 3, j_down + 4) if 0 <= j <= m)
    ks = np.array(sorted(candidates), dtype=np.int64)
    f, err = _log_pmf_ratio(lam, m, ks)
    values = f + np.abs(ks) / s + err + _REL * (np.abs(ks) / s + 1.0)
    return float(values.max())


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ParameterError(f"sample count must be an integer ≥ 0, got {count!r}")


def poisson(lam: float, count: int, stream: RandomStream) -> IntArray:
    """``count`` exact Poisson(λ) samples, 0 ≤ λ ≤ 2^50 (λ is the exact value of the float)."""
    _check_count(count)
    if not (math.isfinite(lam) and 0.0 <= lam <= MAX_POISSON_MEAN):
        raise ParameterError(f"Poisson mean must be finite in [0, 2^50], got {lam}")
    if lam == 0.0 or count == 0:
        return np.zeros(count, dtype=np.int64)
    m = math.floor(lam)
    s = max(1, round(math.sqrt(lam)))
    big_m = _envelope_log_max(lam, m, s)
    lam_exact, big_m_exact, s_exact = Fraction(lam), Fraction(big_m), Fraction(s)
    out = np.empty(count, dtype=np.int64)
    todo: IntArray | None = None  # None: every index (the first pass, without index arrays)
    size = count
    while size:
        k = discrete_laplace_floats(s, size, stream)

        large = m >= _SMALL and m + float(k.min()) >= _SMALL
        ok = None if large else (m + k) >= 0
        kv = k if ok is None else k[ok]

        def exact(i: int, kv: FloatArray = kv) -> tuple[Fraction, Fraction]:
            ki = int(kv[i])
            return (
                _exact_pmf_ratio(lam_exact, m, ki),
                big_m_exact - Fraction(abs(ki)) / s_exact,
            )

        if ok is None:
            log_a, err = _log_acceptance_large(lam, m, s, big_m, k)
            accepted = bernoulli_exp(log_a, err, exact, stream)
        else:
            f, err_f = _log_pmf_ratio(lam, m, kv.astype(np.int64))
            log_a = f + np.abs(kv) / s - big_m
            err_a = err_f + _REL * (np.abs(kv) / s + abs(big_m))
            accepted = np.zeros(size, dtype=np.bool_)
            accepted[np.flatnonzero(ok)] = bernoulli_exp(log_a, err_a, exact, stream)
        k += m
        if todo is None:
            out[:] = k  # the rejected entries are overwritten by later passes
            todo = np.flatnonzero(~accepted)
        else:
            out[todo[accepted]] = k[accepted]
            todo = todo[~accepted]
        size = todo.size
    return out


def _log_acceptance_large(
    lam: float, m: int, s: int, big_m: float, k: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """log of the acceptance probability p(m+k)/p(m)·e^{|k|/s}/e^M when every m + k ≥ 32.

    The large branch of :func:`_log_pmf_ratio` with the same per-entry error bound, computed in
    place on the whole batch (no masks), so that :func:`bernoulli_exp` can decide with one
    exponential per entry.
    """
    n1 = k + float(m)
    lead = math.log1p((lam - m) / m)
    r = np.log1p(k / m)
    big_term = n1 * r
    value = k * lead
    value -= big_term
    value += k
    r *= 0.5
    value -= r
    if m + float(k.min()) >= _ONE_TERM:
        # S(n) − 1/(12n) < 1/(360n³) ≤ 10^−17 here: inside _TRUNCATION's margin over the
        # remainder it bounds, so one division per entry instead of the series
        value -= np.divide(1.0 / 12.0, n1)
    else:
        value -= _stirling_tail(n1)
    value += float(_stirling_tail(np.array(float(m))))
    abs_k = np.abs(k, out=n1)
    error = abs_k * (_REL * (2.0 + abs(lead) + 1.0 / s))
    np.abs(big_term, out=big_term)
    big_term *= _REL
    error += big_term
    error += _REL * (1.0 + abs(big_m)) + _TRUNCATION
    abs_k /= s
    value += abs_k
    value -= big_m
    return value, error


def skellam(mu: float, count: int, stream: RandomStream) -> IntArray:
    """``count`` exact Skellam(μ) samples: Poisson(μ) − Poisson(μ), variance 2μ."""
    return poisson(mu, count, stream) - poisson(mu, count, stream)


def discrete_gaussian(sigma: float, count: int, stream: RandomStream) -> IntArray:
    """``count`` exact samples of N_Z(0, σ²) (Canonne, Kamath & Steinke 2020, Algorithm 3)."""
    _check_count(count)
    if not (math.isfinite(sigma) and 0.0 < sigma <= 2.0**40):
        raise ParameterError(f"discrete Gaussian σ must be finite in (0, 2^40], got {sigma}")
    s2 = Fraction(sigma) ** 2
    t = math.floor(sigma) + 1
    b_exact = s2 / t
    b = float(b_exact)
    s2f = float(s2)
    out = np.empty(count, dtype=np.int64)
    todo = np.arange(count)
    while todo.size:
        y = discrete_laplace(t, todo.size, stream)
        a = np.abs(y).astype(np.float64)
        g = (a - b) ** 2 / (2.0 * s2f)
        err = _REL * (g + (a + b) ** 2 / (2.0 * s2f)) + 1e-300

        def exact(i: int, y: IntArray = y) -> tuple[Fraction, Fraction]:
            return Fraction(1), (abs(int(y[i])) - b_exact) ** 2 / (2 * s2)

        accepted = bernoulli_exp(-g, err, exact, stream)
        out[todo[accepted]] = y[accepted]
        todo = todo[~accepted]
    return out


class NoiseKind(enum.Enum):
    """Which integer noise an agent adds (after scaling, before masking)."""

    NONE = "none"
    SKELLAM = "skellam"
    DISCRETE_GAUSSIAN = "discrete-gaussian"


@dataclass(frozen=True, slots=True)
class NoiseSpec:
    """One agent's noise, in ring units (after scaling by 2^b).

    Attributes:
        kind: none, Skellam or discrete Gaussian.
        parameter: the agent's Skellam μ (variance 2μ), or its discrete-Gaussian σ; 0 for none.
    """

    kind: NoiseKind = NoiseKind.NONE
    parameter: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, NoiseKind):
            raise ParameterError(f"noise kind must be a NoiseKind, got {self.kind!r}")
        p = self.parameter
        if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p):
            raise ParameterError(f"noise parameter must be a finite number, got {p!r}")
        if self.kind is NoiseKind.NONE and p != 0:
            raise ParameterError("no-noise spec takes parameter 0")
        if self.kind is NoiseKind.SKELLAM and not 0 <= p <= MAX_POISSON_MEAN:
            raise ParameterError(f"Skellam μ must lie in [0, 2^50], got {p}")
        if self.kind is NoiseKind.DISCRETE_GAUSSIAN and not 0 < p <= 2.0**40:
            raise ParameterError(f"discrete Gaussian σ must lie in (0, 2^40], got {p}")

    @classmethod
    def none(cls) -> NoiseSpec:
        return cls(NoiseKind.NONE, 0.0)

    @classmethod
    def skellam(cls, *, mu: float) -> NoiseSpec:
        return cls(NoiseKind.SKELLAM, float(mu))

    @classmethod
    def discrete_gaussian(cls, *, sigma: float) -> NoiseSpec:
        return cls(NoiseKind.DISCRETE_GAUSSIAN, float(sigma))

    @classmethod
    def skellam_share(
        cls, *, total_mu: float, honest_fraction: float, participants: int
    ) -> NoiseSpec:
        """Per-agent Sk(μ_total/(t·N)): the t·N honest agents alone add Sk(≥ μ_total)."""
        _check_share(honest_fraction, participants)
        return cls.skellam(mu=total_mu / (honest_fraction * participants))

    @classmethod
    def discrete_gaussian_share(
        cls, *, total_sigma: float, honest_fraction: float, participants: int
    ) -> NoiseSpec:
        """Per-agent σ_total/√(t·N): the honest agents' variances add up to ≥ σ_total²."""
        _check_share(honest_fraction, participants)
        return cls.discrete_gaussian(sigma=total_sigma / math.sqrt(honest_fraction * participants))

    @property
    def variance(self) -> float:
        """Per-coordinate variance of one agent's noise."""
        if self.kind is NoiseKind.SKELLAM:
            return 2.0 * self.parameter
        if self.kind is NoiseKind.DISCRETE_GAUSSIAN:
            # Var N_Z(0, σ²) ≤ σ² (Canonne, Kamath & Steinke 2020, Prop. 19)
            return self.parameter**2
        return 0.0

    def summed_std(self, summands: int) -> float:
        """Std of the sum of ``summands`` agents' noise on one coordinate (an upper bound)."""
        return math.sqrt(self.variance * summands)

    def sample(self, count: int, stream: RandomStream) -> IntArray:
        """``count`` independent noise values."""
        if self.kind is NoiseKind.SKELLAM:
            return skellam(self.parameter, count, stream)
        if self.kind is NoiseKind.DISCRETE_GAUSSIAN:
            return discrete_gaussian(self.parameter, count, stream)
        _check_count(count)
        return np.zeros(count, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "parameter": self.parameter}

    @classmethod
    def from_dict(cls, data: Any) -> NoiseSpec:
        if not isinstance(data, dict) or set(data) != {"kind", "parameter"}:
            raise ParameterError(f"noise must be an object with kind and parameter, got {data!r}")
        try:
            kind = NoiseKind(data["kind"])
        except ValueError as exc:
            raise ParameterError(f"unknown noise kind {data['kind']!r}") from exc
        return cls(kind, data["parameter"])


def _check_share(honest_fraction: float, participants: int) -> None:
    if not 0 < honest_fraction <= 1:
        raise ParameterError(f"honest fraction must lie in (0, 1], got {honest_fraction}")
    if isinstance(participants, bool) or not isinstance(participants, int) or participants < 1:
        raise ParameterError(f"participants must be an integer ≥ 1, got {participants!r}")
