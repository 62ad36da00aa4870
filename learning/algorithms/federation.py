"""What a coordinator can derive about the agents' data sizes from the job's data spec alone.

Some algorithms need a public bound on the agents' local data sizes: DP-Helmet's record-level
sensitivity ``2c/(MΛ)`` needs the smallest M, DP-FedSGD's common gradient normaliser needs
the mean. A deployed coordinator never sees the silos' data, so the job states them
(``params.min_local_size``, ``params.expected_batch_size``); for simulations and built-in data
sets, the defaults come from here: the exact federation every simulated agent rebuilds from the
same spec (:func:`dpfl.learning.data.federate` with the job's partition, seed and public
fraction). The sizes are a function of the spec only (public), never of what agents report.
"""

from __future__ import annotations

from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec

__all__ = ["local_sizes", "mean_local_size", "smallest_local_size"]


def local_sizes(job: JobSpec, population: int) -> tuple[int, ...]:
    """The records of each of ``population`` agents in the job's simulated federation.

    Raises:
        AlgorithmError: the data set cannot be loaded or partitioned here (then the job must
            state the figure it needs).
    """
    from dpfl.learning.data import federate, load_dataset, partition_from_config

    try:
        federation = federate(
            load_dataset(job.data.dataset),
            scheme=partition_from_config(job.data.partition.model_dump()),
            num_agents=population,
            seed=job.data.seed,
            public_fraction=job.data.public_fraction,
        )
    except LearningError as exc:
        raise AlgorithmError(
            f"cannot derive the agents' data sizes from data {job.data.dataset!r} ({exc}); "
            "state them in the job's params"
        ) from exc
    return federation.agent_sizes()


def smallest_local_size(job: JobSpec, population: int) -> int:
    """min_i M_i of the simulated federation (see :func:`local_sizes`)."""
    return min(local_sizes(job, population))


def mean_local_size(job: JobSpec, population: int) -> float:
    """(1/n)·Σ_i M_i of the simulated federation (see :func:`local_sizes`)."""
    sizes = local_sizes(job, population)
    return sum(sizes) / len(sizes)
