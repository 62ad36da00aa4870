"""Laplacian smoothing of a vector: ``x = A_σ⁻¹ v`` with ``A_σ = I + σ·L``
(docs/algorithms.md#dp-fed-ls).

L is the Laplacian of the 1-D periodic chain on d nodes (``2I − P − Pᵀ`` for the cyclic shift P:
diagonal 2, first off-diagonals −1, corners −1; for d = 2 the two −1's of each row fall on the
same entry, for d = 1 L = 0). ``A_σ`` is circulant, so the discrete Fourier transform
diagonalises it: its eigenvalue at frequency k is ``1 + σ·(2 − 2·cos(2πk/d))`` ≥ 1, and

    A_σ⁻¹ v = ifft( fft(v) / (1 + σ·(2 − 2·cos(2πk/d))) ),

in O(d log d) (rfft/irfft for real input). Invariants: σ = 0 is the identity (bit for bit: the
input is returned as a copy without a transform); the mean is preserved (the k = 0 eigenvalue is
1); the result is the unique solution of ``(I + σL)x = v`` (``test_dp_fed_ls.py`` checks it
against a dense solve). Smoothing is post-processing of the released noisy sum: it costs no
privacy (Liang et al., "Exploring Private Federated Learning with Laplacian Smoothing", 2020).
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
