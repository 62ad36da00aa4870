"""Exact decisions "P[tail of a hypergeometric] < 1/scale" for the parameter solver.

Hyp(n, K, k) counts the marked items among k drawn without replacement from n, K of them marked:
P[X = x] = C(K, x)·C(n−K, k−x)/C(n, k).

Each decision is first taken in floating point: the log of the anchor term from ``lgamma``, the rest
of the tail by the ratio recurrence pmf(x±1)/pmf(x), summed outward from the anchor until the terms
no longer matter. The float result is trusted only when it lies more than ``_MARGIN`` (in natural
log) away from the threshold; otherwise the same inequality is decided with exact integers
(n·2^41·Σ C(K,x)C(n−K,k−x) < C(n,k) and the like). The float error is about 1e−8 in log at
n = 10^6 (lgamma of 1.4e7 to a few ulps), so the margin of 1e−6 is generous and the answer is always
the exact one.
"""

from __future__ import annotations

import math

_MARGIN = 1e-6
_NEGLIGIBLE = 1e-18


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


class Hypergeometric:
    """X ~ Hyp(n, marked, sampled), with exact tail comparisons."""

    __slots__ = ("_log_total", "hi", "lo", "marked", "n", "sampled")

    def __init__(self, n: int, marked: int, sampled: int) -> None:
        self.n = n
        self.marked = marked
        self.sampled = sampled
        self.lo = max(0, sampled - (n - marked))
        self.hi = min(sampled, marked)
        self._log_total = _log_comb(n, sampled)

    # -- floating point -------------------------------------------------------------------------

    def _log_pmf(self, x: int) -> float:
        n, big_k, k = self.n, self.marked, self.sampled
        return _log_comb(big_k, x) + _log_comb(n - big_k, k - x) - self._log_total

    def _ratio_up(self, x: int) -> float:
        """pmf(x + 1)/pmf(x)."""
        n, big_k, k = self.n, self.marked, self.sampled
        return (big_k - x) * (k - x) / ((x + 1) * (n - big_k - k + x + 1))

    def _ratio_down(self, x: int) -> float:
        """pmf(x − 1)/pmf(x)."""
        n, big_k, k = self.n, self.marked, self.sampled
        return x * (n - big_k - k + x) / ((big_k - x + 1) * (k - x + 1))

    def _mode(self) -> int:
        return min(self.hi, (self.sampled + 1) * (self.marked + 1) // (self.n + 2))

    def _log_sum_up(self, start: int) -> float:
        """log Σ_{x ≥ start} pmf(x), for start ≥ mode (decreasing terms)."""
        anchor = self._log_pmf(start)
        total, term, x = 1.0, 1.0, start
        while x < self.hi:
            term *= self._ratio_up(x)
            x += 1
            total += term
            if term < _NEGLIGIBLE * total:
                break
        return anchor + math.log(total)

    def _log_sum_down(self, start: int) -> float:
        """log Σ_{x ≤ start} pmf(x), for start ≤ mode (decreasing terms going down)."""
        anchor = self._log_pmf(start)
        total, term, x = 1.0, 1.0, start
        while x > self.lo:
            term *= self._ratio_down(x)
            x -= 1
            total += term
            if term < _NEGLIGIBLE * total:
                break
        return anchor + math.log(total)

    def _log_upper(self, a: int) -> float:
        """log P[X > a] (−inf when impossible)."""
        if a >= self.hi:
            return -math.inf
        if a < self.lo:
            return 0.0
        if a + 1 >= self._mode():
            return self._log_sum_up(a + 1)
        return math.log1p(-min(1.0, math.exp(self._log_sum_down(a))))

    def _log_lower(self, b: int) -> float:
        """log P[X ≤ b] (−inf when impossible)."""
        if b < self.lo:
            return -math.inf
        if b >= self.hi:
            return 0.0
        if b <= self._mode():
            return self._log_sum_down(b)
        return math.log1p(-min(1.0, math.exp(self._log_sum_up(b + 1))))

    # -- exact ----------------------------------------------------------------------------------

    def _exact_weights(self, start: int, stop: int) -> int:
        """Σ_{start ≤ x ≤ stop} C(K, x)·C(n−K, k−x), exactly."""
        start, stop = max(start, self.lo), min(stop, self.hi)
        if start > stop:
            return 0
        n, big_k, k = self.n, self.marked, self.sampled
        c1 = math.comb(big_k, start)
        c2 = math.comb(n - big_k, k - start)
        total = 0
        for x in range(start, stop + 1):
            total += c1 * c2
            if x < stop:
                c1 = c1 * (big_k - x) // (x + 1)
                c2 = c2 * (k - x) // (n - big_k - k + x + 1)
        return total

    # -- decisions ------------------------------------------------------------------------------

    def upper_tail_below(self, a: int, scale: int) -> bool:
        """P[X > a] < 1/scale, exactly."""
        log_p = self._log_upper(a)
        threshold = -math.log(scale)
        if log_p < threshold - _MARGIN:
            return True
        if log_p > threshold + _MARGIN:
            return False
        return self._exact_weights(a + 1, self.hi) * scale < math.comb(self.n, self.sampled)

    def lower_tail_below(self, b: int, scale: int) -> bool:
        """P[X ≤ b] < 1/scale, exactly."""
        log_p = self._log_lower(b)
        threshold = -math.log(scale)
        if log_p < threshold - _MARGIN:
            return True
        if log_p > threshold + _MARGIN:
            return False
        return self._exact_weights(self.lo, b) * scale < math.comb(self.n, self.sampled)


def smallest_secure(dist: Hypergeometric, scale: int, guess: int) -> int:
    """min{a : P[X > a] < 1/scale}, searched outward from ``guess`` (the predicate is monotone)."""
    a = min(max(guess, dist.lo - 1), dist.hi)
    if dist.upper_tail_below(a, scale):
        while a > dist.lo - 1 and dist.upper_tail_below(a - 1, scale):
            a -= 1
        return a
    while not dist.upper_tail_below(a + 1, scale):
        a += 1
    return a + 1


def largest_correct(dist: Hypergeometric, scale: int, guess: int) -> int:
    """max{t : P[X ≤ t − 1] < 1/scale}, searched outward from ``guess``."""
    t = min(max(guess, dist.lo), dist.hi)
    if dist.lower_tail_below(t - 1, scale):
        while t < dist.hi and dist.lower_tail_below(t, scale):
            t += 1
        return t
    while not dist.lower_tail_below(t - 2, scale):
        t -= 1
    return t - 1


def disconnection_ok(n: int, k: int, bad: int, sigma: int) -> bool:
    """(n(n−k−1)/2)·C(B,k)/C(n,k) < 2^−(σ+1), exactly (docs/secagg.md#parameters, condition (a))."""
    if k > bad:
        return True
    log_p = math.log(n) + math.log(n - k - 1) - math.log(2) + _log_comb(bad, k) - _log_comb(n, k)
    threshold = -(sigma + 1) * math.log(2)
    if log_p < threshold - _MARGIN:
        return True
    if log_p > threshold + _MARGIN:
        return False
    return n * (n - k - 1) * math.comb(bad, k) * (1 << (sigma + 1)) < 2 * math.comb(n, k)
