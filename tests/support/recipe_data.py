"""Test-only: two disjoint halves of scikit-learn's digits as ``npz:`` files, the agents' own
data and a labelled public proxy of the same task, and a small job that searches on the proxy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.learning.data.registry import load_dataset


@dataclass(frozen=True)
class RecipeFiles:
    private: Path
    proxy: Path

    def job(self, **recipe: Any) -> dict[str, Any]:
        """A DP-FedAvg job on the private half that searches on the proxy (``recipe`` merged
        into its recipe section); the learning rate is the user's, everything else default."""
        return {
            "name": "recipe-test",
            "algorithm": "dp-fedavg",
            "data": {"dataset": f"npz:{self.private}"},
            "rounds": 3,
            "privacy": {"unit": "agent", "noise_multiplier": 0.05, "delta": 1e-5},
            "secagg": {"enabled": False},
            "params": {"sampling_rate": 1.0},
            "recipe": {"search": True, "proxy": f"npz:{self.proxy}", **recipe},
        }


def recipe_files(folder: Path) -> RecipeFiles:
    """Write the two halves under ``folder``; the private half carries its own test split."""
    digits = load_dataset("digits")
    x = np.concatenate([digits.x_train, digits.x_test]).reshape(-1, 64)
    y = np.concatenate([digits.y_train, digits.y_test])
    order = np.random.default_rng(7).permutation(y.size)
    mine, public = order[:900], order[900:]
    private, proxy = folder / "private.npz", folder / "proxy.npz"
    np.savez(private, x=x[mine[:700]], y=y[mine[:700]], x_test=x[mine[700:]], y_test=y[mine[700:]])
    np.savez(proxy, x=x[public], y=y[public])
    return RecipeFiles(private, proxy)
