"""The closed-form noise bounds the algorithms' papers give, for comparison with the accountant.

These are reported beside the exact calibration, never used to charge the ledger:

- :func:`fedls_noise_multiplier`: DP-Fed-LS (docs/algorithms.md#dp-fed-ls): for client sampling with
  ratio τ, T rounds and clip norm G, ``ν ≥ (τ·G/ε)·√((c·T/λ)·(log(1/δ)/(1−λ) + ε))`` for some λ ∈
  (0, 1), with ``c = 14`` for uniform (fixed-size) sampling and ``c = 8`` for Poisson sampling. We
  return ``ν/G`` minimised over λ. The paper attaches side conditions on ν (small-τ, large-ν regime
  of the subsampled-Gaussian RDP bounds it builds on) that are not checked here: the accountant's ε
  at the returned multiplier is reported beside it so that a reader sees whether it holds.
- :func:`simple_gaussian_noise_multiplier` / :func:`simple_gaussian_epsilon`: the classical
  Gaussian bound composed over K releases by splitting (ε, δ) evenly (docs/algorithms.md#dp-helmet,
  DP-Helmet): ``ε = √(2·ln(1.25·K/δ))·K/σ``. The classical bound needs ``ε/K < 1`` per release
  (Dwork & Roth 2014, Thm. A.1); :class:`ClosedFormBound` says whether that held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from scipy import optimize

from .errors import InvalidParameterError

__all__ = [
    "ClosedFormBound",
    "fedls_noise_multiplier",
    "simple_gaussian_epsilon",
    "simple_gaussian_noise_multiplier",
]


@dataclass(frozen=True, slots=True)
class ClosedFormBound:
    """A closed-form noise multiplier, with the condition under which its source claims it.

    Attributes:
        noise_multiplier: the multiplier (noise std / clip norm).
        valid: whether the stated applicability condition holds (None: not checkable here).
        note: the source and its condition.
        parameter: the optimised free parameter (λ for DP-Fed-LS), if any.
    """

    noise_multiplier: float
    valid: bool | None
    note: str
    parameter: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "valid": self.valid,
            "parameter": self.parameter,
            "note": self.note,
        }


def _check(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0.0):
        raise InvalidParameterError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0.0 < delta < 1.0:
        raise InvalidParameterError(f"delta must be in (0, 1), got {delta!r}")


def fedls_noise_multiplier(
    *,
    sampling_ratio: float,
    steps: int,
    epsilon: float,
    delta: float,
    sampling: Literal["uniform", "poisson"],
) -> ClosedFormBound:
    """DP-Fed-LS closed form (docs/algorithms.md#dp-fed-ls), minimised over λ ∈ (0, 1).

    Args:
        sampling_ratio: τ in (0, 1].
        steps: T ≥ 1.
        epsilon: target ε > 0.
        delta: δ in (0, 1).
        sampling: ``"uniform"`` (c = 14) or ``"poisson"`` (c = 8).
    """
    _check(epsilon, delta)
    if not 0.0 < sampling_ratio <= 1.0:
        raise InvalidParameterError(f"sampling_ratio must be in (0, 1], got {sampling_ratio!r}")
    if steps < 1:
        raise InvalidParameterError(f"steps must be ≥ 1, got {steps!r}")
    c = {"uniform": 14.0, "poisson": 8.0}[sampling]
    log_inv_delta = math.log(1.0 / delta)

    def nu(lam: float) -> float:
        return (sampling_ratio / epsilon) * math.sqrt(
            (c * steps / lam) * (log_inv_delta / (1.0 - lam) + epsilon)
        )

    best = optimize.minimize_scalar(
        nu, bounds=(1e-9, 1.0 - 1e-9), method="bounded", options={"xatol": 1e-10}
    )
    lam = float(best.x)
    return ClosedFormBound(
        noise_multiplier=nu(lam),
        valid=None,
        parameter=lam,
        note=f"DP-Fed-LS closed form, {sampling} sampling (c = {c:g}); the paper's side "
        "conditions on ν are not checked",
    )


def simple_gaussian_epsilon(*, noise_multiplier: float, compositions: int, delta: float) -> float:
    """``√(2·ln(1.25·K/δ))·K/σ``: the classical bound over K Gaussian releases (§4)."""
    if not noise_multiplier > 0.0:
        raise InvalidParameterError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    if compositions < 1 or not 0.0 < delta < 1.0:
        raise InvalidParameterError("compositions must be ≥ 1 and delta in (0, 1)")
    k = compositions
    return math.sqrt(2.0 * math.log(1.25 * k / delta)) * k / noise_multiplier


def simple_gaussian_noise_multiplier(
    *, epsilon: float, delta: float, compositions: int
) -> ClosedFormBound:
    """The multiplier of the classical bound over K releases (inverse of the above)."""
    _check(epsilon, delta)
    if compositions < 1:
        raise InvalidParameterError(f"compositions must be ≥ 1, got {compositions!r}")
    k = compositions
    z = math.sqrt(2.0 * math.log(1.25 * k / delta)) * k / epsilon
    return ClosedFormBound(
        noise_multiplier=z,
        valid=epsilon / k < 1.0,
        note="classical Gaussian bound with (ε, δ) split over K releases; needs ε/K < 1",
    )
