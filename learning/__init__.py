"""Models, data sets, partitioning, local (DP) training and one module per algorithm.

Each module of ``learning.algorithms`` keeps an algorithm's agent side, coordinator side and
privacy events together; ``server`` and ``client`` only call into them
(docs/architecture.md#packages). The shared building blocks are ``data``, ``models``, ``params``,
``training``, ``dpsgd``, ``features``, ``device`` and ``errors``. The names below are resolved on
first use, so importing the package (e.g. for ``dpfl.learning.jobs``) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DatasetError": "errors",
    "LearningError": "errors",
    "ModelError": "errors",
    "ModelMismatchError": "errors",
    "PartitionError": "errors",
    "SerializationError": "errors",
    "TrainingError": "errors",
    "Dataset": "data",
    "DirichletPartition": "data",
    "Federation": "data",
    "IidPartition": "data",
    "ShardsPartition": "data",
    "federate": "data",
    "load_agent_dataset": "data",
    "load_dataset": "data",
    "partition_from_config": "data",
    "build_model": "models",
    "parse_model_spec": "models",
    "ModelSignature": "params",
    "assign_parameters": "params",
    "flatten_parameters": "params",
    "model_from_bytes": "params",
    "model_signature": "params",
    "model_to_bytes": "params",
    "Evaluation": "training",
    "LocalUpdate": "training",
    "evaluate": "training",
    "local_update": "training",
    "predict_labels": "training",
    "predict_probabilities": "training",
    "train": "training",
    "train_student": "training",
    "train_teacher": "training",
    "dp_sgd_update": "dpsgd",
    "feature_extractor": "features",
    "select_device": "device",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dpfl.learning' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dpfl.learning.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
