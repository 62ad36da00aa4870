"""Partitioners and the public split: reproducible, disjoint, covering, never an empty agent."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dpfl.learning.data import (
    DirichletPartition,
    IidPartition,
    ShardsPartition,
    federate,
    load_agent_dataset,
    load_dataset,
    partition_from_config,
    partition_indices,
    partition_to_config,
)
from dpfl.learning.errors import PartitionError

SCHEMES = [IidPartition(), ShardsPartition(classes_per_agent=3), DirichletPartition(alpha=0.5)]


def _check_cover(parts: tuple[np.ndarray, ...], n: int) -> None:
    merged = np.concatenate(parts)
    assert merged.size == n
    assert np.unique(merged).size == n
    assert min(p.size for p in parts) >= 1


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.scheme)
def test_partitions_are_reproducible_disjoint_and_covering(scheme: object) -> None:
    labels = load_dataset("digits").y_train
    a = partition_indices(labels, scheme=scheme, num_agents=12, seed=5)  # type: ignore[arg-type]
    b = partition_indices(labels, scheme=scheme, num_agents=12, seed=5)  # type: ignore[arg-type]
    c = partition_indices(labels, scheme=scheme, num_agents=12, seed=6)  # type: ignore[arg-type]
    assert len(a) == 12
    _check_cover(a, labels.size)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_sizes_differ_by_at_most_one() -> None:
    parts = partition_indices(np.arange(103) % 10, scheme=IidPartition(), num_agents=10, seed=0)
    assert {p.size for p in parts} == {10, 11}


@pytest.mark.parametrize(("agents", "per_agent"), [(10, 3), (4, 3), (25, 2), (3, 10), (100, 1)])
def test_shards_give_exactly_the_requested_number_of_classes(agents: int, per_agent: int) -> None:
    labels = load_dataset("digits").y_train
    parts = partition_indices(
        labels, scheme=ShardsPartition(classes_per_agent=per_agent), num_agents=agents, seed=1
    )
    _check_cover(parts, labels.size)
    assert all(np.unique(labels[p]).size == per_agent for p in parts)


def test_shards_refuse_impossible_requests() -> None:
    labels = np.arange(100) % 10
    with pytest.raises(PartitionError, match="cannot cover all 10 classes"):
        partition_indices(labels, scheme=ShardsPartition(3), num_agents=3, seed=0)
    with pytest.raises(PartitionError, match="exceeds the 10 classes"):
        partition_indices(labels, scheme=ShardsPartition(11), num_agents=3, seed=0)
    with pytest.raises(PartitionError, match="records for"):
        partition_indices(labels, scheme=ShardsPartition(10), num_agents=20, seed=0)
    with pytest.raises(PartitionError, match=">= 1"):
        ShardsPartition(0)


def test_dirichlet_skew_and_impossible_requests() -> None:
    labels = load_dataset("digits").y_train
    skewed = partition_indices(labels, scheme=DirichletPartition(0.1), num_agents=10, seed=0)
    even = partition_indices(labels, scheme=DirichletPartition(100.0), num_agents=10, seed=0)

    def mean_classes(parts: tuple[np.ndarray, ...]) -> float:
        return float(np.mean([np.sum(np.bincount(labels[p], minlength=10) > 5) for p in parts]))

    assert mean_classes(skewed) < mean_classes(even)
    with pytest.raises(PartitionError, match="left an agent with fewer than 1"):
        partition_indices(
            np.arange(60) % 10,
            scheme=DirichletPartition(0.01, max_attempts=5),
            num_agents=50,
            seed=0,
        )
    with pytest.raises(PartitionError, match="alpha must be a positive"):
        DirichletPartition(0.0)


def test_too_many_agents_is_a_clear_error() -> None:
    with pytest.raises(PartitionError, match="cannot give each of 11 agents"):
        partition_indices(
            np.zeros(10, dtype=np.int64), scheme=IidPartition(), num_agents=11, seed=0
        )
    with pytest.raises(PartitionError, match="positive integer"):
        partition_indices(np.zeros(10, dtype=np.int64), scheme=IidPartition(), num_agents=0, seed=0)


def test_config_round_trip_and_errors() -> None:
    for scheme in SCHEMES:
        assert partition_from_config(partition_to_config(scheme)) == scheme
    assert partition_from_config("iid") == IidPartition()
    assert partition_from_config({"scheme": "shards", "classes_per_agent": 3}) == ShardsPartition(3)
    with pytest.raises(PartitionError, match="unknown partition scheme"):
        partition_from_config({"scheme": "random"})
    with pytest.raises(PartitionError, match="unknown key"):
        partition_from_config({"scheme": "iid", "alpha": 1})
    with pytest.raises(PartitionError, match="classes_per_agent is required"):
        partition_from_config({"scheme": "shards"})
    with pytest.raises(PartitionError, match="must be an integer"):
        partition_from_config({"scheme": "shards", "classes_per_agent": "3"})


def test_public_split_is_held_out_of_train_and_stratified() -> None:
    ds = load_dataset("digits")
    fed = federate(ds, scheme=ShardsPartition(2), num_agents=10, seed=3, public_fraction=0.2)
    public = fed.public_indices
    assert public.size == pytest.approx(0.2 * ds.y_train.size, abs=10)
    private = np.concatenate(fed.agent_indices)
    assert np.intersect1d(public, private).size == 0
    assert np.union1d(public, private).size == ds.y_train.size
    assert np.bincount(fed.public_labels_for_evaluation(), minlength=10).min() >= 25
    assert fed.public_features().shape == (public.size, 1, 8, 8)
    assert not fed.public_features().flags.writeable
    with pytest.raises(PartitionError, match="public_fraction"):
        federate(ds, scheme=IidPartition(), num_agents=2, public_fraction=1.0)


def test_an_agent_rebuilds_its_own_part_from_the_spec_alone() -> None:
    ds = load_dataset("digits")
    fed = federate(ds, scheme=DirichletPartition(1.0), num_agents=7, seed=9, public_fraction=0.1)
    mine = load_agent_dataset(
        "digits", scheme=DirichletPartition(1.0), num_agents=7, agent=4, seed=9, public_fraction=0.1
    )
    np.testing.assert_array_equal(mine.x_train, ds.x_train[fed.agent_indices[4]])
    np.testing.assert_array_equal(mine.y_train, ds.y_train[fed.agent_indices[4]])
    assert mine.x_test.shape == ds.x_test.shape
    assert mine.spec == "digits#agent=4/7"
    assert fed.agent_sizes()[4] == mine.y_train.size
    with pytest.raises(PartitionError, match="outside"):
        fed.agent_dataset(7)


def test_an_agents_share_is_a_frozen_subset_that_shares_the_test_split() -> None:
    ds = load_dataset("digits")
    fed = federate(ds, scheme=IidPartition(), num_agents=5, seed=2)
    mine = fed.agent_dataset(3)
    assert mine.x_test is ds.x_test
    assert mine.y_test is ds.y_test
    assert not mine.x_train.flags.writeable
    assert not mine.y_train.flags.writeable
    assert mine.x_train.dtype == np.float32
    assert mine.y_train.dtype == np.int64
    assert (mine.input_shape, mine.num_classes) == (ds.input_shape, ds.num_classes)
    rebuilt = type(ds).from_arrays(
        spec=mine.spec,
        x_train=ds.x_train[fed.agent_indices[3]],
        y_train=ds.y_train[fed.agent_indices[3]],
        x_test=ds.x_test,
        y_test=ds.y_test,
        num_classes=ds.num_classes,
    )
    np.testing.assert_array_equal(mine.x_train, rebuilt.x_train)
    np.testing.assert_array_equal(mine.y_train, rebuilt.y_train)
    assert not np.shares_memory(mine.x_train, ds.x_train)


def test_agents_of_one_federation_reuse_its_partition_until_the_data_changes(
    tmp_path: Path,
) -> None:
    """A simulation's agents load their shares every round: the partition is computed once per
    data set, and a data set whose file changed is partitioned afresh."""
    from dpfl.learning.data import partition as module

    path = tmp_path / "set.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.random((40, 3)), y=np.arange(40) % 2)
    spec = f"npz:{path}"
    module._cached_federation.cache_clear()
    first = [
        load_agent_dataset(spec, scheme=IidPartition(), num_agents=4, agent=a) for a in range(4)
    ]
    info = module._cached_federation.cache_info()
    assert (info.misses, info.hits) == (1, 3)
    again = load_agent_dataset(spec, scheme=IidPartition(), num_agents=4, agent=2)
    np.testing.assert_array_equal(again.x_train, first[2].x_train)
    np.savez(path, x=rng.random((40, 3)) + 5.0, y=np.arange(40) % 2)
    os.utime(path, ns=(1, 1))  # another modification time, whatever the clock's resolution
    changed = load_agent_dataset(spec, scheme=IidPartition(), num_agents=4, agent=2)
    assert changed.x_train.min() >= 5.0
    assert module._cached_federation.cache_info().misses == 2
