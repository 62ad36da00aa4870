"""The one error base of ``dpfl.learning`` and its specific subclasses.

Every error raised on bad input by this package is a :class:`LearningError`, so that the agent and
the coordinator can map the whole family to one exit code or gRPC status, while tests and callers
that care can catch the precise kind. Messages name the offending value and, for files, the path.
"""

from __future__ import annotations

__all__ = [
    "DatasetError",
    "LearningError",
    "ModelError",
    "ModelMismatchError",
    "PartitionError",
    "SerializationError",
    "TrainingError",
]


class LearningError(Exception):
    """Base of every error raised by ``dpfl.learning`` on bad input or an impossible request."""


class DatasetError(LearningError):
    """A data set spec is malformed, or its files are missing, corrupt or inconsistent."""


class PartitionError(LearningError):
    """A partition of a data set among agents cannot be built as requested."""


class ModelError(LearningError):
    """A model spec is unknown or does not fit the data (e.g. ``cnn`` on tabular data)."""


class ModelMismatchError(ModelError):
    """Parameters (a flat vector or serialised bytes) do not match the model's signature."""


class SerializationError(LearningError):
    """Model bytes are malformed, truncated or of an unknown format version."""


class TrainingError(LearningError):
    """Training arguments are invalid (empty data, bad rates, mismatched shapes)."""


class AlgorithmError(LearningError, ValueError):
    """An algorithm refused its input: an inconsistent task, a wrong vector length, a plan that
    cannot meet its privacy target. The message names the problem."""
