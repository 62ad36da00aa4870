"""DP-Helmet's local learner: one-vs-rest linear models by projected SGD.

Per class, ``J(f) = (Λ/2)‖f‖² + (1/M)·Σ ℓ(y·fᵀa)`` with ``a = clip_c((1, φ(x)))``, ℓ the
Huber-smoothed hinge or the logistic loss, one record per step over ``epochs`` passes, step
``min(1/β, 1/(Λt))`` and projection onto the R-ball. These choices make each step a contraction,
which gives the per-class sensitivity ``2c/(MΛ)``
(docs/accounting.md#dp-helmet-record-level-sensitivity). Training reads only the agent's records,
the task and a public seed for the order.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpfl.learning.algorithms import common
from dpfl.learning.algorithms.base import AlgorithmError

__all__ = [
    "LOSSES",
    "augment_and_clip",
    "class_sensitivities",
    "model_bytes",
    "predict",
    "ring_scale_bits",
    "sensitivity",
    "smoothness",
    "train_one_vs_rest",
]

Loss = Literal["huber", "logistic"]
LOSSES: tuple[Loss, ...] = ("huber", "logistic")
_NORM_MARGIN = 1e-12  # keeps a float-clipped row's true norm below c


def augment_and_clip(features: npt.ArrayLike, clip: float) -> npt.NDArray[np.float64]:
    """``clip_c((1, φ))`` per row: ``(n, p)`` features to ``(n, p+1)`` inputs of norm ≤ c.

    Raises:
        AlgorithmError: features that are not a finite 2-D array, or a clip ≤ 0.
    """
    phi = np.asarray(features, dtype=np.float64)
    if phi.ndim != 2 or not np.isfinite(phi).all():
        raise AlgorithmError(f"features must be a finite (n, p) array, got shape {phi.shape}")
    if not (math.isfinite(clip) and clip > 0):
        raise AlgorithmError(f"input clip must be a positive number, got {clip!r}")
    a = np.concatenate([np.ones((phi.shape[0], 1)), phi], axis=1)
    norms = np.linalg.norm(a, axis=1)
    limit = clip * (1.0 - _NORM_MARGIN)
    scale = np.where(norms > limit, limit / np.maximum(norms, 1e-300), 1.0)
    out: npt.NDArray[np.float64] = a * scale[:, None]
    return out


def smoothness(
    *, loss: Loss, clip: float, regularization: float, dimension: int, huber_h: float
) -> float:
    """β = √((c²·κ + Λ)² + p·Λ²) with κ = 1/(2h) (Huber) or 1/4 (logistic)."""
    kappa = 1.0 / (2.0 * huber_h) if loss == "huber" else 0.25
    lam = regularization
    return math.sqrt((clip * clip * kappa + lam) ** 2 + dimension * lam * lam)


def sensitivity(
    *, unit: str, clip: float, radius: float, regularization: float, local_size: int | None
) -> float:
    """s per class model: ``2c/(MΛ)`` (record) or ``2R`` (agent).

    Raises:
        AlgorithmError: record level without a local size ≥ 1, or an unknown unit.
    """
    if unit == "agent":
        return 2.0 * radius
    if unit != "record":
        raise AlgorithmError(f"unknown protected unit {unit!r} (record or agent)")
    if local_size is None or local_size < 1:
        raise AlgorithmError("record-level sensitivity needs the local data size M >= 1")
    return 2.0 * clip / (local_size * regularization)


def _loss_derivative(loss: Loss, z: npt.NDArray[np.float64], h: float) -> npt.NDArray[np.float64]:
    """ℓ'(z), in [−1, 0]."""
    if loss == "huber":
        out: npt.NDArray[np.float64] = np.where(
            z > 1.0 + h, 0.0, np.where(z < 1.0 - h, -1.0, -(1.0 + h - z) / (2.0 * h))
        )
        return out
    return -0.5 * (1.0 - np.tanh(0.5 * z))  # −1/(1 + e^z), stable for large |z|


def train_one_vs_rest(
    inputs: npt.ArrayLike,
    labels: npt.ArrayLike,
    *,
    num_classes: int,
    loss: Loss,
    regularization: float,
    radius: float,
    huber_h: float,
    clip: float,
    epochs: int,
    seed: int,
) -> npt.NDArray[np.float64]:
    """The K one-vs-rest models ``(K, p+1)``, every row in the R-ball (module docstring).

    Args:
        inputs: ``(M, p+1)`` augmented, clipped inputs (:func:`augment_and_clip` with ``clip``).
        labels: ``(M,)`` integer classes in ``[0, K)``.
        num_classes: K.
        loss: ``huber`` or ``logistic``.
        regularization: Λ > 0.
        radius: R > 0.
        huber_h: h > 0 (Huber only).
        clip: c, the inputs' norm bound (for β).
        epochs: passes over the data.
        seed: seed of the (data-independent) order of each pass.

    Raises:
        AlgorithmError: inconsistent shapes or hyper-parameters.
    """
    a = np.asarray(inputs, dtype=np.float64)
    y = np.asarray(labels)
    if a.ndim != 2 or a.shape[0] == 0 or y.shape != (a.shape[0],):
        raise AlgorithmError(f"inputs {a.shape} and labels {y.shape} do not match")
    if np.linalg.norm(a, axis=1).max() > clip:
        raise AlgorithmError(f"inputs must be clipped to norm {clip:g} first")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= num_classes:
        raise AlgorithmError(f"labels must be integers in [0, {num_classes})")
    if loss not in LOSSES:
        raise AlgorithmError(f"unknown loss {loss!r} (expected one of {LOSSES})")
    if min(regularization, radius, huber_h) <= 0 or epochs < 1:
        raise AlgorithmError("regularization, radius and huber_h must be > 0, epochs >= 1")
    m, width = a.shape
    beta = smoothness(
        loss=loss, clip=clip, regularization=regularization, dimension=width - 1, huber_h=huber_h
    )
    signs = np.where(np.arange(num_classes)[None, :] == y[:, None], 1.0, -1.0)  # (M, K)
    models = np.zeros((num_classes, width))
    order = np.random.default_rng(seed)
    t = 0
    for _ in range(epochs):
        for i in order.permutation(m):
            t += 1
            eta = min(1.0 / beta, 1.0 / (regularization * t))
            z = signs[i] * (models @ a[i])
            g = _loss_derivative(loss, z, huber_h) * signs[i]  # dℓ/d(fᵀa) per class
            models *= 1.0 - eta * regularization
            models -= eta * np.outer(g, a[i])
            norms = np.linalg.norm(models, axis=1)
            over = norms > radius
            if over.any():
                models[over] *= (radius / norms[over])[:, None]
    return models


def predict(models: npt.ArrayLike, inputs: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The class of highest score ``f_kᵀ a`` per row."""
    scores = np.asarray(inputs, dtype=np.float64) @ np.asarray(models, dtype=np.float64).T
    out: npt.NDArray[np.int64] = scores.argmax(axis=1).astype(np.int64)
    return out


def class_sensitivities(*, s: float, scale_bits: int, width: int) -> tuple[float, float]:
    """``(Δ₁, Δ₂)`` of one class block of ``width = p+1`` coordinates, in ring units."""
    scaled = math.ldexp(s, scale_bits)
    return (
        math.sqrt(width) * scaled + 2.0 * width,
        scaled + 2.0 * math.sqrt(width),
    )


def ring_scale_bits(s: float, width: int) -> int:
    """The smallest b with ``2√(p+1) ≤ 0.1 %·2^b·s`` (rounding next to the sensitivity)."""
    for bits in range(common.MAX_AUTO_SCALE_BITS + 1):
        if 2.0 * math.sqrt(width) <= common.SCALE_INFLATION * math.ldexp(s, bits):
            return bits
    raise AlgorithmError(f"no scale keeps the rounding of sensitivity {s:g} small")


def model_bytes(
    models: npt.NDArray[np.float64],
    *,
    features: str,
    input_clip: float,
    features_sha256: str | None = None,
) -> bytes:
    """The averaged models as a bias-free linear layer over ``clip_c((1, φ(x)))``; a learned φ
    is named by its artifact's SHA-256 (the job's model version 0)."""
    import torch

    from dpfl.learning.params import model_to_bytes

    classes, width = models.shape
    layer = torch.nn.Linear(width, classes, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(models.astype(np.float32)))
    return model_to_bytes(
        layer,
        metadata={
            "algorithm": "dp-helmet",
            "model": "one-vs-rest-linear",
            "features": features,
            "input": "clip_c((1, features))",
            "input_clip": input_clip,
            **({"features_sha256": features_sha256} if features_sha256 else {}),
        },
    )
