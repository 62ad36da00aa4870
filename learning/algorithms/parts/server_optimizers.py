"""Server optimizers of the DP-FedAvg family: how the coordinator turns the decoded noisy mean
update into a model step (FedAvg, FedAvgM, FedAdam, FedYogi; Reddi et al. 2021).

They read only the released noisy aggregate and their own state, so they are post-processing and
cost no privacy. The update rules and their state: docs/algorithms.md#server-optimizers.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.jobs import Strict

__all__ = [
    "AdaptiveServer",
    "MomentumServer",
    "ServerOptimizer",
    "SgdServer",
    "server_step",
]

#: The blob names of the optimizer state in ``CoordinatorState.blobs``; "momentum" is the name
#: FedAvgM has always used, so states written before the option existed still load.
MOMENTUM_BLOB = "momentum"
FIRST_MOMENT_BLOB = "adam_m"
SECOND_MOMENT_BLOB = "adam_v"


class SgdServer(Strict):
    """FedAvg: ``θ ← θ + η·u``."""

    kind: Literal["sgd"]
    learning_rate: float = Field(default=1.0, gt=0)


class MomentumServer(Strict):
    """FedAvgM: ``v ← β·v + u``, ``θ ← θ + η·v`` (heavy ball, averages successive rounds'
    noise)."""

    kind: Literal["momentum"]
    learning_rate: float = Field(default=1.0, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)


class AdaptiveServer(Strict):
    """FedAdam / FedYogi with bias correction; ``epsilon`` is the adaptivity τ (Reddi et al.
    suggest 1e-3: it bounds the step of a coordinate whose noisy second moment is tiny)."""

    kind: Literal["adam", "yogi"]
    learning_rate: float = Field(default=0.01, gt=0)
    betas: tuple[float, float] = (0.9, 0.99)
    epsilon: float = Field(default=1e-3, gt=0)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        """Each β must lie in [0, 1); the error names the one that does not."""
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"betas[{i}] must lie in [0, 1), got {beta!r}")
        return betas


ServerOptimizer = Annotated[
    SgdServer | MomentumServer | AdaptiveServer, Field(discriminator="kind")
]


def _buffer(blobs: dict[str, bytes], name: str, dimension: int) -> npt.NDArray[np.float64]:
    raw = blobs.get(name)
    if raw is None:
        return np.zeros(dimension)
    buffer = np.frombuffer(raw, dtype="<f8").copy()
    if buffer.shape != (dimension,):
        raise AlgorithmError(
            f"the stored {name} buffer has {buffer.size} entries, the model {dimension}"
        )
    return buffer


def _store(blobs: dict[str, bytes], name: str, buffer: npt.NDArray[np.float64]) -> None:
    blobs[name] = buffer.astype("<f8").tobytes()


def server_step(
    optimizer: SgdServer | MomentumServer | AdaptiveServer,
    update: npt.NDArray[np.float64],
    blobs: dict[str, bytes],
    *,
    step_number: int,
) -> npt.NDArray[np.float64]:
    """The model step for the mean update ``u`` of server step ``step_number`` (1, 2, ...);
    ``blobs`` (the optimizer state) is updated in place.

    Raises:
        AlgorithmError: a step number below 1, or a stored buffer of the wrong length.
    """
    if step_number < 1:
        raise AlgorithmError(f"server step numbers start at 1, got {step_number}")
    dimension = update.shape[0]
    if isinstance(optimizer, SgdServer):
        return optimizer.learning_rate * update
    if isinstance(optimizer, MomentumServer):
        if optimizer.momentum == 0.0:
            return optimizer.learning_rate * update
        velocity = optimizer.momentum * _buffer(blobs, MOMENTUM_BLOB, dimension) + update
        _store(blobs, MOMENTUM_BLOB, velocity)
        return optimizer.learning_rate * velocity
    beta1, beta2 = optimizer.betas
    m = beta1 * _buffer(blobs, FIRST_MOMENT_BLOB, dimension) + (1.0 - beta1) * update
    v = _buffer(blobs, SECOND_MOMENT_BLOB, dimension)
    square = update * update
    if optimizer.kind == "adam":
        v = beta2 * v + (1.0 - beta2) * square
    else:  # Yogi: v moves towards u² additively, at most (1 − β₂)·u² per step
        v = v - (1.0 - beta2) * square * np.sign(v - square)
    _store(blobs, FIRST_MOMENT_BLOB, m)
    _store(blobs, SECOND_MOMENT_BLOB, v)
    m_hat = m / (1.0 - beta1**step_number)
    v_hat = v / (1.0 - beta2**step_number)
    step: npt.NDArray[np.float64] = (
        optimizer.learning_rate * m_hat / (np.sqrt(np.maximum(v_hat, 0.0)) + optimizer.epsilon)
    )
    return step
