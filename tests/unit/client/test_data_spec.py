"""The ``--data`` grammar: parsing, canonical rendering, clear errors, and the loaded shares."""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.client.data import (
    DataSource,
    SimulatedShare,
    data_spec_for_job,
    parse_data_spec,
    simulated_data_spec,
)
from dpfl.client.errors import DataSpecError
from dpfl.learning.data import federate, load_dataset, partition_from_config
from dpfl.learning.jobs import parse_job


def test_silo_specs_parse_to_the_dataset_alone() -> None:
    assert parse_data_spec("digits") == DataSource("digits")
    source = parse_data_spec(" csv:/silo/a.csv?label=y&classes=2 ")
    assert source.share is None
    assert str(source) == "csv:/silo/a.csv?classes=2&label=y"


def test_simulated_share_parses_and_renders_canonically() -> None:
    source = parse_data_spec(
        "digits?test_fraction=0.2#seed=3&agents=100&classes_per_agent=3&partition=shards&index=7"
    )
    assert source.dataset == "digits?test_fraction=0.2"
    assert source.share == SimulatedShare(
        index=7, agents=100, partition={"scheme": "shards", "classes_per_agent": 3}, seed=3
    )
    text = str(source)
    assert text == (
        "digits?test_fraction=0.2#index=7&agents=100&partition=shards&classes_per_agent=3"
        "&seed=3&public_fraction=0.0"
    )
    assert parse_data_spec(text) == source


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty --data"),
        ("imagenet", "unknown data set 'imagenet'"),
        ("digits#", "nothing after '#'"),
        ("digits#index=1", "agents= is required"),
        ("digits#agents=4", "index= is required"),
        ("digits#index=4&agents=4", "index 4 outside [0, agents=4)"),
        ("digits#index=-1&agents=4", "index -1 outside"),
        ("digits#index=x&agents=4", "index='x' is not an integer"),
        ("digits#index=0&agents=4&colour=red", "unknown key 'colour'"),
        ("digits#index=0&agents=4&index=1", "key 'index' given twice"),
        ("digits#index=0&agents=4&partition=round-robin", "unknown partition 'round-robin'"),
        ("digits#index=0&agents=4&classes_per_agent=2", "does not apply to partition=iid"),
        ("digits#index=0&agents=4&partition=shards", "classes_per_agent is required"),
        ("digits#index=0&agents=4&partition=dirichlet", "alpha is required"),
        ("digits#index=0&agents=4&partition=dirichlet&alpha=-1", "alpha must be a positive"),
        ("digits#index=0&agents=4&public_fraction=1", "public_fraction must lie in [0, 1)"),
        ("digits#index=0&agents=4&alpha=nan&partition=dirichlet", "must be finite"),
        ("digits#index=0&agents", "malformed item 'agents'"),
        ("digits#index=0&agents=4&seed=-2", "seed must be >= 0"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem(spec: str, message: str) -> None:
    with pytest.raises(DataSpecError) as info:
        parse_data_spec(spec)
    assert message in str(info.value)


def test_simulated_data_spec_round_trips_and_validates() -> None:
    text = simulated_data_spec(
        "digits",
        index=2,
        agents=5,
        partition={"scheme": "dirichlet", "alpha": 0.5},
        seed=1,
        public_fraction=0.1,
    )
    assert text == (
        "digits#index=2&agents=5&partition=dirichlet&alpha=0.5&seed=1&public_fraction=0.1"
    )
    with pytest.raises(DataSpecError, match="index 5 outside"):
        simulated_data_spec("digits", index=5, agents=5)


def test_data_spec_for_job_uses_the_job_data_section() -> None:
    job = parse_job(
        {
            "name": "j",
            "algorithm": "pate-fl",
            "data": {
                "dataset": "digits",
                "partition": {"scheme": "shards", "classes_per_agent": 3},
                "public_fraction": 0.2,
                "seed": 4,
            },
            "params": {"sigma": 5.0, "queries": 10},
        }
    )
    text = data_spec_for_job(job.data, index=1, agents=10)
    share = parse_data_spec(text).share
    assert share is not None
    assert share.partition == {"scheme": "shards", "classes_per_agent": 3}
    assert (share.seed, share.public_fraction, share.index, share.agents) == (4, 0.2, 1, 10)


def test_loaded_share_is_the_coordinators_partition() -> None:
    source = parse_data_spec(
        "digits#index=3&agents=10&partition=shards&classes_per_agent=2&seed=5&public_fraction=0.1"
    )
    data = source.load()
    fed = federate(
        load_dataset("digits"),
        scheme=partition_from_config({"scheme": "shards", "classes_per_agent": 2}),
        num_agents=10,
        seed=5,
        public_fraction=0.1,
    )
    own = fed.agent_dataset(3)
    np.testing.assert_array_equal(data.x, own.x_train)
    np.testing.assert_array_equal(data.y, own.y_train)
    assert len(np.unique(data.y)) == 2
    assert data.input_shape == own.input_shape
    assert data.num_classes == 10


def test_silo_loads_the_whole_training_split() -> None:
    data = parse_data_spec("digits").load()
    assert data.x.shape[0] == load_dataset("digits").x_train.shape[0]


def test_unloadable_data_names_the_spec() -> None:
    with pytest.raises(DataSpecError, match=r"--data npz:/nonexistent/x\.npz"):
        parse_data_spec("npz:/nonexistent/x.npz").load()
    with pytest.raises(DataSpecError, match="shards"):
        parse_data_spec("digits#index=0&agents=2&partition=shards&classes_per_agent=11").load()


def test_public_count_and_seed_round_trip_and_hold_out_the_coordinators_pool() -> None:
    text = simulated_data_spec("digits", index=1, agents=3, public_count=50, public_seed=7)
    assert text == "digits#index=1&agents=3&partition=iid&seed=0&public_fraction=0.0" + (
        "&public_count=50&public_seed=7"
    )
    share = parse_data_spec(text).share
    assert share is not None
    assert (share.public_count, share.public_seed) == (50, 7)
    with pytest.raises(DataSpecError, match="public_fraction or public_count"):
        parse_data_spec("digits#index=0&agents=2&public_fraction=0.1&public_count=5")
    with pytest.raises(DataSpecError, match="public_count must be >= 1"):
        parse_data_spec("digits#index=0&agents=2&public_count=0")
    with pytest.raises(DataSpecError, match="not an integer"):
        parse_data_spec("digits#index=0&agents=2&public_seed=x")


@pytest.mark.parametrize(
    ("public", "held_out"),
    [
        ({"source": "train", "count": 60, "seed": 7}, "public_fraction=0.0&public_count=60"),
        ({"source": "train", "fraction": 0.25}, "public_fraction=0.25"),
        ({"source": "test", "fraction": 0.3}, "public_fraction=0.0"),
    ],
)
def test_an_agents_share_is_the_coordinators_split(
    public: dict[str, object], held_out: str
) -> None:
    job = parse_job(
        {
            "name": "j",
            "algorithm": "pate-fl",
            "data": {"dataset": "digits", "public": public, "seed": 2},
            "params": {"sigma": 5.0, "queries": 10},
        }
    )
    text = data_spec_for_job(job.data, index=2, agents=4)
    assert held_out in text
    splits = job.data.split(num_agents=4)
    data = parse_data_spec(text).load()
    np.testing.assert_array_equal(data.x, splits.federation.agent_dataset(2).x_train)
    # no agent record is a public record: a train pool is held out of every share
    own = set(splits.federation.agent_indices[2].tolist())
    assert not own & set(splits.federation.public_indices.tolist())
    expected = len(splits.public_x) if public["source"] == "train" else 0
    assert len(splits.federation.public_indices) == expected
