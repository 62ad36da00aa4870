"""Feature maps LEARNED from the public unlabeled pool only, shipped to agents as a frozen artifact.

``public-kmeans`` is the single-layer network of Coates & Ng (2011): k-means centroids of
contrast-normalised, ZCA-whitened image patches; an image's features are the "triangle"
activations ``max(0, mean_j z_j − z_k)`` (``z_k`` the distance of a patch to centroid k) summed
over the four image quadrants, standardised and projected by a PCA fitted on the public
features, then scaled to unit L2 norm. Every parameter is a function of the public images and a
public seed, so applying the map to private records is post-processing of nothing private
(docs/features.md explains why it costs no privacy and how the artifact is shipped).

The coordinator fits the map (:func:`fit_kmeans_features`) and ships :meth:`KMeansFeatureMap.
to_bytes` as the job's model version 0; the task names the artifact's SHA-256 and every agent
rebuilds the identical map with :func:`load_feature_map`, which refuses a different artifact.
The byte format is deterministic (no pickle, no timestamps): a magic line, a JSON header and
little-endian float32 arrays.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view
from pydantic import BaseModel, ValidationError

from dpfl.learning.errors import LearningError
from dpfl.learning.features import GaborFeatures
from dpfl.learning.specs import parse_spec

__all__ = [
    "GaborPcaMap",
    "GaborPcaOptions",
    "KMeansFeatureMap",
    "KMeansOptions",
    "PcaFeatureMap",
    "PcaOptions",
    "fit_gabor_pca_features",
    "fit_kmeans_features",
    "fit_pca_features",
    "gabor_pca_options",
    "kmeans_options",
    "load_feature_map",
    "pca_options",
]

_MAGIC = b"DPFL-FEATURE-MAP-1\n"
_ARRAYS = ("patch_mean", "whitening", "centroids", "feature_mean", "feature_scale", "components")
_CONTRAST_EPS = 0.01  # added to a patch's variance before contrast normalisation
_WHITEN_EPS = 0.1  # added to the patch covariance's eigenvalues (ZCA)
_SCALE_FLOOR = 1e-3  # floor of a pooled feature's standard deviation
_BATCH = 512  # images per chunk when extracting features


@dataclass(frozen=True, slots=True)
class KMeansOptions:
    """What the job chooses: centroids K, patch size P, stride, output dim D, the rows' norm,
    seed, and the number of Lloyd iterations and of patches sampled for k-means."""

    centroids: int = 64
    patch: int = 5
    stride: int = 2
    dim: int = 64
    seed: int = 0
    iterations: int = 10
    samples: int = 100_000
    norm: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.norm) and self.norm > 0):
            raise LearningError(f"public-kmeans norm must be a positive number, got {self.norm}")
        for key in ("centroids", "patch", "stride", "dim", "iterations", "samples"):
            if getattr(self, key) < 1:
                raise LearningError(f"public-kmeans {key} must be >= 1, got {getattr(self, key)}")
        if self.seed < 0:
            raise LearningError(f"public-kmeans seed must be >= 0, got {self.seed}")
        if self.dim > 4 * self.centroids:
            raise LearningError(
                f"public-kmeans dim {self.dim} exceeds the 4×{self.centroids} pooled features"
            )

    @property
    def spec(self) -> str:
        """The spec string naming these options (every option written, sorted by key)."""
        return (
            f"public-kmeans?centroids={self.centroids}&dim={self.dim}&iterations="
            f"{self.iterations}&norm={self.norm:.17g}&patch={self.patch}&samples={self.samples}"
            f"&seed={self.seed}&stride={self.stride}"
        )


def kmeans_options(spec: str) -> KMeansOptions:
    """The options of a ``public-kmeans?...`` spec (absent options take their defaults).

    Raises:
        LearningError: another extractor, an unknown option or a bad value.
    """
    parsed = parse_spec(spec, what="feature extractor", error=LearningError)
    if parsed.name != "public-kmeans" or parsed.path is not None:
        raise LearningError(f"{spec!r} is not a public-kmeans spec")
    keys = ("centroids", "patch", "stride", "dim", "seed", "iterations", "samples")
    parsed.check_options((*keys, "norm"), error=LearningError)
    defaults = KMeansOptions()
    values = {k: parsed.int_option(k, getattr(defaults, k), error=LearningError) for k in keys}
    norm = parsed.float_option("norm", defaults.norm, error=LearningError)
    return KMeansOptions(**values, norm=norm)


def _image_shape(input_shape: tuple[int, ...], patch: int) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise LearningError(
            f"public-kmeans needs images (channels, height, width), got input shape {input_shape}"
        )
    channels, height, width = input_shape
    if min(height, width) < patch + 1:
        raise LearningError(f"patch {patch} does not fit {height}×{width} images twice")
    return channels, height, width


def _patches(images: npt.NDArray[np.float32], patch: int, stride: int) -> npt.NDArray[np.float32]:
    """``(n, h', w', C·P·P)`` patches at the given stride."""
    windows = sliding_window_view(images, (patch, patch), axis=(2, 3))[:, :, ::stride, ::stride]
    n, c, h, w = windows.shape[:4]
    out: npt.NDArray[np.float32] = np.ascontiguousarray(
        windows.transpose(0, 2, 3, 1, 4, 5).reshape(n, h, w, c * patch * patch), dtype=np.float32
    )
    return out


def _contrast_normalise(p: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    centred = p - p.mean(axis=-1, keepdims=True)
    out: npt.NDArray[np.float32] = centred / np.sqrt(
        centred.var(axis=-1, keepdims=True) + np.float32(_CONTRAST_EPS)
    )
    return out


def _freeze_checked(owner: object, expected: dict[str, tuple[int, ...]]) -> None:
    """Check each named float32 array of a (frozen) map's shape and finiteness, then store it
    read-only and C-contiguous, so that the fitted and the loaded map round identically."""
    for key, shape in expected.items():
        array = getattr(owner, key)
        if array.shape != shape or array.dtype != np.float32:
            raise LearningError(
                f"feature map array {key} has shape {array.shape} ({array.dtype}), "
                f"expected {shape} float32"
            )
        if not np.isfinite(array).all():
            raise LearningError(f"feature map array {key} holds non-finite values")
        array = np.ascontiguousarray(array)
        array.flags.writeable = False
        object.__setattr__(owner, key, array)


class _FittedMap:
    """What every fitted map answers from its options: its spec string (the artifact's
    SHA-256 pins the fitted values) and its output dimension D."""

    __slots__ = ()
    options: KMeansOptions | PcaOptions | GaborPcaOptions

    @property
    def name(self) -> str:
        return self.options.spec

    @property
    def dim(self) -> int:
        return self.options.dim


@dataclass(frozen=True, slots=True)
class KMeansFeatureMap(_FittedMap):
    """A fitted ``public-kmeans`` map: ``(n, C, H, W)`` images to unit-norm ``(n, D)`` float32."""

    options: KMeansOptions
    input_shape: tuple[int, int, int]
    patch_mean: npt.NDArray[np.float32]  # (C·P·P,)
    whitening: npt.NDArray[np.float32]  # (C·P·P, C·P·P)
    centroids: npt.NDArray[np.float32]  # (K, C·P·P)
    feature_mean: npt.NDArray[np.float32]  # (4K,)
    feature_scale: npt.NDArray[np.float32]  # (4K,)
    components: npt.NDArray[np.float32]  # (4K, D)

    def __post_init__(self) -> None:
        o = self.options
        width = self.input_shape[0] * o.patch * o.patch
        expected = {
            "patch_mean": (width,),
            "whitening": (width, width),
            "centroids": (o.centroids, width),
            "feature_mean": (4 * o.centroids,),
            "feature_scale": (4 * o.centroids,),
            "components": (4 * o.centroids, o.dim),
        }
        _freeze_checked(self, expected)

    def pooled(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """The ``(n, 4K)`` quadrant-pooled triangle activations, before standardisation."""
        images = np.asarray(x, dtype=np.float32)
        if images.ndim != 4 or tuple(images.shape[1:]) != self.input_shape:
            raise LearningError(
                f"expected a batch of {self.input_shape} images, got shape {images.shape}"
            )
        o = self.options
        sq_centroids = (self.centroids * self.centroids).sum(axis=1)
        chunks = []
        for start in range(0, images.shape[0], _BATCH):
            p = _patches(images[start : start + _BATCH], o.patch, o.stride)
            q = (_contrast_normalise(p) - self.patch_mean) @ self.whitening
            sq = np.maximum((q * q).sum(-1, keepdims=True) - 2.0 * q @ self.centroids.T, 0.0)
            z = np.sqrt(np.maximum(sq + sq_centroids, 0.0))
            f = np.maximum(z.mean(axis=-1, keepdims=True) - z, 0.0)
            h, w = f.shape[1] // 2, f.shape[2] // 2
            quadrants = (f[:, :h, :w], f[:, :h, w:], f[:, h:, :w], f[:, h:, w:])
            chunks.append(np.concatenate([part.sum(axis=(1, 2)) for part in quadrants], axis=1))
        if not chunks:
            return np.zeros((0, 4 * o.centroids), dtype=np.float32)
        out: npt.NDArray[np.float32] = np.concatenate(chunks).astype(np.float32)
        return out

    def __call__(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Features of norm ``options.norm`` (a row that projects to 0 stays 0), up to float
        rounding; DP-Helmet's own clip is what its sensitivity rests on."""
        z = ((self.pooled(x) - self.feature_mean) / self.feature_scale) @ self.components
        norms = np.linalg.norm(z, axis=1, keepdims=True)
        unit = np.where(norms > 0, z / np.maximum(norms, 1e-30), 0.0)
        out: npt.NDArray[np.float32] = (unit * self.options.norm).astype(np.float32)
        return out

    def to_bytes(self) -> bytes:
        """The deterministic artifact (module docstring)."""
        return _artifact(
            self.options.spec, self.input_shape, [(k, getattr(self, k)) for k in _ARRAYS]
        )

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of :meth:`to_bytes`, which the task names."""
        return hashlib.sha256(self.to_bytes()).hexdigest()


def _artifact(
    spec: str, input_shape: tuple[int, ...], arrays: list[tuple[str, npt.NDArray[np.float32]]]
) -> bytes:
    """Magic, header length, JSON header (spec, input shape, arrays), little-endian float32s."""
    raw = [(k, np.ascontiguousarray(a, dtype="<f4")) for k, a in arrays]
    header = json.dumps(
        {
            "spec": spec,
            "input_shape": list(input_shape),
            "arrays": [[k, list(a.shape)] for k, a in raw],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return b"".join([_MAGIC, struct.pack("<I", len(header)), header, *(bytes(a) for _, a in raw)])


@dataclass(frozen=True, slots=True)
class PcaOptions:
    """``public-pca``: the first ``dim`` principal components of the public inputs."""

    dim: int = 30

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise LearningError(f"public-pca dim must be >= 1, got {self.dim}")

    @property
    def spec(self) -> str:
        """The spec string naming these options."""
        return f"public-pca?dim={self.dim}"


def pca_options(spec: str) -> PcaOptions:
    """The options of a ``public-pca?dim=D`` spec.

    Raises:
        LearningError: another extractor, an unknown option or a bad value.
    """
    parsed = parse_spec(spec, what="feature extractor", error=LearningError)
    if parsed.name != "public-pca" or parsed.path is not None:
        raise LearningError(f"{spec!r} is not a public-pca spec")
    parsed.check_options(("dim",), error=LearningError)
    return PcaOptions(dim=parsed.int_option("dim", PcaOptions().dim, error=LearningError))


class _ProjectionMap(_FittedMap):
    """A fitted map whose artifact is a ``mean`` and a ``components`` matrix."""

    __slots__ = ()
    input_shape: tuple[int, ...]
    mean: npt.NDArray[np.float32]
    components: npt.NDArray[np.float32]

    def to_bytes(self) -> bytes:
        """The deterministic artifact (module docstring)."""
        arrays = [("mean", self.mean), ("components", self.components)]
        return _artifact(self.options.spec, self.input_shape, arrays)

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of :meth:`to_bytes`, which the task names."""
        return hashlib.sha256(self.to_bytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class PcaFeatureMap(_ProjectionMap):
    """A fitted ``public-pca`` map: ``x ↦ (flatten(x) − mean)·components``, float32 ``(n, D)``
    (Euclidean neighbours in few dimensions, for Private-kNN-FL)."""

    options: PcaOptions
    input_shape: tuple[int, ...]
    mean: npt.NDArray[np.float32]  # (d,)
    components: npt.NDArray[np.float32]  # (d, D)

    def __post_init__(self) -> None:
        d = math.prod(self.input_shape)
        _freeze_checked(self, {"mean": (d,), "components": (d, self.options.dim)})

    def __call__(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Project ``(n, *input_shape)`` onto the public principal components."""
        array = np.asarray(x, dtype=np.float32)
        d = math.prod(self.input_shape)
        if array.ndim < 1 or math.prod(array.shape[1:]) != d:
            raise LearningError(f"expected a batch of {d}-value records, got shape {array.shape}")
        centred = array.reshape(array.shape[0], d) - self.mean
        out: npt.NDArray[np.float32] = (centred @ self.components).astype(np.float32)
        return out


def fit_pca_features(
    public_x: npt.ArrayLike, options: PcaOptions, *, input_shape: tuple[int, ...]
) -> PcaFeatureMap:
    """Fit on the PUBLIC inputs only (no randomness: an SVD, a fixed sign per component).

    Raises:
        LearningError: inputs of another shape, or fewer public rows or values than ``dim``.
    """
    shape = tuple(int(s) for s in input_shape)
    d = math.prod(shape)
    rows = np.asarray(public_x, dtype=np.float64)
    if rows.ndim < 1 or math.prod(rows.shape[1:]) != d:
        raise LearningError(f"public data of shape {rows.shape} does not hold {shape} inputs")
    rows = rows.reshape(rows.shape[0], d)
    if rows.shape[0] <= options.dim or d < options.dim:
        raise LearningError(
            f"{rows.shape[0]} public rows of {d} values cannot fit a {options.dim}-dimensional PCA"
        )
    if not np.isfinite(rows).all():
        raise LearningError("the public data holds non-finite values")
    mean, components, _ = _principal(rows, options.dim)
    return PcaFeatureMap(
        options=options,
        input_shape=shape,
        mean=mean.astype(np.float32),
        components=components.astype(np.float32),
    )


def _principal(
    rows: npt.NDArray[np.float64], dim: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The rows' mean, their first ``dim`` principal directions ``(d, dim)`` (a fixed sign
    each: the largest entry positive) and the standard deviation along each."""
    mean = rows.mean(axis=0)
    _, values, vt = np.linalg.svd(rows - mean, full_matrices=False)
    components = vt[:dim].T
    signs = np.sign(components[np.abs(components).argmax(axis=0), np.arange(dim)])
    components *= np.where(signs == 0, 1.0, signs)
    return mean, components, values[:dim] / math.sqrt(rows.shape[0])


def _kmeans(
    points: npt.NDArray[np.float64], k: int, iterations: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Lloyd's algorithm from k distinct sampled points; an empty cluster takes a random point."""
    if points.shape[0] < k:
        raise LearningError(f"{points.shape[0]} public patches cannot seed {k} centroids")
    centroids = points[rng.choice(points.shape[0], k, replace=False)].copy()
    sq_points = (points * points).sum(axis=1, keepdims=True)
    for _ in range(iterations):
        d = sq_points - 2.0 * points @ centroids.T + (centroids * centroids).sum(axis=1)
        assign = d.argmin(axis=1)
        counts = np.bincount(assign, minlength=k)
        sums = np.zeros_like(centroids)
        np.add.at(sums, assign, points)
        empty = counts == 0
        centroids = np.where(empty[:, None], centroids, sums / np.maximum(counts, 1)[:, None])
        if empty.any():
            centroids[empty] = points[rng.choice(points.shape[0], int(empty.sum()))]
    return centroids


def fit_kmeans_features(
    public_x: npt.ArrayLike, options: KMeansOptions, *, input_shape: tuple[int, ...]
) -> KMeansFeatureMap:
    """Fit the map on the PUBLIC images only; the same images and options give the same bytes.

    Raises:
        LearningError: not images, too few public images or patches for the options.
    """
    shape = _image_shape(tuple(int(s) for s in input_shape), options.patch)
    images = np.asarray(public_x, dtype=np.float32)
    if images.ndim < 1 or math.prod(images.shape[1:]) != math.prod(shape):
        raise LearningError(f"public data of shape {images.shape} does not hold {shape} images")
    images = images.reshape(images.shape[0], *shape)
    if images.shape[0] <= options.dim:
        raise LearningError(
            f"{images.shape[0]} public images cannot fit a {options.dim}-dimensional PCA"
        )
    if not np.isfinite(images).all():
        raise LearningError("the public data holds non-finite values")
    rng = np.random.default_rng(options.seed)
    patches = _patches(images, options.patch, options.stride)
    patches = patches.reshape(-1, patches.shape[-1])
    chosen = rng.choice(patches.shape[0], min(options.samples, patches.shape[0]), replace=False)
    sample = _contrast_normalise(patches[np.sort(chosen)]).astype(np.float64)
    mean = sample.mean(axis=0)
    eigenvalues, vectors = np.linalg.eigh(np.cov(sample - mean, rowvar=False))
    whitening = (vectors / np.sqrt(np.maximum(eigenvalues, 0.0) + _WHITEN_EPS)) @ vectors.T
    centroids = _kmeans((sample - mean) @ whitening, options.centroids, options.iterations, rng)
    zero = np.zeros(4 * options.centroids, dtype=np.float32)
    partial = KMeansFeatureMap(
        options=options,
        input_shape=shape,
        patch_mean=mean.astype(np.float32),
        whitening=whitening.astype(np.float32),
        centroids=centroids.astype(np.float32),
        feature_mean=zero,
        feature_scale=np.ones_like(zero),
        components=np.zeros((4 * options.centroids, options.dim), dtype=np.float32),
    )
    pooled = partial.pooled(images).astype(np.float64)
    feature_mean = pooled.mean(axis=0)
    feature_scale = pooled.std(axis=0) + _SCALE_FLOOR
    _, _, vt = np.linalg.svd((pooled - feature_mean) / feature_scale, full_matrices=False)
    components = vt[: options.dim].T
    signs = np.sign(components[np.abs(components).argmax(axis=0), np.arange(options.dim)])
    components *= np.where(signs == 0, 1.0, signs)  # a fixed sign per component
    return KMeansFeatureMap(
        options=options,
        input_shape=shape,
        patch_mean=partial.patch_mean,
        whitening=partial.whitening,
        centroids=partial.centroids,
        feature_mean=feature_mean.astype(np.float32),
        feature_scale=feature_scale.astype(np.float32),
        components=components.astype(np.float32),
    )


@dataclass(frozen=True, slots=True)
class GaborPcaOptions:
    """``public-gabor``: the fixed Gabor map (``orientations``, ``pool``), then the first ``dim``
    principal components of the public images' Gabor features, each divided by its public
    standard deviation (whitened), then every row scaled to L2 norm ``norm``."""

    dim: int = 64
    orientations: int = 8
    pool: int = 3
    norm: float = 1.0

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise LearningError(f"public-gabor dim must be >= 1, got {self.dim}")
        if not (math.isfinite(self.norm) and self.norm > 0):
            raise LearningError(f"public-gabor norm must be a positive number, got {self.norm}")

    @property
    def spec(self) -> str:
        """The spec string naming these options (every option written, sorted by key)."""
        return (
            f"public-gabor?dim={self.dim}&norm={self.norm:.17g}"
            f"&orientations={self.orientations}&pool={self.pool}"
        )

    def gabor(self, input_shape: tuple[int, ...]) -> GaborFeatures:
        """The fixed first stage (its own row norm is undone by the whitening)."""
        return GaborFeatures(
            input_shape=input_shape, orientations=self.orientations, pool=self.pool
        )


def gabor_pca_options(spec: str) -> GaborPcaOptions:
    """The options of a ``public-gabor?...`` spec (defaults for the options it omits).

    Raises:
        LearningError: another extractor, an unknown option or a bad value.
    """
    parsed = parse_spec(spec, what="feature extractor", error=LearningError)
    if parsed.name != "public-gabor" or parsed.path is not None:
        raise LearningError(f"{spec!r} is not a public-gabor spec")
    keys = ("dim", "orientations", "pool")
    parsed.check_options((*keys, "norm"), error=LearningError)
    default = GaborPcaOptions()
    ints = {k: parsed.int_option(k, getattr(default, k), error=LearningError) for k in keys}
    norm = parsed.float_option("norm", default.norm, error=LearningError)
    return GaborPcaOptions(**ints, norm=norm)


@dataclass(frozen=True, slots=True)
class GaborPcaMap(_ProjectionMap):
    """A fitted ``public-gabor`` map: images to ``(n, D)`` float32 rows of norm ``norm``.

    The Gabor map's features are strongly correlated, so a norm-bounded linear model (DP-Helmet's
    clipped inputs and regularised weights) separates the classes with small margins; whitened on
    the public pool, the same information spreads over D directions of equal public variance."""

    options: GaborPcaOptions
    input_shape: tuple[int, ...]
    mean: npt.NDArray[np.float32]  # (g,): the public Gabor features' mean
    components: npt.NDArray[np.float32]  # (g, D): principal directions / their public std

    def __post_init__(self) -> None:
        g = self.options.gabor(self.input_shape).dim
        _freeze_checked(self, {"mean": (g,), "components": (g, self.options.dim)})

    def __call__(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Map ``(n, *input_shape)`` images to their whitened, rescaled components."""
        features = self.options.gabor(self.input_shape)(np.asarray(x, dtype=np.float32))
        projected = (features - self.mean) @ self.components
        lengths = np.linalg.norm(projected, axis=1, keepdims=True)
        scale = self.options.norm / np.maximum(lengths, 1e-12)
        out: npt.NDArray[np.float32] = np.where(lengths > 0, projected * scale, 0.0).astype(
            np.float32
        )
        return out


def fit_gabor_pca_features(
    public_x: npt.ArrayLike, options: GaborPcaOptions, *, input_shape: tuple[int, ...]
) -> GaborPcaMap:
    """Fit on the PUBLIC images only (the fixed Gabor map, then an SVD: no randomness).

    Raises:
        LearningError: not images, fewer public images than ``dim``, or more components than
            the Gabor map has values, or directions of no public variance among the first D.
    """
    shape = tuple(int(s) for s in input_shape)
    images = np.asarray(public_x, dtype=np.float32)
    if images.ndim < 1 or images.shape[1:] != shape:
        raise LearningError(f"public data of shape {images.shape} does not hold {shape} images")
    gabor = options.gabor(shape)
    if images.shape[0] <= options.dim or gabor.dim < options.dim:
        raise LearningError(
            f"{images.shape[0]} public images of {gabor.dim} Gabor values cannot fit a "
            f"{options.dim}-dimensional whitened PCA"
        )
    if not np.isfinite(images).all():
        raise LearningError("the public data holds non-finite values")
    mean, components, spread = _principal(gabor(images).astype(np.float64), options.dim)
    if spread.min() <= _SCALE_FLOOR * spread.max():
        raise LearningError(
            f"the public pool has almost no variance along some of the first {options.dim} "
            "Gabor components: ask for fewer (params.public_gabor.dim)"
        )
    return GaborPcaMap(
        options=options,
        input_shape=shape,
        mean=mean.astype(np.float32),
        components=(components / spread).astype(np.float32),
    )


def load_feature_map(
    data: bytes | None, *, spec: str, sha256: str, input_shape: tuple[int, ...]
) -> KMeansFeatureMap | PcaFeatureMap | GaborPcaMap:
    """The map of an artifact, checked against what the task names.

    Raises:
        LearningError: no artifact, a SHA-256 other than the task's, a malformed artifact, or
            one fitted for other options or another input shape.
    """
    if not data:
        raise LearningError(f"features {spec!r} need the job's feature-map artifact; none came")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise LearningError(
            f"the feature-map artifact has SHA-256 {digest}, the task names {sha256}: "
            "refusing a map other than the one every participant uses"
        )
    name = parse_spec(spec, what="feature extractor", error=LearningError).name
    if name == "public-pca":
        pca = pca_options(spec)
        shape: tuple[int, ...] = tuple(int(s) for s in input_shape)
        arrays = _read(data, pca.spec, shape, ("mean", "components"))
        return PcaFeatureMap(options=pca, input_shape=shape, **arrays)
    if name == "public-gabor":
        whitened = gabor_pca_options(spec)
        shape = tuple(int(s) for s in input_shape)
        arrays = _read(data, whitened.spec, shape, ("mean", "components"))
        return GaborPcaMap(options=whitened, input_shape=shape, **arrays)
    options = kmeans_options(spec)
    shape = _image_shape(tuple(int(s) for s in input_shape), options.patch)
    arrays = _read(data, options.spec, shape, _ARRAYS)
    return KMeansFeatureMap(options=options, input_shape=shape, **arrays)


class _Header(BaseModel):
    """An artifact's JSON header: the map's spec, its input shape, and each array's name and
    shape in the order the float32s follow."""

    spec: str
    input_shape: list[int]
    arrays: list[tuple[str, list[int]]]


def _read(
    data: bytes, spec: str, shape: tuple[int, ...], names: tuple[str, ...]
) -> dict[str, npt.NDArray[np.float32]]:
    """The named arrays of an artifact whose header names ``spec`` and ``shape``."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
        raise LearningError("the feature-map artifact does not start with its magic line")
    offset = len(_MAGIC) + 4
    (size,) = struct.unpack("<I", data[len(_MAGIC) : offset])
    try:
        header = _Header.model_validate_json(data[offset : offset + size])
    except ValidationError as exc:
        raise LearningError(f"the feature-map artifact's header is malformed: {exc}") from None
    if header.spec != spec:
        raise LearningError(
            f"the feature-map artifact was fitted as {header.spec!r}, the task names {spec!r}"
        )
    if header.input_shape != list(shape):
        raise LearningError(
            f"the feature-map artifact is for inputs {header.input_shape}, "
            f"this data has {list(shape)}"
        )
    entries = header.arrays
    if [e[0] for e in entries] != list(names):
        raise LearningError(f"the feature-map artifact must hold the arrays {names}")
    position, arrays = offset + size, {}
    for key, dims in entries:
        count = math.prod(dims)
        if position + 4 * count > len(data):
            raise LearningError(f"the feature-map artifact is truncated in array {key}")
        arrays[key] = (
            np.frombuffer(data, dtype="<f4", count=count, offset=position)
            .astype(np.float32)
            .reshape(dims)
        )
        position += 4 * count
    if position != len(data):
        raise LearningError(f"the feature-map artifact has {len(data) - position} extra bytes")
    return arrays
