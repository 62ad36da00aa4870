"""The coordinator's own data for a job: the test set and the public pool.

The coordinator never holds an agent's private records. It loads the job's data section to
evaluate models on the test set and, for voting algorithms, to hold the public (unlabeled) pool,
split exactly as every simulated agent splits its share (``DataSpec.split``, rules in
docs/architecture.md#the-jobs-data), so the public records are never any agent's private records.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from dpfl.learning.algorithms.base import CoordinatorData
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec
from dpfl.server.data_access import DataAccess
from dpfl.server.errors import ConfigurationError

__all__ = ["JobData", "load_job_data", "public_blob"]


@dataclass(frozen=True, slots=True)
class JobData:
    """The coordinator's data for a job and the public blob agents download."""

    data: CoordinatorData
    public: bytes | None


def public_blob(public_x: np.ndarray | None) -> bytes | None:
    """The ``.npy`` bytes (float32, no pickle) of the public query set."""
    if public_x is None:
        return None
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(public_x, dtype=np.float32), allow_pickle=False)
    return buffer.getvalue()


def load_job_data(spec: JobSpec, *, population: int, access: DataAccess | None = None) -> JobData:
    """Load the job's data set and split it as the federation does (blocking).

    The public blob agents download holds only the pool's first ``data.public.agent_readable``
    records (all of them by default); the coordinator keeps the whole pool. Data sets are read
    from the data dir of ``access``, and a file the job names only under its data roots
    (default: ``$DPFL_DATA_DIR`` and ``$DPFL_DATA_ROOTS``; :mod:`dpfl.server.data_access`).

    Raises:
        ConfigurationError: a file outside the data roots (whether it exists or not), or the
            data set cannot be loaded or split, naming the spec.
    """
    access = DataAccess.from_environment() if access is None else access
    refused = access.problems(spec)
    if refused:
        raise ConfigurationError(f"job {spec.name!r}: " + "; ".join(refused))
    try:
        data_dir = str(access.data_dir) if access.data_dir else None
        splits = spec.data.split(num_agents=max(1, population), data_dir=data_dir)
    except LearningError as exc:
        raise ConfigurationError(f"job {spec.name!r}: data {spec.data.dataset!r}: {exc}") from exc
    dataset = splits.federation.dataset
    public = splits.public_x is not None
    data = CoordinatorData(
        input_shape=tuple(dataset.input_shape),
        num_classes=int(dataset.num_classes),
        test_x=np.asarray(splits.test_x, dtype=np.float32),
        test_y=np.asarray(splits.test_y, dtype=np.int64),
        public_x=np.asarray(splits.public_x, dtype=np.float32) if public else None,
        public_y=np.asarray(splits.public_y, dtype=np.int64) if public else None,
        agent_readable=int(splits.agent_readable) if public else None,
    )
    return JobData(data=data, public=public_blob(data.public_for_agents()))
