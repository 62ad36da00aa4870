"""What a coordinator can derive about the agents' data sizes from the job's data spec alone.

Some algorithms need a public bound on the agents' local data sizes: DP-Helmet's record-level
sensitivity ``2c/(MΛ)`` needs the smallest M, DP-FedSGD's common gradient normaliser needs the
mean. A deployed coordinator never sees the silos' data, so the job states them
(``params.min_local_size``, ``params.expected_batch_size``); for simulations and built-in data
sets, the defaults come from here: the exact federation every simulated agent rebuilds from the
same spec (``DataSpec.split``: the job's partition, seed and public pool). The sizes are a function
of the spec only (public), never of what agents report.
"""

from __future__ import annotations

from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec

__all__ = ["local_sizes", "mean_local_size", "smallest_local_size"]


def local_sizes(job: JobSpec, population: int) -> tuple[int, ...]:
    """The records of each of ``population`` agents in the job's simulated federation.

    Raises:
        AlgorithmError: the data set cannot be loaded or partitioned here (then the job must
            state the figure it needs).
    """
    try:
        federation = job.data.split(num_agents=population).federation
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


def simulated_federation(
    job: JobSpec, agents: int, *, data_dir: str | None = None
) -> tuple[CoordinatorData, dict[str, AgentData]]:
    """The simulated federation of the job's data spec (read from ``data_dir``, default
    ``$DPFL_DATA_DIR``): the coordinator's test and public splits, and each agent's private
    share (ids ``agent-0000``...)."""
    splits = job.data.split(num_agents=agents, data_dir=data_dir)
    fed = splits.federation
    dataset = fed.dataset
    public = splits.public_x is not None
    coordinator = CoordinatorData(
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
        test_x=splits.test_x,
        test_y=splits.test_y,
        public_x=splits.public_x,
        public_y=splits.public_y,
        agent_readable=splits.agent_readable if public else None,
    )
    parts = {}
    for i in range(agents):
        part = fed.agent_dataset(i)
        parts[f"agent-{i:04d}"] = AgentData(
            x=part.x_train,
            y=part.y_train,
            input_shape=dataset.input_shape,
            num_classes=dataset.num_classes,
        )
    return coordinator, parts
