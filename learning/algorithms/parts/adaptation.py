"""How an agent's local training adapts to the public domain (PATE-FL's teachers, DP-FedAvg's
local steps): the job's choice, as the task carries it
(docs/algorithms.md#teachers-adapted-to-the-public-domain)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dpfl.learning.algorithms.base import Contract

__all__ = ["DomainAdaptation"]


class DomainAdaptation(Contract):
    """How local training adapts to the public domain: ``none`` (plain training) or ``dann``
    (domain-adversarial features, ``weight`` on the domain loss, a domain classifier with
    ``hidden`` units per layer) using the public images the agent received as the target."""

    method: Literal["none", "dann"] = "none"
    weight: float = Field(default=1.0, gt=0, le=100)
    hidden: int = Field(default=100, ge=1, le=4096)

    @model_validator(mode="after")
    def _options_need_a_method(self) -> DomainAdaptation:
        if self.method == "none" and (self.weight, self.hidden) != (1.0, 100):
            raise ValueError("weight and hidden only apply to method dann")
        return self
