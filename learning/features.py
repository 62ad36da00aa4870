"""Fixed, data-independent feature extractors for DP-Helmet and Private-kNN-FL.

Both algorithms need every agent (and the coordinator) to map records through the *same* public
function that depends on no private data, so that the extractor itself leaks nothing and
neighbourhoods or linear models are comparable across silos. Three are provided:

- ``identity``: the flattened input;
- ``random-projection``: ``x ↦ R·x`` with ``R ∈ R^{p×d}`` of i.i.d. N(0, 1/p) entries drawn from a
  public seed with numpy's PCG64 (stable across versions and platforms), so every silo builds the
  identical matrix from ``(d, p, seed)`` alone. Distances are preserved in expectation
  (Johnson-Lindenstrauss), which is what kNN needs; for linear models it is a cheap compression.
- ``gabor``: pooled moduli of a fixed Gabor filter bank (:class:`GaborFeatures`), a few hundred
  translation-tolerant image features that a linear model separates far better than pixels.

Invariant: an extractor is a pure function of its constructor arguments; its ``name`` string
(``identity``, ``random-projection?dim=64&seed=0``) names it in jobs and logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from dpfl.learning.errors import LearningError
from dpfl.learning.specs import parse_spec

__all__ = [
    "FeatureExtractor",
    "GaborFeatures",
    "IdentityFeatures",
    "RandomProjectionFeatures",
    "feature_extractor",
]


class FeatureExtractor(Protocol):
    """Maps a batch ``(n, *input_shape)`` to float32 features ``(n, dim)``."""

    @property
    def name(self) -> str:
        """Spec string naming this extractor."""
        ...

    @property
    def dim(self) -> int:
        """Output dimension p."""
        ...

    def __call__(self, x: NDArray[Any]) -> NDArray[np.float32]:
        """Extract features."""
        ...


def _flatten(x: NDArray[Any], d: int) -> NDArray[np.float32]:
    array = np.asarray(x, dtype=np.float32)
    if array.ndim < 1 or math.prod(array.shape[1:]) != d:
        raise LearningError(f"expected a batch of {d}-value records, got shape {array.shape}")
    return array.reshape(array.shape[0], d)


@dataclass(frozen=True, slots=True)
class IdentityFeatures:
    """The flattened input itself."""

    input_shape: tuple[int, ...]

    @property
    def name(self) -> str:
        """Spec string."""
        return "identity"

    @property
    def dim(self) -> int:
        """Output dimension (the number of input values)."""
        return math.prod(self.input_shape)

    def __call__(self, x: NDArray[Any]) -> NDArray[np.float32]:
        """Flatten ``(n, *input_shape)`` to ``(n, d)``."""
        return _flatten(x, self.dim).copy()


@dataclass(frozen=True, slots=True)
class RandomProjectionFeatures:
    """``x ↦ R·x`` for a Gaussian ``R`` (entries N(0, 1/dim)) drawn from a public seed."""

    input_shape: tuple[int, ...]
    out_dim: int
    seed: int = 0
    _matrix: NDArray[np.float32] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.out_dim < 1:
            raise LearningError(f"random-projection dim must be >= 1, got {self.out_dim}")
        if self.seed < 0:
            raise LearningError(f"random-projection seed must be >= 0, got {self.seed}")
        d = math.prod(self.input_shape)
        rng = np.random.default_rng(self.seed)
        matrix = rng.standard_normal((d, self.out_dim)) / math.sqrt(self.out_dim)
        matrix = matrix.astype(np.float32)
        matrix.flags.writeable = False
        object.__setattr__(self, "_matrix", matrix)

    @property
    def name(self) -> str:
        """Spec string (enough to rebuild the identical matrix)."""
        return f"random-projection?dim={self.out_dim}&seed={self.seed}"

    @property
    def dim(self) -> int:
        """Output dimension p."""
        return self.out_dim

    def __call__(self, x: NDArray[Any]) -> NDArray[np.float32]:
        """Project ``(n, *input_shape)`` to ``(n, p)``."""
        return _flatten(x, self._matrix.shape[0]) @ self._matrix


#: The Gabor bank's wavelengths in pixels (two scales) and its kernels' side.
GABOR_WAVELENGTHS = (4.0, 8.0)
GABOR_KERNEL = 9


def _gabor_bank(orientations: int) -> NDArray[np.float32]:
    """``(2·S·L, 1, K, K)``: for each wavelength λ and orientation θ, the even (zero-mean) and
    odd Gabor kernels of envelope σ = λ/2 and aspect 0.5, each of unit L2 norm."""
    half = GABOR_KERNEL // 2
    yy, xx = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float64)
    kernels = []
    for wavelength in GABOR_WAVELENGTHS:
        sigma = wavelength / 2
        for i in range(orientations):
            theta = math.pi * i / orientations
            along = xx * math.cos(theta) + yy * math.sin(theta)
            across = -xx * math.sin(theta) + yy * math.cos(theta)
            envelope = np.exp(-(along**2 + (0.5 * across) ** 2) / (2 * sigma**2))
            for phase in (0.0, math.pi / 2):
                kernel = envelope * np.cos(2 * math.pi * along / wavelength + phase)
                kernel -= kernel.mean()
                kernels.append(kernel / np.linalg.norm(kernel))
    return np.asarray(kernels, dtype=np.float32)[:, None]


@dataclass(frozen=True, slots=True)
class GaborFeatures:
    """A fixed bank of Gabor filters (2 wavelengths × ``orientations``, even and odd): the
    modulus of each channel's complex response, and the channel itself, averaged over a
    ``pool`` × ``pool`` grid, square-rooted, then each record's vector centred and scaled to
    L2 norm ``norm``. Every step is a function of one record alone, so the map needs no data
    (docs/features.md#gabor)."""

    input_shape: tuple[int, ...]
    orientations: int = 8
    pool: int = 3
    norm: float = 8.0
    _bank: NDArray[np.float32] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.input_shape) != 3 or min(self.input_shape[1:]) < self.pool:
            raise LearningError(
                f"gabor needs images (channels, height, width) of at least {self.pool} pixels "
                f"a side, got shape {self.input_shape}"
            )
        if not 1 <= self.orientations <= 32 or not 1 <= self.pool <= 8:
            raise LearningError("gabor orientations must lie in [1, 32] and pool in [1, 8]")
        if not (self.norm > 0 and math.isfinite(self.norm)):
            raise LearningError(f"gabor norm must be a positive number, got {self.norm}")
        object.__setattr__(self, "_bank", _gabor_bank(self.orientations))

    @property
    def name(self) -> str:
        """Spec string."""
        return f"gabor?norm={self.norm:g}&orientations={self.orientations}&pool={self.pool}"

    @property
    def dim(self) -> int:
        """(2 wavelengths × orientations + 1) × pool² per channel."""
        channels = self.input_shape[0]
        return channels * (len(GABOR_WAVELENGTHS) * self.orientations + 1) * self.pool**2

    def __call__(self, x: NDArray[Any]) -> NDArray[np.float32]:
        """Map ``(n, C, H, W)`` to ``(n, dim)``."""
        import torch
        import torch.nn.functional as f

        images = np.asarray(x, dtype=np.float32)
        if images.shape[1:] != tuple(self.input_shape):
            raise LearningError(
                f"gabor expected records of shape {self.input_shape}, got {images.shape}"
            )
        n, channels = images.shape[0], self.input_shape[0]
        bank = torch.from_numpy(self._bank)
        out = np.empty((n, self.dim), dtype=np.float32)
        with torch.no_grad():
            for start in range(0, n, 2048):
                chunk = np.array(
                    images[start : start + 2048], dtype=np.float32, order="C", copy=True
                )
                batch = torch.from_numpy(chunk).flatten(0, 1)[:, None]
                response = f.conv2d(batch, bank, padding=GABOR_KERNEL // 2)
                pairs = response.reshape(response.shape[0], -1, 2, *response.shape[2:])
                modulus = torch.hypot(pairs[:, :, 0], pairs[:, :, 1])
                pooled = torch.cat(
                    [
                        f.adaptive_avg_pool2d(modulus, self.pool),
                        f.adaptive_avg_pool2d(batch, self.pool),
                    ],
                    1,
                )
                rows = torch.sqrt(pooled.clamp(min=0)).reshape(-1, channels * pooled[0].numel())
                out[start : start + rows.shape[0]] = rows.numpy()
        centred = out - out.mean(axis=1, keepdims=True)
        lengths = np.linalg.norm(centred, axis=1, keepdims=True)
        scaled = np.where(lengths > 0, centred * (self.norm / np.maximum(lengths, 1e-12)), 0.0)
        return scaled.astype(np.float32)


def feature_extractor(spec: str, *, input_shape: tuple[int, ...]) -> FeatureExtractor:
    """Build an extractor from its spec: ``identity``, ``random-projection[?dim=64&seed=0]`` or
    ``gabor[?orientations=8&pool=3&norm=8]``.

    Raises:
        LearningError: unknown extractor or bad options.
    """
    parsed = parse_spec(spec, what="feature extractor", error=LearningError)
    if parsed.name == "gabor" and parsed.path is None:
        parsed.check_options(("orientations", "pool", "norm"), error=LearningError)
        return GaborFeatures(
            input_shape=tuple(input_shape),
            orientations=parsed.int_option("orientations", 8, error=LearningError, minimum=1),
            pool=parsed.int_option("pool", 3, error=LearningError, minimum=1),
            norm=parsed.float_option("norm", 8.0, error=LearningError, low=1e-6, high=1e6),
        )
    if parsed.name == "identity" and parsed.path is None:
        parsed.check_options((), error=LearningError)
        return IdentityFeatures(input_shape=tuple(input_shape))
    if parsed.name == "random-projection" and parsed.path is None:
        parsed.check_options(("dim", "seed"), error=LearningError)
        return RandomProjectionFeatures(
            input_shape=tuple(input_shape),
            out_dim=parsed.int_option("dim", 64, error=LearningError, minimum=1),
            seed=parsed.int_option("seed", 0, error=LearningError, minimum=0),
        )
    raise LearningError(f"unknown feature extractor {spec!r} (identity, random-projection, gabor)")
