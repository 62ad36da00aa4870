"""DP-Helmet's local learner: K linear models by projected SGD.

One-vs-rest, per class ``J(f) = (Λ/2)‖f‖² + (1/M)·Σ ℓ(y·fᵀa)`` with ``a = clip_c((1, φ(x)))``
and ℓ the Huber-smoothed hinge or the logistic loss; or ``softmax``, one multinomial logistic
model ``J(W) = (Λ/2)‖W‖² + (1/M)·Σ −log softmax(Wa)_y`` over the K×(p+1) block. One record per
step over ``epochs`` passes, step ``min(1/β, 1/(Λt))``, projection of every row onto the R-ball.
These choices make each step a contraction, which gives the sensitivity ``2L/(MΛ)`` of each
release, L the per-record loss gradient's bound: ``c`` per class one-vs-rest (K releases),
``√2·c`` for the softmax block (one release, √(K/2) times less than the K classes together;
docs/accounting.md#dp-helmet-record-level-sensitivity). Training reads only the agent's records,
the task and a public seed for the order.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.algorithms.parts import common

__all__ = [
    "LOSSES",
    "augment_and_clip",
    "model_bytes",
    "predict",
    "release_sensitivities",
    "releases",
    "ring_scale_bits",
    "sensitivity",
    "smoothness",
    "train",
]

Loss = Literal["huber", "logistic", "softmax"]
LOSSES: tuple[Loss, ...] = ("huber", "logistic", "softmax")
_KAPPA: dict[str, float] = {"logistic": 0.25, "softmax": 0.5}  # Huber's is 1/(2h)
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
    """β = √((c²·κ + Λ)² + p·Λ²) with κ = 1/(2h) (Huber), 1/4 (logistic) or 1/2 (softmax: the
    Hessian ``diag(q) − qqᵀ`` of log-sum-exp is at most ½, Böhning 1992)."""
    kappa = 1.0 / (2.0 * huber_h) if loss == "huber" else _KAPPA[loss]
    lam = regularization
    return math.sqrt((clip * clip * kappa + lam) ** 2 + dimension * lam * lam)


def releases(loss: Loss, classes: int, width: int) -> tuple[int, int]:
    """``(count, coordinates)`` of the releases one agent's block is charged as: K class models
    of ``width = p+1`` one-vs-rest, or the whole K×(p+1) block once (softmax)."""
    return (1, classes * width) if loss == "softmax" else (classes, width)


def sensitivity(
    *,
    unit: str,
    clip: float,
    radius: float,
    regularization: float,
    local_size: int | None,
    loss: Loss = "huber",
    classes: int = 1,
) -> float:
    """s per release (:func:`releases`): one-vs-rest ``2c/(MΛ)`` (record) or ``2R`` (agent) per
    class; softmax ``2√2·c/(MΛ)`` or ``2R√K`` for the block of K rows.

    Raises:
        AlgorithmError: record level without a local size ≥ 1, an unknown unit, or K < 1.
    """
    if classes < 1:
        raise AlgorithmError(f"the number of classes must be >= 1, got {classes!r}")
    if unit == "agent":
        return 2.0 * radius * (math.sqrt(classes) if loss == "softmax" else 1.0)
    if unit != "record":
        raise AlgorithmError(f"unknown protected unit {unit!r} (record or agent)")
    if local_size is None or local_size < 1:
        raise AlgorithmError("record-level sensitivity needs the local data size M >= 1")
    lipschitz = math.sqrt(2.0) * clip if loss == "softmax" else clip
    return 2.0 * lipschitz / (local_size * regularization)


def _loss_derivative(loss: Loss, z: npt.NDArray[np.float64], h: float) -> npt.NDArray[np.float64]:
    """ℓ'(z), in [−1, 0]."""
    if loss == "huber":
        out: npt.NDArray[np.float64] = np.where(
            z > 1.0 + h, 0.0, np.where(z < 1.0 - h, -1.0, -(1.0 + h - z) / (2.0 * h))
        )
        return out
    return -0.5 * (1.0 - np.tanh(0.5 * z))  # −1/(1 + e^z), stable for large |z|


def _score_gradient(
    loss: Loss, models: npt.NDArray[np.float64], a: npt.NDArray[np.float64], label: int, h: float
) -> npt.NDArray[np.float64]:
    """dℓ/d(f_kᵀa) per row k for one record: norm ≤ 1 (one-vs-rest, per class) or ≤ √2 (softmax,
    ``q − e_y`` with q the softmax of the scores)."""
    scores = models @ a
    if loss == "softmax":
        q: npt.NDArray[np.float64] = np.exp(scores - scores.max())
        q /= q.sum()
        q[label] -= 1.0
        return q
    signs = np.full(len(scores), -1.0)
    signs[label] = 1.0
    out: npt.NDArray[np.float64] = _loss_derivative(loss, signs * scores, h) * signs
    return out


def train(
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
    """The K models ``(K, p+1)``, every row in the R-ball (module docstring).

    Args:
        inputs: ``(M, p+1)`` augmented, clipped inputs (:func:`augment_and_clip` with ``clip``).
        labels: ``(M,)`` integer classes in ``[0, K)``.
        num_classes: K.
        loss: ``huber`` or ``logistic`` (one-vs-rest), or ``softmax``.
        regularization: Λ > 0.
        radius: R > 0.
        huber_h: h > 0 (Huber only).
        clip: c, the inputs' norm bound (for β).
        epochs: passes over the data.
        seed: seed of the (data-independent) order of each pass.

    Raises:
        AlgorithmError: inconsistent shapes or hyper-parameters.
    """
    a, y = np.asarray(inputs, dtype=np.float64), np.asarray(labels)
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
    models = np.zeros((num_classes, width))
    order = np.random.default_rng(seed)
    t = 0
    for _ in range(epochs):
        for i in order.permutation(m):
            t += 1
            eta = min(1.0 / beta, 1.0 / (regularization * t))
            g = _score_gradient(loss, models, a[i], int(y[i]), huber_h)
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


def release_sensitivities(*, s: float, scale_bits: int, width: int) -> tuple[float, float]:
    """``(Δ₁, Δ₂)`` of one release of ``width`` coordinates (:func:`releases`), in ring units."""
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
    softmax: bool = False,
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
            "model": "softmax-linear" if softmax else "one-vs-rest-linear",
            "features": features,
            "input": "clip_c((1, features))",
            "input_clip": input_clip,
            **({"features_sha256": features_sha256} if features_sha256 else {}),
        },
    )
