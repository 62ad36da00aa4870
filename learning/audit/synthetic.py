"""A public synthetic federation for audits: informative features plus SILENT ones (always 0).

For a linear model every record's gradient, and every agent's update, is exactly zero on the
weights of a silent feature, so Dirac canaries placed there meet only the mechanism's noise:
the idealised white-box setting in which an audit can come close to the ledger's ε. The layout is
public (it is part of the data spec), so choosing those coordinates uses no private information.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpfl.learning.algorithms.base import AgentData, CoordinatorData

__all__ = ["SyntheticFederation", "synthetic_federation"]


@dataclass(frozen=True)
class SyntheticFederation:
    """The coordinator's data, each agent's data, and the silent coordinates of ``logreg``."""

    coordinator: CoordinatorData
    agents: dict[str, AgentData]
    silent_coordinates: npt.NDArray[np.int64]


def synthetic_federation(
    *,
    agents: int,
    records_per_agent: int,
    informative: int,
    silent: int,
    classes: int = 2,
    seed: int = 0,
) -> SyntheticFederation:
    """Gaussian class clusters on ``informative`` features, then ``silent`` zero features.

    ``silent_coordinates`` index the flattened ``logreg`` parameters (weight ``(classes,
    features)`` row-major, then the bias) on the silent features.
    """
    rng = np.random.default_rng(seed)
    features = informative + silent
    centres = rng.normal(0.0, 1.0, size=(classes, informative))

    def draw(n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        y = rng.integers(0, classes, size=n)
        x = np.zeros((n, features), dtype=np.float32)
        x[:, :informative] = centres[y] + rng.normal(0.0, 1.0, size=(n, informative))
        return x, y.astype(np.int64)

    test_x, test_y = draw(200)
    coordinator = CoordinatorData(
        input_shape=(features,), num_classes=classes, test_x=test_x, test_y=test_y
    )
    parts = {}
    for i in range(agents):
        x, y = draw(records_per_agent)
        parts[f"agent-{i:04d}"] = AgentData(x=x, y=y, input_shape=(features,), num_classes=classes)
    rows = np.arange(classes, dtype=np.int64)[:, None] * features
    silent_cols = np.arange(informative, features, dtype=np.int64)[None, :]
    return SyntheticFederation(
        coordinator=coordinator,
        agents=parts,
        silent_coordinates=(rows + silent_cols).reshape(-1),
    )
