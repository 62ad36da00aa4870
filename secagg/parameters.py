"""Choosing the graph degree k and the Shamir threshold t (SECAGG.md §3; Bell et al. 2020, §4).

The rule is the one of fcp's ``graph_parameter_finder.cc`` (except the semi-malicious rounding,
below): take the smallest even k that passes, with B = ⌊γn⌋ + ⌊δn⌋ bad clients, σ the security
and η the correctness parameter,

- disconnection: (n(n−k−1)/2) · C(B,k)/C(n,k) < 2^−(σ+1)  (union bound over pairs of gaps of k/2
  consecutive bad clients on the ring: graph condition (a));
- security: t1 = min{a : P[Hyp(n, ⌊γn⌋, k) > a] < 2^−(σ+1)/n}  (condition (b), per client);
- semi-malicious: t1 ← ⌈(t1 + k)/2⌉, so that 2t ≥ k + 2 + t1: u's k + 1 shareholders include
  u itself, so a server holding c corrupted neighbours rebuilds both b_u and s_u exactly when
  2t ≤ k + 1 + c, and this t keeps that below 2^−(σ+1)/n. fcp's ⌈(t1 + k − 1.25)/2⌉ gives
  2t = k + 1 + t1 when t1 + k is odd, which misses that budget (docs/architecture.md, "Shamir
  threshold against a semi-malicious server", lists the cells that differ);
- correctness: t2 = max{t : P[Hyp(n, ⌈(1−δ)n⌉, k) ≤ t−1] < 2^−η/n}  (condition (c));
- accept k when t2 > t1, with t = max(t1 + 1, 2).

Unlike fcp, which evaluates the tails in floating point (lgamma) only, every comparison here is
*exact*: it is taken in floating point when the value is clearly on one side, and with integer
arithmetic on the binomial coefficients otherwise ("P < 2^−41/n" becomes
"n · 2^41 · Σ C(K,x)C(n−K,k−x) < C(n,k)"; :mod:`dpfl.secagg.hypergeometric`). No rounding can push
a borderline k or t to the insecure side, and the table of SECAGG.md §3 (and fcp's own test table)
is reproduced cell for cell, except the semi-malicious cells where fcp's rounding misses the
budget. The fractions γ and δ are read as the decimal numbers they print as (``0.05`` is 1/20),
so ⌊γn⌋ is never off by one.

When no k < n − 1 passes (tiny cohorts), the graph is complete (k = n − 1) and t is the smallest
value with t > ⌊γn⌋ (semi-honest) or 2t > n + ⌊γn⌋ (semi-malicious); it must not exceed the
⌈(1−δ)n⌉ clients guaranteed to survive.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction

from .errors import ParameterError
from .hypergeometric import (
    Hypergeometric,
    disconnection_ok,
    largest_correct,
    smallest_secure,
)


class ThreatModel(enum.Enum):
    """The server the parameters must defend against (SECAGG.md §1)."""

    SEMI_HONEST = "semi-honest"  # fcp CURIOUS_SERVER
    SEMI_MALICIOUS = "semi-malicious"  # fcp SEMI_MALICIOUS_SERVER


@dataclass(frozen=True, slots=True)
class GraphParameters:
    """The solver's answer: k neighbours besides oneself and the threshold t."""

    num_clients: int
    degree: int
    threshold: int

    @property
    def complete(self) -> bool:
        """True for the complete-graph fallback (k = n − 1)."""
        return self.degree == self.num_clients - 1


def _fraction(value: float | Fraction, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise ParameterError(f"{name} must be a number, got {type(value).__name__}")
    frac = value if isinstance(value, Fraction) else Fraction(repr(float(value)))
    if not 0 <= frac < 1:
        raise ParameterError(f"{name} must lie in [0, 1), got {value}")
    return frac


def _floor(x: Fraction) -> int:
    return math.floor(x)


def _ceil(x: Fraction) -> int:
    return math.ceil(x)


def choose_graph_parameters(
    *,
    n: int,
    corrupt_fraction: float | Fraction,
    dropout_fraction: float | Fraction,
    model: ThreatModel = ThreatModel.SEMI_HONEST,
    sigma: int = 40,
    eta: int = 20,
) -> GraphParameters:
    """The smallest even k, and its t, that meet the security and correctness targets.

    Args:
        n: number of clients in the round.
        corrupt_fraction: γ, the fraction of clients the adversary may control.
        dropout_fraction: δ, the largest fraction that may drop out over all stages.
        model: semi-honest or semi-malicious server.
        sigma: security parameter: a bad graph with probability ≤ 2^−σ (fcp: 40).
        eta: correctness parameter: abort despite ≤ δn dropouts with probability ≤ 2^−η (fcp: 20).

    Returns:
        k, t (and n). ``complete`` is set for the complete-graph fallback.

    Raises:
        ParameterError: a value out of range, γ + δ > 0.9 (semi-honest) or γ + 2δ > 0.9
            (semi-malicious), or not even the complete graph is feasible.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ParameterError(f"n must be an integer ≥ 2, got {n!r}")
    if not isinstance(model, ThreatModel):
        raise ParameterError(f"model must be a ThreatModel, got {model!r}")
    for name, value in (("sigma", sigma), ("eta", eta)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
            raise ParameterError(f"{name} must be an integer in [1, 256], got {value!r}")
    gamma = _fraction(corrupt_fraction, "corrupt_fraction")
    delta = _fraction(dropout_fraction, "dropout_fraction")
    limit = Fraction(9, 10)
    if model is ThreatModel.SEMI_HONEST and gamma + delta > limit:
        raise ParameterError(f"semi-honest needs γ + δ ≤ 0.9, got {float(gamma + delta)}")
    if model is ThreatModel.SEMI_MALICIOUS and gamma + 2 * delta > limit:
        raise ParameterError(f"semi-malicious needs γ + 2δ ≤ 0.9, got {float(gamma + 2 * delta)}")

    corrupted = _floor(gamma * n)
    bad = corrupted + _floor(delta * n)
    survivors = _ceil((1 - delta) * n)
    security_scale = n << (sigma + 1)
    correctness_scale = n << eta
    t1_guess, t2_guess = 0, 0
    for k in range(2, n - 1, 2):
        if not disconnection_ok(n, k, bad, sigma):
            continue
        t1 = smallest_secure(Hypergeometric(n, corrupted, k), security_scale, t1_guess)
        t2 = largest_correct(Hypergeometric(n, survivors, k), correctness_scale, t2_guess)
        t1_guess, t2_guess = t1, t2
        if model is ThreatModel.SEMI_MALICIOUS:
            t1 = -(-(t1 + k) // 2)  # ⌈(t1 + k)/2⌉: 2t ≥ t1 + k + 2
        if t2 > t1:
            return GraphParameters(num_clients=n, degree=k, threshold=max(t1 + 1, 2))
    return complete_graph_parameters(
        n=n, corrupt_fraction=gamma, dropout_fraction=delta, model=model
    )


def complete_graph_parameters(
    *,
    n: int,
    corrupt_fraction: float | Fraction,
    dropout_fraction: float | Fraction,
    model: ThreatModel = ThreatModel.SEMI_HONEST,
) -> GraphParameters:
    """t for the complete graph (k = n − 1), where the bounds hold deterministically.

    Raises:
        ParameterError: the smallest secure t exceeds the ⌈(1−δ)n⌉ guaranteed survivors.
    """
    gamma = _fraction(corrupt_fraction, "corrupt_fraction")
    delta = _fraction(dropout_fraction, "dropout_fraction")
    corrupted = _floor(gamma * n)
    survivors = _ceil((1 - delta) * n)
    if model is ThreatModel.SEMI_HONEST:
        t = max(corrupted + 1, 2)
    else:
        t = max((n + corrupted) // 2 + 1, 2)
    if t > survivors:
        raise ParameterError(
            f"no parameters for n={n}, γ={float(gamma)}, δ={float(delta)} ({model.value}): "
            f"the complete graph needs t={t} but only {survivors} clients surely survive"
        )
    return GraphParameters(num_clients=n, degree=n - 1, threshold=t)
