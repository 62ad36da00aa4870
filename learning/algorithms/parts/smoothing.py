"""Laplacian smoothing of a vector: ``x = A_σ⁻¹ v`` with ``A_σ = I + σ·L``.

Derivation: docs/algorithms.md#dp-fed-ls. L is the Laplacian of the periodic chain, so ``A_σ``
is circulant and is inverted by FFT in O(d log d). σ = 0 returns a copy of the input; the mean
is preserved. Smoothing is post-processing of the released noisy sum and costs no privacy.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from dpfl.learning.algorithms.base import AlgorithmError

__all__ = ["laplacian_smooth", "smooth_pieces"]


def laplacian_smooth(vector: npt.ArrayLike, sigma_ls: float) -> npt.NDArray[np.float64]:
    """``(I + σ_ls·L)⁻¹ v`` for the periodic chain Laplacian L, by FFT.

    Args:
        vector: a finite 1-D vector v (length d ≥ 1).
        sigma_ls: σ_ls ≥ 0 (0: the identity).

    Raises:
        AlgorithmError: a negative or non-finite σ_ls, or a vector that is not finite and 1-D.
    """
    v = np.asarray(vector, dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or not np.isfinite(v).all():
        raise AlgorithmError(f"smoothing needs a finite non-empty 1-D vector, got shape {v.shape}")
    if not (isinstance(sigma_ls, int | float) and math.isfinite(sigma_ls) and sigma_ls >= 0):
        raise AlgorithmError(f"sigma_ls must be a finite number >= 0, got {sigma_ls!r}")
    if sigma_ls == 0 or v.size == 1:
        return v.copy()
    d = v.size
    k = np.arange(d // 2 + 1, dtype=np.float64)
    eigen = 1.0 + float(sigma_ls) * (2.0 - 2.0 * np.cos(2.0 * np.pi * k / d))
    out: npt.NDArray[np.float64] = np.fft.irfft(np.fft.rfft(v) / eigen, n=d)
    return out


def smooth_pieces(
    vector: npt.ArrayLike, sigma_ls: float, sizes: Sequence[int] | None
) -> npt.NDArray[np.float64]:
    """Smooth ``vector`` as one chain (``sizes`` None) or each consecutive piece of the given
    sizes on its own (one chain per flattened parameter tensor).

    Raises:
        AlgorithmError: sizes that do not add up to the vector's length, or bad input.
    """
    v = np.asarray(vector, dtype=np.float64)
    if sizes is None:
        return laplacian_smooth(v, sigma_ls)
    sizes = [int(n) for n in sizes]
    if any(n < 1 for n in sizes) or sum(sizes) != v.size:
        raise AlgorithmError(f"tensor sizes {sizes} do not split a vector of length {v.size}")
    bounds = np.cumsum([0, *sizes])
    return np.concatenate(
        [laplacian_smooth(v[a:b], sigma_ls) for a, b in itertools.pairwise(bounds)]
    )
