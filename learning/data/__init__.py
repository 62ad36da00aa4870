"""Data sets (one registry parsed from spec strings) and their partition among agents.

See :mod:`.registry` for the spec grammar and the list of data sets, :mod:`.partition` for the
partition schemes, :mod:`.public` for the job's public pool and test set.
"""

from dpfl.learning.data.dataset import Dataset
from dpfl.learning.data.images import DATA_DIR_ENV
from dpfl.learning.data.partition import (
    DirichletPartition,
    Federation,
    IidPartition,
    PartitionScheme,
    ShardsPartition,
    federate,
    load_agent_dataset,
    partition_from_config,
    partition_indices,
    partition_to_config,
    public_stream_seed,
)
from dpfl.learning.data.public import (
    JobSplits,
    PublicPool,
    reconcile_images,
    resolve_test_rule,
    split_job_data,
)
from dpfl.learning.data.registry import (
    clear_dataset_cache,
    dataset_names,
    load_dataset,
    parse_dataset_spec,
)
from dpfl.learning.data.split import stratified_split, stratified_take

__all__ = [
    "DATA_DIR_ENV",
    "Dataset",
    "DirichletPartition",
    "Federation",
    "IidPartition",
    "JobSplits",
    "PartitionScheme",
    "PublicPool",
    "ShardsPartition",
    "clear_dataset_cache",
    "dataset_names",
    "federate",
    "load_agent_dataset",
    "load_dataset",
    "parse_dataset_spec",
    "partition_from_config",
    "partition_indices",
    "partition_to_config",
    "public_stream_seed",
    "reconcile_images",
    "resolve_test_rule",
    "split_job_data",
    "stratified_split",
    "stratified_take",
]
