"""Test-only: why DP-FedSGD's sum-dominating figure is not a bound for S > 1 local steps.

A deterministic construction of docs/accounting.md, "The sum-dominating figure is not a bound".
The model is one real parameter θ, every record's gradient is clipped to ``[−C, C]`` (the 1-D
per-record clip), and each agent runs DP-FedSGD's local rule with the full batch (p = 1)::

    g_s = Σ_{records x} clip_C(∇ℓ_x(θ_s)),     θ_{s+1} = θ_s − η·g_s,     Z = Σ_s g_s

(η = γ/B; the noise is left out: the released sum is ``Σ_agents Z + noise``, and only the
noiseless part depends on the data). Records:

- ``"abs"``: ``ℓ(θ) = C·|θ|``, clipped gradient ``C·sign(θ)`` (θ never hits 0 here);
- ``"linear"``: ``ℓ(θ) = C·θ``, gradient ``C``.

The protected agent holds ``n`` abs records (D); its neighbour D' adds one linear record. The
global model is ``θ₀ = (n + ½)·η·C``, so after step 1 the agent's local model is
``θ₀ − n·η·C = ½·η·C > 0`` on D and ``−½·η·C < 0`` on D': the added record flips the sign of
ALL n later gradients. Over S = 2 steps ``Z(D) = 2n·C`` and ``Z(D') = (n + 1)·C + (1 − n)·C``,
a move of ``(2n − 2)·C`` (18·C for n = 10) where the sum-dominating charge assumes C. The other
agents hold the same records on both sides, so the released sum over all agents moves by the
same amount.

With Gaussian noise of std σ = z·C per step on the sum (the honest agents' split shares summed),
the released ``Z`` carries ``N(0, S·σ²)`` and its exact Rényi divergence between the neighbours
is ``α·((2n − 2)·C)²/(2·S·σ²)`` (81·α at n = 10, S = 2, z = 1), while the sum-dominating event
``SelfComposed(Gaussian(σ, C), S)`` charges ``S·α/(2z²)`` = α.

API: :func:`construction` (the parameters), :func:`neighbouring_datasets`,
:func:`record_gradient`, :func:`local_run` (one agent's ``Z`` and local models),
:func:`released_sum` (the noiseless sum over agents), :func:`sensitivity_of_the_sum` and
:func:`gaussian_rdp_of_the_sum`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Construction",
    "Record",
    "construction",
    "gaussian_rdp_of_the_sum",
    "local_run",
    "neighbouring_datasets",
    "record_gradient",
    "released_sum",
    "sensitivity_of_the_sum",
]


@dataclass(frozen=True, slots=True)
class Record:
    """One record: its loss kind (module docstring)."""

    kind: Literal["abs", "linear"]


@dataclass(frozen=True, slots=True)
class Construction:
    """The counterexample's parameters.

    Attributes:
        clip: C, the per-record gradient clip.
        records: n, the protected agent's records in D.
        steps: S, local steps per round.
        eta: η = γ/B, the local step size per unit of summed gradient.
        theta0: θ₀, the public global model the round starts from.
        agents: the number of agents whose vectors are summed (the protected one included).
        noise_multiplier: z, the summed per-step noise std over C.
    """

    clip: float
    records: int
    steps: int
    eta: float
    theta0: float
    agents: int
    noise_multiplier: float


def construction(
    *,
    clip: float = 1.0,
    records: int = 10,
    steps: int = 2,
    eta: float = 0.01,
    agents: int = 100,
    noise_multiplier: float = 1.0,
) -> Construction:
    """The construction with θ₀ = (n + ½)·η·C (the sign flip after step 1)."""
    if records < 2 or steps < 2 or min(clip, eta, noise_multiplier) <= 0 or agents < 1:
        raise ValueError("needs n >= 2, S >= 2, C, η, z > 0 and at least one agent")
    return Construction(
        clip=clip,
        records=records,
        steps=steps,
        eta=eta,
        theta0=(records + 0.5) * eta * clip,
        agents=agents,
        noise_multiplier=noise_multiplier,
    )


def neighbouring_datasets(c: Construction) -> tuple[list[Record], list[Record]]:
    """``(D, D')``: n abs records, and the same plus one linear record (add/remove)."""
    base = [Record("abs") for _ in range(c.records)]
    return base, [*base, Record("linear")]


def record_gradient(record: Record, theta: float, clip: float) -> float:
    """The record's gradient at θ, clipped to ``[−C, C]``."""
    if record.kind == "linear":
        raw = clip
    else:
        if theta == 0.0:
            raise ValueError("the construction never evaluates |θ| at its kink")
        raw = clip if theta > 0 else -clip
    return max(-clip, min(clip, raw))


def local_run(
    c: Construction, data: Sequence[Record], *, steps: int | None = None
) -> tuple[float, list[float]]:
    """One agent's noiseless ``Z = Σ_s g_s`` and its local models ``θ₀, θ₁, ...``."""
    theta = c.theta0
    models = [theta]
    total = 0.0
    for _ in range(c.steps if steps is None else steps):
        g = sum(record_gradient(r, theta, c.clip) for r in data)
        total += g
        theta -= c.eta * g
        models.append(theta)
    return total, models


def released_sum(
    c: Construction, protected: Sequence[Record], *, steps: int | None = None
) -> float:
    """The noiseless released sum over all agents: the protected agent holds ``protected``,
    each of the other ``agents − 1`` holds D (the same on both sides)."""
    others, _ = neighbouring_datasets(c)
    own, _ = local_run(c, protected, steps=steps)
    rest, _ = local_run(c, others, steps=steps)
    return own + (c.agents - 1) * rest


def sensitivity_of_the_sum(c: Construction, *, steps: int | None = None) -> float:
    """``|sum(D') − sum(D)|``: (2n − 2)·C at S = 2, against the C the sum-dominating figure
    assumes."""
    d, d_prime = neighbouring_datasets(c)
    return abs(released_sum(c, d_prime, steps=steps) - released_sum(c, d, steps=steps))


def gaussian_rdp_of_the_sum(c: Construction, alpha: float) -> float:
    """The exact order-α Rényi divergence between the released sums with Gaussian noise
    ``N(0, S·σ²)``, σ = z·C (S steps' summed noise): ``α·Δ²/(2·S·σ²)``."""
    sigma = c.noise_multiplier * c.clip
    shift = sensitivity_of_the_sum(c)
    return alpha * shift * shift / (2.0 * c.steps * sigma * sigma)
