"""Choosing the graph degree k and the Shamir threshold t (Bell et al. 2020, §4).

The rule is fcp's ``graph_parameter_finder.cc``: the smallest even k whose random Harary graph
is connected over the honest survivors, gives no client t corrupted neighbours and leaves every
client t responding ones, each within its failure budget (docs/secagg.md#parameters). Two
departures: every tail comparison is exact (:mod:`dpfl.secagg.hypergeometric`), so no rounding
pushes a borderline k or t to the insecure side, and γ, δ are read as the decimals they print as;
the semi-malicious threshold is the smallest t that meets its own budget, ⌈(t1 + k)/2⌉ + 1,
where fcp's rounding misses it when t1 + k is odd. Small cohorts fall back to the complete graph.
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
    """The server the parameters must defend against (docs/secagg.md#threat-models)."""

    SEMI_HONEST = "semi-honest"  # fcp CURIOUS_SERVER
    SEMI_MALICIOUS = "semi-malicious"  # fcp SEMI_MALICIOUS_SERVER
    #: any deviation; (k, t) as for SEMI_MALICIOUS, whose threshold also stops a server that
    #: lies about dropouts (docs/secagg.md#parameters)
    MALICIOUS = "malicious"

    @property
    def lies_about_dropouts(self) -> bool:
        """True when the threshold must satisfy 2t > k + 1 + c (semi-malicious and malicious)."""
        return self is not ThreatModel.SEMI_HONEST


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
    if model.lies_about_dropouts and gamma + 2 * delta > limit:
        raise ParameterError(f"{model.value} needs γ + 2δ ≤ 0.9, got {float(gamma + 2 * delta)}")

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
        if model.lies_about_dropouts:
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
