"""Adaptive clipping for the DP-FedAvg family (Andrew et al., NeurIPS 2021): the clip follows a
quantile of the agents' update norms, learned from a noisy count released in the same sum.

Each agent sends one vector of d + 1 coordinates: its update clipped to the round's clip C_t and
rescaled to the job's fixed scale C₀, then ``(b − ½)·w`` where b says whether its update's norm
was at most C_t. The vector's norm never exceeds ``√(C₀² + w²/4)``, the encoding's clip, whatever
C_t the coordinator sends, so the plan's noise and every charge are those of DP-FedAvg with that
clip and one more coordinate: the count's privacy cost is charged with the update's. The
coordinator reads the count off the last coordinate (with the plan's expected participants, never
the number summed, which is not released) and moves the clip geometrically,
``C_{t+1} = C_t·exp(−η(b̄ − γ))``: post-processing of released sums. Derivation and the choice
of w: docs/algorithms.md#adaptive-clipping, docs/accounting.md#adaptive-clipping.
"""

from __future__ import annotations

import math
from typing import Self

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from dpfl.learning.algorithms.base import AlgorithmError, Contract

__all__ = [
    "CLIP_KEY",
    "AdaptiveClipping",
    "AdaptiveClippingPlan",
    "AdaptiveClippingTask",
    "agent_vector",
    "count_weight",
    "encoding_clip",
    "next_clip",
    "read_sum",
]

#: Where the coordinator state keeps the clip of the next round.
CLIP_KEY = "adaptive_clip"
#: Share of the expected participants that the count's noise std defaults to (the paper's m/20).
DEFAULT_COUNT_NOISE_SHARE = 0.05
#: The relative slack of the agent's check that its vector fits the encoding's clip.
_FIT_SLACK = 1e-9


class AdaptiveClipping(Contract):
    """The job's choice: learn the clip as the ``target_quantile`` γ of the update norms, at
    ``clip_learning_rate`` η, with the noisy count's std ``count_noise`` σ_b (in agents; default
    m/20 for m expected participants). ``params.clip`` is the first round's clip and the fixed
    scale C₀ every update is sent at."""

    target_quantile: float = Field(default=0.5, gt=0, lt=1)
    clip_learning_rate: float = Field(default=0.2, gt=0, le=10)
    count_noise: float | None = Field(
        default=None, gt=0, description="null: m/20 for m expected participants"
    )

    def count_std(self, expected_participants: float) -> float:
        """σ_b: the given one, else m/20."""
        if self.count_noise is not None:
            return self.count_noise
        return DEFAULT_COUNT_NOISE_SHARE * expected_participants


class AdaptiveClippingPlan(Contract):
    """What the plan fixes: the scale C₀ updates are sent at, the count's weight w (the last
    coordinate is ``±w/2``), the count's noise std σ_b it gives (agents), γ and η."""

    update_clip: float = Field(gt=0)
    count_weight: float = Field(gt=0)
    count_noise: float = Field(gt=0)
    target_quantile: float = Field(gt=0, lt=1)
    clip_learning_rate: float = Field(gt=0)

    @property
    def clip(self) -> float:
        """The encoding's clip: the largest norm of an agent's vector."""
        return encoding_clip(self.update_clip, self.count_weight)


class AdaptiveClippingTask(Contract):
    """What an agent needs: the round's clip C_t, the scale C₀ and the count's weight w."""

    round_clip: float = Field(gt=0)
    update_clip: float = Field(gt=0)
    count_weight: float = Field(gt=0)

    def fits(self, clip: float) -> bool:
        """The vector of any update fits in the encoding's clip."""
        return encoding_clip(self.update_clip, self.count_weight) <= clip * (1 + _FIT_SLACK)

    @model_validator(mode="after")
    def _finite_ratio(self) -> Self:
        """C₀/C_t must be a finite rescaling (a round clip of 1e-300 would overflow it)."""
        if not math.isfinite(self.update_clip / self.round_clip):
            raise ValueError("round_clip is too small for the update scale")
        return self


def encoding_clip(update_clip: float, count_weight: float) -> float:
    """``√(C₀² + w²/4)``: the norm bound of ``[u, ±w/2]`` with ``‖u‖ ≤ C₀``."""
    return math.hypot(update_clip, count_weight / 2.0)


def count_weight(update_clip: float, *, noise_multiplier: float, count_noise: float) -> float:
    """w such that noise of std ``z·√(C₀² + w²/4)`` on the last coordinate is σ_b agents:
    ``σ_b = z·√(C₀² + w²/4)/w`` gives ``w = z·C₀/√(σ_b² − z²/4)``.

    Raises:
        AlgorithmError: σ_b ≤ z/2 (no weight reaches it: the count is noisier than that
            whatever w is).
    """
    z = noise_multiplier
    room = count_noise**2 - z * z / 4.0
    if room <= 0:
        raise AlgorithmError(
            f"params.adaptive_clipping.count_noise: σ_b = {count_noise:g} agents is below what the "
            f"noise multiplier z = {z:.4g} allows (more than z/2 = {z / 2:.4g}); raise it"
        )
    return z * update_clip / math.sqrt(room)


def agent_vector(
    delta: npt.NDArray[np.float64], task: AdaptiveClippingTask
) -> npt.NDArray[np.float64]:
    """``[clip_{C_t}(Δ)·C₀/C_t, (b − ½)·w]`` with ``b = 1[‖Δ‖ ≤ C_t]``."""
    norm = float(np.linalg.norm(delta))
    below = norm <= task.round_clip
    scale = task.update_clip / (task.round_clip if below else norm)
    out = np.empty(delta.size + 1, dtype=np.float64)
    out[:-1] = delta * scale
    out[-1] = (0.5 if below else -0.5) * task.count_weight
    return out


def read_sum(
    total: npt.NDArray[np.float64],
    plan: AdaptiveClippingPlan,
    *,
    round_clip: float,
    expected_participants: float,
) -> tuple[npt.NDArray[np.float64], float]:
    """The sum of the clipped updates in real units and the noisy count of agents whose update
    was within the round's clip, read off the decoded sum alone.

    The count is ``A_d/w + m/2`` with m the plan's expected participants, not the number of
    vectors summed: that number moves with one agent's presence under Poisson sampling, and
    adding it would release ``Σb`` (sensitivity w) instead of ``Σ(b − ½)`` (sensitivity w/2,
    the charged one). docs/accounting.md#adaptive-clipping."""
    if not expected_participants > 0:
        raise AlgorithmError("the expected participants must be > 0")
    updates = total[:-1] * (round_clip / plan.update_clip)
    count = float(total[-1]) / plan.count_weight + expected_participants / 2.0
    return updates, count


def next_clip(
    round_clip: float, count: float, *, expected_participants: float, plan: AdaptiveClippingPlan
) -> float:
    """``C_t·exp(−η(b̄ − γ))`` with ``b̄ = count/m`` (geometric update: Andrew et al. §2)."""
    if expected_participants <= 0:
        raise AlgorithmError("the expected participants must be > 0")
    fraction = count / expected_participants
    step = -plan.clip_learning_rate * (fraction - plan.target_quantile)
    # a count far off by its noise must not make the clip 0 or infinite: at most e^±10 a round
    return round_clip * math.exp(max(-10.0, min(10.0, step)))
