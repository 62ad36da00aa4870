"""The public feature extractor a job names (DP-Helmet, Private-kNN-FL), as both sides build it.

Both algorithms need every agent and the coordinator to apply the SAME map φ that depends on no
private data. Two kinds:

- fixed maps (:mod:`dpfl.learning.features`: ``identity``, ``random-projection``, ``gabor``):
  the task's spec string is enough, each agent rebuilds φ from it alone;
- maps learned from the public pool (:mod:`dpfl.learning.public_features`: ``public-kmeans``,
  ``public-pca``, ``public-gabor``):
  the coordinator fits φ at ``initial_state`` on ``CoordinatorData.public_x`` only, ships the
  artifact as the job's model version 0 and names its SHA-256 in every task; an agent refuses
  an artifact with another hash (docs/features.md).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from dpfl.learning.algorithms.base import AlgorithmError, CoordinatorData
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import Strict

__all__ = [
    "FEATURE_KINDS",
    "SHA256_PATTERN",
    "FeatureParams",
    "GaborParams",
    "LearnedFeature",
    "PublicGaborParams",
    "PublicKMeansParams",
    "PublicPcaParams",
    "build_extractor",
    "feature_dim",
    "feature_spec",
    "fit_artifact",
    "is_learned",
]

#: What ``params.features`` may name.
FEATURE_KINDS = Literal[
    "identity", "random-projection", "gabor", "public-kmeans", "public-pca", "public-gabor"
]
#: A lowercase hex SHA-256, as tasks name a feature-map artifact.
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class PublicKMeansParams(Strict):
    """Options of the ``public-kmeans`` map (docs/features.md#public-kmeans). DP-Helmet on MNIST
    does best with ``centroids: 128, norm: 3`` on a validation split of the agents' images
    (docs/features.md#measurements, examples/dp-helmet-mnist-public-kmeans.yaml)."""

    centroids: int = Field(default=64, ge=1)
    patch: int = Field(default=5, ge=1)
    stride: int = Field(default=2, ge=1)
    dim: int = Field(default=64, ge=1)
    seed: int = Field(default=0, ge=0)
    iterations: int = Field(default=10, ge=1)
    samples: int = Field(default=100_000, ge=1)
    norm: float = Field(default=1.0, gt=0)


class GaborParams(Strict):
    """Options of the ``gabor`` map (docs/features.md#gabor): orientations of the bank, the
    pooling grid's side and the records' norm; chosen on validation splits of MNIST,
    Fashion-MNIST and USPS (docs/utility.md#defaults-that-work)."""

    orientations: int = Field(default=8, ge=1, le=32)
    pool: int = Field(default=3, ge=1, le=8)
    norm: float = Field(default=8.0, gt=0)


class PublicPcaParams(Strict):
    """Options of the ``public-pca`` map (docs/features.md#public-pca)."""

    dim: int = Field(default=30, ge=1)


class PublicGaborParams(Strict):
    """Options of the ``public-gabor`` map (docs/features.md#public-gabor): the whitened
    components kept and the rows' norm; the Gabor stage takes ``params.gabor``'s orientations
    and pooling grid."""

    dim: int = Field(default=64, ge=1)
    norm: float = Field(default=1.0, gt=0)


class FeatureParams(Strict):
    """The ``params`` keys that choose a job's feature map φ (docs/features.md): its kind, the
    random projection's width and seed, and the learned maps' options."""

    features: FEATURE_KINDS = "identity"
    projection_dim: int = Field(default=256, ge=1)
    projection_seed: int = Field(default=0, ge=0)
    # the learned map's options (features: public-kmeans or public-pca; docs/features.md)
    public_kmeans: PublicKMeansParams = PublicKMeansParams()
    public_pca: PublicPcaParams = PublicPcaParams()
    public_gabor: PublicGaborParams = PublicGaborParams()
    gabor: GaborParams = GaborParams()

    def feature_spec(self) -> str:
        """The full spec string of φ (:func:`feature_spec`).

        Raises:
            AlgorithmError: options the learned map refuses.
        """
        g = self.gabor
        if self.features == "gabor":
            return f"gabor?norm={g.norm:g}&orientations={g.orientations}&pool={g.pool}"
        if self.features == "public-gabor":
            from dpfl.learning.public_features import GaborPcaOptions

            w = self.public_gabor
            options = GaborPcaOptions(
                dim=w.dim, norm=w.norm, orientations=g.orientations, pool=g.pool
            )
            return options.spec
        return feature_spec(
            self.features,
            dim=self.projection_dim,
            seed=self.projection_seed,
            kmeans=self.public_kmeans,
            pca=self.public_pca,
        )


class LearnedFeature(Strict):
    """A learned map's identity as the coordinator state keeps it."""

    spec: str
    sha256: str = Field(pattern=SHA256_PATTERN)


def feature_spec(
    features: str,
    *,
    dim: int,
    seed: int,
    kmeans: PublicKMeansParams | None = None,
    pca: PublicPcaParams | None = None,
) -> str:
    """``identity``, ``random-projection?dim=p&seed=s``, the full ``public-kmeans?...`` spec or
    ``public-pca?dim=D``.

    Raises:
        AlgorithmError: options the learned map refuses.
    """
    if features == "identity":
        return features
    if features == "random-projection":
        return f"random-projection?dim={dim}&seed={seed}"
    from dpfl.learning.public_features import KMeansOptions, PcaOptions

    if features == "public-pca":
        return PcaOptions(dim=(pca or PublicPcaParams()).dim).spec
    try:
        return KMeansOptions(**(kmeans or PublicKMeansParams()).model_dump()).spec
    except LearningError as exc:
        raise AlgorithmError(f"params.public_kmeans: {exc}") from exc


def is_learned(spec: str) -> bool:
    """Whether ``spec`` names a map fitted on the public pool (shipped as an artifact)."""
    return re.match(r"^public-[a-z]", spec) is not None


def feature_dim(spec: str, input_shape: tuple[int, ...]) -> int:
    """φ's output dimension, known from the spec alone (the plan needs it before any fit).

    Raises:
        AlgorithmError: an unknown or malformed spec.
    """
    if not is_learned(spec):
        return int(build_extractor(spec, input_shape).dim)
    from dpfl.learning.public_features import gabor_pca_options, kmeans_options, pca_options

    try:
        if spec.startswith("public-gabor"):
            return gabor_pca_options(spec).dim
        return pca_options(spec).dim if spec.startswith("public-pca") else kmeans_options(spec).dim
    except LearningError as exc:
        raise AlgorithmError(f"features {spec!r}: {exc}") from exc


def fit_artifact(spec: str, data: CoordinatorData) -> tuple[bytes, LearnedFeature]:
    """The coordinator's fit of a learned map on ``data.public_x`` ONLY, as shipped bytes.

    Raises:
        AlgorithmError: no public pool, or a fit the pool cannot support.
    """
    from dpfl.learning.public_features import (
        fit_gabor_pca_features,
        fit_kmeans_features,
        fit_pca_features,
        gabor_pca_options,
        kmeans_options,
        pca_options,
    )

    if data.public_x is None or len(data.public_x) == 0:
        raise AlgorithmError(
            f"features {spec!r} are learned from the public pool: give the job one (data.public)"
        )
    shape = tuple(data.input_shape)
    try:
        fitted: Any
        if spec.startswith("public-gabor"):
            options = gabor_pca_options(spec)
            fitted = fit_gabor_pca_features(data.public_x, options, input_shape=shape)
        elif spec.startswith("public-pca"):
            fitted = fit_pca_features(data.public_x, pca_options(spec), input_shape=shape)
        else:
            fitted = fit_kmeans_features(data.public_x, kmeans_options(spec), input_shape=shape)
    except LearningError as exc:
        raise AlgorithmError(f"features {spec!r}: {exc}") from exc
    artifact = fitted.to_bytes()
    return artifact, LearnedFeature(spec=spec, sha256=fitted.sha256)


def build_extractor(
    spec: str,
    input_shape: tuple[int, ...],
    *,
    artifact: bytes | None = None,
    sha256: str | None = None,
) -> Any:
    """The :class:`~dpfl.learning.features.FeatureExtractor` of ``spec`` for these inputs; a
    learned map from ``artifact``, which must hash to ``sha256``.

    Raises:
        AlgorithmError: an unknown or malformed spec, or a missing, corrupted or mismatched
            artifact.
    """
    from dpfl.learning.features import feature_extractor
    from dpfl.learning.public_features import load_feature_map

    try:
        if is_learned(spec):
            if sha256 is None:
                raise LearningError("the task names no SHA-256 for the learned map")
            return load_feature_map(
                artifact, spec=spec, sha256=sha256, input_shape=tuple(input_shape)
            )
        return feature_extractor(spec, input_shape=tuple(input_shape))
    except LearningError as exc:
        raise AlgorithmError(f"features {spec!r}: {exc}") from exc
