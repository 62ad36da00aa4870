"""Models as flat vectors and as bytes: what secure aggregation sums and what agents download.

Flat vectors concatenate the parameters in ``named_parameters()`` order (C order within each
tensor); a :class:`ModelSignature` (names, shapes, dtypes) pins that layout, and every conversion
checks it, so a vector or a download meant for another architecture is refused instead of being
silently reshaped into nonsense.

Wire format of :func:`model_to_bytes` (version 1), chosen so that loading untrusted bytes can never
execute code (no pickle): ``b"DPFLMDL1"``, a little-endian ``uint32`` header length, a UTF-8 JSON
header ``{"format": 1, "tensors": [{"name", "shape", "dtype"}...], "metadata": {...}}``, then each
tensor's values as little-endian float32/float64 in header order. The reader checks every field and
that the byte count matches exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from pydantic import JsonValue
from torch import nn

from dpfl.learning.errors import ModelError, ModelMismatchError, SerializationError

__all__ = [
    "ModelSignature",
    "SerializedModel",
    "TensorSpec",
    "assign_parameters",
    "flatten_parameters",
    "model_from_bytes",
    "model_signature",
    "model_to_bytes",
    "read_model_bytes",
    "split_vector",
]

MAGIC = b"DPFLMDL1"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 4096
_DTYPES: dict[str, tuple[torch.dtype, np.dtype[Any]]] = {
    "float32": (torch.float32, np.dtype("<f4")),
    "float64": (torch.float64, np.dtype("<f8")),
}
_TORCH_NAMES = {torch_dtype: name for name, (torch_dtype, _) in _DTYPES.items()}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, shape and dtype (``float32``/``float64``) of one parameter tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        """Number of scalars."""
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """The ordered parameter layout of a model; equal signatures mean interchangeable vectors."""

    tensors: tuple[TensorSpec, ...]

    @property
    def num_parameters(self) -> int:
        """Length of the flat parameter vector (d)."""
        return sum(t.size for t in self.tensors)

    def digest(self) -> str:
        """SHA-256 (hex) of the layout's canonical JSON: a short id to compare across processes."""
        text = json.dumps(
            [[t.name, list(t.shape), t.dtype] for t in self.tensors], separators=(",", ":")
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def describe_difference(self, other: ModelSignature) -> str:
        """A human-readable first difference between two signatures ('' when equal)."""
        if self == other:
            return ""
        for i, (a, b) in enumerate(zip(self.tensors, other.tensors, strict=False)):
            if a != b:
                mine = f"{a.name}{list(a.shape)} {a.dtype}"
                return f"tensor {i}: {mine} vs {b.name}{list(b.shape)} {b.dtype}"
        return f"{len(self.tensors)} tensors vs {len(other.tensors)}"


def model_signature(model: nn.Module) -> ModelSignature:
    """The signature of ``model``'s parameters.

    Raises:
        ModelError: the model has buffers (they would be lost by flattening and serialisation)
            or parameters of a dtype other than float32/float64.
    """
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ModelError(f"models with buffers are not supported (found {buffers[:3]})")
    specs = []
    for name, param in model.named_parameters():
        if param.dtype not in _TORCH_NAMES:
            raise ModelError(f"parameter {name} has unsupported dtype {param.dtype}")
        specs.append(
            TensorSpec(name=name, shape=tuple(param.shape), dtype=_TORCH_NAMES[param.dtype])
        )
    return ModelSignature(tensors=tuple(specs))


def flatten_parameters(
    model: nn.Module, *, dtype: type[np.floating[Any]] = np.float32
) -> NDArray[Any]:
    """Concatenate the parameters into one new numpy vector of ``dtype`` (float32 or float64)."""
    if dtype not in (np.float32, np.float64):
        raise ModelError(f"flat vectors are float32 or float64, not {dtype}")
    with torch.no_grad():
        parts = [p.detach().reshape(-1).to("cpu", torch.float64) for p in model.parameters()]
        flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    return flat.numpy().astype(dtype)


def split_vector(vector: NDArray[Any], signature: ModelSignature) -> list[tuple[str, NDArray[Any]]]:
    """Views of ``vector`` reshaped per tensor (e.g. to smooth or clip each tensor separately).

    Raises:
        ModelMismatchError: the vector's length is not ``signature.num_parameters``.
    """
    array = np.asarray(vector)
    if array.ndim != 1 or array.shape[0] != signature.num_parameters:
        raise ModelMismatchError(
            f"vector of shape {array.shape} does not match the model's {signature.num_parameters} "
            "parameters"
        )
    out, offset = [], 0
    for spec in signature.tensors:
        out.append((spec.name, array[offset : offset + spec.size].reshape(spec.shape)))
        offset += spec.size
    return out


def assign_parameters(model: nn.Module, vector: NDArray[Any]) -> None:
    """Overwrite ``model``'s parameters, in place, from a flat vector (any float dtype).

    Raises:
        ModelMismatchError: wrong length or shape, or non-finite values (a NaN model must be
            refused where it appears, not discovered rounds later).
    """
    array = np.asarray(vector)
    if not np.issubdtype(array.dtype, np.floating):
        raise ModelMismatchError(f"parameter vector has non-float dtype {array.dtype}")
    signature = model_signature(model)
    pieces = split_vector(array, signature)
    if not np.isfinite(array).all():
        raise ModelMismatchError("parameter vector holds NaN or infinite values")
    with torch.no_grad():
        for (_, piece), param in zip(pieces, model.parameters(), strict=True):
            param.copy_(torch.from_numpy(np.array(piece, dtype=np.float64)).to(param.dtype))


@dataclass(frozen=True, slots=True)
class SerializedModel:
    """A decoded download: its signature, tensors and free-form metadata (e.g. the model spec)."""

    signature: ModelSignature
    tensors: Mapping[str, NDArray[Any]]
    metadata: Mapping[str, JsonValue]


def model_to_bytes(model: nn.Module, *, metadata: Mapping[str, JsonValue] | None = None) -> bytes:
    """Serialise ``model``'s parameters (and JSON-able ``metadata``) to the version-1 format.

    Raises:
        ModelError: unsupported model (buffers, dtypes) or metadata that is not JSON.
    """
    signature = model_signature(model)
    header = {
        "format": FORMAT_VERSION,
        "tensors": [
            {"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in signature.tensors
        ],
        "metadata": dict(metadata or {}),
    }
    try:
        head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ModelError(f"model metadata is not JSON-serialisable: {exc}") from exc
    if len(head) > MAX_HEADER_BYTES:
        raise ModelError(f"model header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    chunks = [MAGIC, struct.pack("<I", len(head)), head]
    with torch.no_grad():
        for spec, param in zip(signature.tensors, model.parameters(), strict=True):
            array = param.detach().to("cpu").numpy().astype(_DTYPES[spec.dtype][1], copy=False)
            chunks.append(np.ascontiguousarray(array).tobytes())
    return b"".join(chunks)


def _parse_header(raw: bytes) -> tuple[ModelSignature, dict[str, JsonValue]]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SerializationError(f"model header is not valid JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"format", "tensors", "metadata"}:
        raise SerializationError("model header must have exactly format, tensors, metadata")
    if header["format"] != FORMAT_VERSION:
        raise SerializationError(f"unsupported model format {header['format']!r} (expected 1)")
    entries, metadata = header["tensors"], header["metadata"]
    if (
        not isinstance(entries, list)
        or len(entries) > MAX_TENSORS
        or not isinstance(metadata, dict)
    ):
        raise SerializationError("model header: tensors must be a list, metadata an object")
    specs, names = [], set()
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"name", "shape", "dtype"}:
            raise SerializationError(f"model header: bad tensor entry {entry!r}")
        name, shape, dtype = entry["name"], entry["shape"], entry["dtype"]
        if not isinstance(name, str) or not name or name in names:
            raise SerializationError(f"model header: bad or duplicate tensor name {name!r}")
        if (
            not isinstance(shape, list)
            or len(shape) > 8
            or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in shape
            )
        ):
            raise SerializationError(f"model header: bad shape {shape!r} for {name}")
        if dtype not in _DTYPES:
            raise SerializationError(f"model header: unsupported dtype {dtype!r} for {name}")
        names.add(name)
        specs.append(TensorSpec(name=name, shape=tuple(shape), dtype=dtype))
    return ModelSignature(tensors=tuple(specs)), metadata


def read_model_bytes(data: bytes) -> SerializedModel:
    """Decode version-1 model bytes without trusting them (no code runs, every size is checked).

    Raises:
        SerializationError: bad magic, truncated or oversized parts, malformed header, a payload
            whose length differs from what the header announces, or non-finite values.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SerializationError(f"model data must be bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) < len(MAGIC) + 4 or bytes(view[: len(MAGIC)]) != MAGIC:
        raise SerializationError("not a dpfl model (bad magic bytes)")
    (head_len,) = struct.unpack("<I", view[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    if head_len > MAX_HEADER_BYTES or start + head_len > len(view):
        raise SerializationError(f"model header length {head_len} exceeds the data")
    signature, metadata = _parse_header(bytes(view[start : start + head_len]))
    offset = start + head_len
    expected = offset + sum(t.size * _DTYPES[t.dtype][1].itemsize for t in signature.tensors)
    if len(view) != expected:
        raise SerializationError(
            f"model payload is {len(view) - offset} bytes, header announces {expected - offset}"
        )
    tensors: dict[str, NDArray[Any]] = {}
    for spec in signature.tensors:
        np_dtype = _DTYPES[spec.dtype][1]
        count = spec.size
        array = np.frombuffer(view, dtype=np_dtype, count=count, offset=offset).reshape(spec.shape)
        if not np.isfinite(array).all():
            raise SerializationError(f"model tensor {spec.name} holds NaN or infinite values")
        tensors[spec.name] = array
        offset += count * np_dtype.itemsize
    return SerializedModel(signature=signature, tensors=tensors, metadata=metadata)


def model_from_bytes(data: bytes, *, model: nn.Module) -> nn.Module:
    """Load downloaded bytes into ``model`` (in place) after checking the signatures match.

    Returns:
        ``model``, for chaining.

    Raises:
        SerializationError: malformed bytes (see :func:`read_model_bytes`).
        ModelMismatchError: the bytes hold another architecture.
    """
    decoded = read_model_bytes(data)
    mine = model_signature(model)
    if decoded.signature != mine:
        raise ModelMismatchError(
            "downloaded model does not match the local architecture: "
            + mine.describe_difference(decoded.signature)
        )
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.from_numpy(np.array(decoded.tensors[name])).to(param.dtype))
    return model
