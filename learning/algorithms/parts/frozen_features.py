"""A frozen feature map φ in front of a model-update job's model (``params.features``).

DP-FedAvg and DP-Fed-LS may train their model on ``φ(x)`` instead of ``x``: φ is a fixed map
(``random-projection``) or one fitted by the coordinator on the public pool only
(``public-kmeans``, ``public-pca``), so applying it to private records releases nothing
(docs/features.md#why-it-costs-no-privacy). The model is then sized for φ's output
``(D,)``; only its parameters are trained, clipped, noised and summed, so the plan's dimension,
sensitivities and charge are those of the model on ``(D,)`` alone.

The global model a version holds is then a *bundle*: ``b"DPFLFZN1"``, a little-endian ``uint32``
header length, a JSON header ``{"features", "dim", "sha256", "artifact_bytes"}``, the learned
map's artifact (empty for a fixed map) and the model bytes of ``learning.params``. An agent
rebuilds φ from the bundle's artifact only when it hashes to the SHA-256 the TASK names, so a
coordinator cannot swap the map between the plan and a round unnoticed. A job without features
keeps plain model bytes, exactly as before.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field, model_validator

from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData
from dpfl.learning.algorithms.parts.extractors import (
    SHA256_PATTERN,
    build_extractor,
    feature_dim,
    fit_artifact,
    is_learned,
)
from dpfl.learning.algorithms.parts.feature_cache import FEATURES

__all__ = [
    "FeatureFront",
    "FeaturePlanFields",
    "FeatureTaskFields",
    "agent_inputs",
    "front_for",
    "model_input_shape",
    "unpack",
]

MAGIC = b"DPFLFZN1"
_MAX_HEADER = 1 << 16
_HEADER_KEYS = {"features", "dim", "sha256", "artifact_bytes"}


class FeaturePlanFields(BaseModel):
    """The plan fields of a model behind φ: the map's full spec and its width (None for
    ``identity``: the model sees the records themselves)."""

    features: str = Field(default="identity", min_length=1)
    feature_dim: int | None = Field(default=None, ge=1)


class FeatureTaskFields(BaseModel):
    """The task fields of a model behind φ: its spec (``identity``: none) and, for a learned map,
    the SHA-256 the model bundle's artifact must have (added once the state holds it; an agent
    refuses a learned map without one)."""

    features: str = Field(default="identity", min_length=1)
    features_sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)

    @model_validator(mode="after")
    def _hash_of_a_learned_map(self) -> FeatureTaskFields:
        if self.features_sha256 is not None and not is_learned(self.features):
            raise ValueError("features_sha256: only a learned feature map is named by a hash")
        return self


def model_input_shape(
    features: str, shape: tuple[int, ...], model: str
) -> tuple[tuple[int, ...], int | None]:
    """The shape the model sees behind ``features`` and φ's width (None for ``identity``).

    Raises:
        AlgorithmError: a cnn behind a map (φ gives vectors), or a malformed spec.
    """
    if features == "identity":
        return shape, None
    width = feature_dim(features, shape)
    if model == "cnn":
        raise AlgorithmError(
            f"params.features: {features!r} gives vectors of {width} values and a cnn needs "
            "images; use logreg or mlp behind a feature map"
        )
    return (width,), width


def agent_inputs(
    task: FeatureTaskFields, data: AgentData, model: bytes
) -> tuple[npt.NDArray[np.float32], tuple[int, ...], bytes]:
    """The agent's records as its model sees them, their shape, and the model bytes: through
    the task's φ, rebuilt from the download only when it is the map the task names (by spec
    and, for a learned map, by the task's SHA-256, never the bundle's own). Every download is
    checked; the records' features are computed once per map (:data:`FEATURES`).

    Raises:
        AlgorithmError: a download whose map is not the task's, or a corrupted artifact.
    """
    front, plain = unpack(model)
    if task.features == "identity":
        if front is not None:
            raise AlgorithmError(
                f"the download carries feature map {front.spec!r}; the task names none"
            )
        return data.x, tuple(data.input_shape), plain
    if front is None or front.spec != task.features:
        raise AlgorithmError(
            f"the task names feature map {task.features!r}; the download carries "
            f"{'none' if front is None else repr(front.spec)}"
        )
    if is_learned(task.features) and task.features_sha256 is None:
        raise AlgorithmError(
            f"the task names learned feature map {task.features!r} without its SHA-256"
        )
    shape = tuple(data.input_shape)
    extractor = front.extractor(shape, sha256=task.features_sha256)
    name = front.name(shape, sha256=task.features_sha256)  # the hash checked, not the header's
    x = FEATURES.features(data.x, name, lambda: extractor(data.x))
    return x, (front.dim,), plain


@dataclass(frozen=True, slots=True)
class FeatureFront:
    """φ as the job ships it: its spec, output width ``dim`` and, for a learned map, the
    artifact and its SHA-256."""

    spec: str
    dim: int
    sha256: str | None = None
    artifact: bytes | None = None

    def name(self, input_shape: tuple[int, ...], *, sha256: str | None = None) -> str:
        """What identifies φ on inputs of ``input_shape``: its spec and the artifact hash it was
        checked against (default: the bundle's own, which only the coordinator may trust)."""
        return f"{self.spec}#{self.sha256 if sha256 is None else sha256}#{input_shape}"

    def extractor(self, input_shape: tuple[int, ...], *, sha256: str | None = None) -> Any:
        """φ for inputs of ``input_shape``; a learned map must hash to ``sha256`` (default:
        the bundle's own, which only the coordinator may trust).

        Raises:
            AlgorithmError: a missing, corrupted or mismatched artifact, or another width.
        """
        expected = self.sha256 if sha256 is None else sha256
        extractor = build_extractor(
            self.spec, tuple(input_shape), artifact=self.artifact, sha256=expected
        )
        if int(extractor.dim) != self.dim:
            raise AlgorithmError(
                f"features {self.spec!r} give {extractor.dim} values, the job {self.dim}"
            )
        return extractor

    def pack(self, model: bytes) -> bytes:
        """The bundle of φ and ``model`` (module docstring)."""
        artifact = self.artifact or b""
        head = json.dumps(
            {
                "features": self.spec,
                "dim": self.dim,
                "sha256": self.sha256,
                "artifact_bytes": len(artifact),
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode("utf-8")
        return b"".join([MAGIC, struct.pack("<I", len(head)), head, artifact, model])

    def coordinator_view(self, data: CoordinatorData) -> CoordinatorData:
        """The coordinator's data as the model sees it: inputs of shape ``(dim,)`` and the test
        split through φ (computed once per test array and map); no public pool (the model
        never reads it)."""
        test_x, shape = data.test_x, tuple(data.input_shape)
        if test_x is not None:
            records = test_x
            test_x = FEATURES.features(
                records, self.name(shape), lambda: self.extractor(shape)(records)
            )
        return replace(
            data,
            input_shape=(self.dim,),
            test_x=test_x,
            public_x=None,
            public_y=None,
            agent_readable=None,
        )


def front_for(spec: str, data: CoordinatorData) -> FeatureFront | None:
    """The coordinator's φ for a job whose features are ``spec`` (None for ``identity``): a
    learned map is fitted on ``data.public_x`` only.

    Raises:
        AlgorithmError: no public pool for a learned map, or a fit it cannot support.
    """
    if spec == "identity":
        return None
    dim = feature_dim(spec, tuple(data.input_shape))
    if not is_learned(spec):
        return FeatureFront(spec=spec, dim=dim)
    artifact, learned = fit_artifact(spec, data)
    return FeatureFront(spec=spec, dim=dim, sha256=learned.sha256, artifact=artifact)


def unpack(blob: bytes) -> tuple[FeatureFront | None, bytes]:
    """``(φ, model bytes)`` of a bundle, or ``(None, blob)`` for plain model bytes.

    Raises:
        AlgorithmError: a truncated or malformed bundle.
    """
    view = memoryview(blob).cast("B")
    if bytes(view[: len(MAGIC)]) != MAGIC:
        return None, bytes(blob)
    start = len(MAGIC) + 4
    if len(view) < start:
        raise AlgorithmError("the model bundle is truncated (no header length)")
    (head_len,) = struct.unpack("<I", view[len(MAGIC) : start])
    if head_len > _MAX_HEADER or start + head_len > len(view):
        raise AlgorithmError(f"the model bundle's header length {head_len} exceeds the data")
    try:
        header = json.loads(bytes(view[start : start + head_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AlgorithmError(f"the model bundle's header is not JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
        raise AlgorithmError(f"the model bundle's header must have exactly {sorted(_HEADER_KEYS)}")
    spec, dim, sha, size = (header[k] for k in ("features", "dim", "sha256", "artifact_bytes"))
    if not isinstance(spec, str) or not spec or spec == "identity":
        raise AlgorithmError(f"the model bundle names no feature map ({spec!r})")
    for name, value in (("dim", dim), ("artifact_bytes", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AlgorithmError(
                f"the model bundle's {name} must be an integer >= 0, not {value!r}"
            )
    if sha is not None and not isinstance(sha, str):
        raise AlgorithmError("the model bundle's sha256 must be a string or null")
    if (sha is None) != (size == 0) or (sha is None) == is_learned(spec):
        raise AlgorithmError(
            f"the model bundle's map {spec!r} must carry an artifact and its SHA-256 exactly "
            "when it is learned"
        )
    offset = start + head_len
    if offset + size > len(view):
        raise AlgorithmError(f"the model bundle's artifact of {size} bytes exceeds the data")
    artifact = bytes(view[offset : offset + size]) if size else None
    front = FeatureFront(spec=spec, dim=dim, sha256=sha, artifact=artifact)
    return front, bytes(view[offset + size :])
