"""The job's data section: the typed public pool and test set, their splits and their errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpfl.learning.algorithms.base import CoordinatorData
from dpfl.learning.data import (
    DATA_DIR_ENV,
    IidPartition,
    PublicPool,
    federate,
    load_dataset,
    reconcile_images,
    split_job_data,
    stratified_take,
)
from dpfl.learning.errors import PartitionError
from dpfl.learning.jobs import DataSpec, JobSpecError, PublicSpec, job_to_dict, parse_job

FEDAVG: dict[str, Any] = {
    "name": "j",
    "algorithm": "dp-fedavg",
    "privacy": {"noise_multiplier": 1.0},
}
PATE: dict[str, Any] = {"name": "j", "algorithm": "pate-fl", "params": {"sigma": 40.0}}


def _job(data: dict[str, Any], base: dict[str, Any] = FEDAVG) -> Any:
    return parse_job({**base, "data": data})


def _problems(data: dict[str, Any], base: dict[str, Any] = FEDAVG) -> str:
    with pytest.raises(JobSpecError) as info:
        _job(data, base)
    return "; ".join(info.value.problems)


def _rows(*arrays: np.ndarray) -> list[bytes]:
    """Every record as bytes, sorted: equal lists mean the same multiset of records."""
    return sorted(row.tobytes() for a in arrays for row in a.reshape(a.shape[0], -1))


# -- parsing -----------------------------------------------------------------------------------


def test_public_fraction_is_shorthand_for_a_train_pool() -> None:
    short = _job({"public_fraction": 0.2})
    full = _job({"public": {"source": "train", "fraction": 0.2}})
    assert short == full
    assert short.data.public == PublicSpec(source="train", fraction=0.2)
    assert short.data.test_rule == "split"
    assert _job({"public_fraction": 0.0}).data.public is None
    assert not _job({}).data.has_public_pool


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        ({"public": {"source": "test", "fraction": 0.3}}, "rest"),
        ({"dataset": "mnist", "public": {"source": "usps", "count": 3000}}, "rest"),
        (
            {"dataset": "mnist", "public": {"source": "usps", "count": 3000}, "test": "split"},
            "split",
        ),
        ({"public": {"source": "train", "count": 100, "agent_readable": 40, "seed": 3}}, "split"),
    ],
)
def test_new_forms_round_trip_and_default_their_test_set(data: dict[str, Any], rule: str) -> None:
    spec = _job(data)
    assert spec.data.test_rule == rule
    assert parse_job(job_to_dict(spec)) == spec


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"public_fraction": 1.5}, "data.public_fraction: must be >= 0 and < 1 (got 1.5)"),
        ({"public_fraction": "a lot"}, "data.public_fraction: must be a number"),
        (
            {"public_fraction": 0.1, "public": {"source": "test", "fraction": 0.1}},
            "data.public_fraction: give public or public_fraction",
        ),
        ({"test_fraction": 0.5, "public_fraction": 0.5}, "data: public_fraction + test_fraction"),
        ({"public": {"source": "test"}}, "data.public: give its size as fraction or as count"),
        (
            {"public": {"source": "test", "fraction": 0.1, "count": 3}},
            "data.public: give its size as fraction or as count",
        ),
        ({"public": {"source": "test", "fraction": 1.0}}, "data.public.fraction: must be < 1"),
        ({"public": {"source": "test", "fraction": 0}}, "data.public.fraction: must be > 0"),
        ({"public": {"source": "test", "count": 0}}, "data.public.count: must be >= 1"),
        ({"public": {"source": "imagenet", "count": 5}}, "data.public.source: unknown dataset"),
        ({"public": {"source": "test", "count": 5, "colour": 1}}, "data.public.colour: unknown"),
        (
            {"dataset": "mnist", "public": {"source": "mnist", "count": 5}},
            "data.public.source: 'mnist' is the agents' own data set",
        ),
        (
            {"dataset": "mnist", "public": {"source": "fashion-mnist", "count": 5}},
            "data.public.source: fashion-mnist labels clothing, the agents' mnist labels digits",
        ),
        (
            {"dataset": "mnist", "public": {"source": "usps", "count": 9298}},
            "data.public.count: 9298 records asked of usps (9298 records; the pool must take "
            "fewer than them)",
        ),
        (
            {"dataset": "mnist", "public": {"source": "test", "count": 10_001}},
            "data.public.count: 10001 records asked of the test split of mnist",
        ),
        (
            {"dataset": "mnist", "public": {"source": "train", "count": 60_000}},
            "data.public.count: 60000 records asked of the train split of mnist",
        ),
        (
            {"public": {"source": "test", "count": 10, "agent_readable": 11}},
            "data.public.agent_readable: 11 exceeds the pool's count (10)",
        ),
        (
            {"public": {"source": "test", "fraction": 0.3}, "test": "split"},
            "data.test: 'split' would overlap the public pool",
        ),
        ({"test": "rest"}, "data.test: 'rest' needs a public pool"),
        ({"public_fraction": 0.2, "test": "rest"}, "data.test: 'rest' needs a public pool"),
        ({"test": "all"}, "data.test: must be one of"),
        ({"public": {"source": "test", "count": 5, "box": 4}}, "data.public.box: only another"),
    ],
)
def test_bad_data_sections_name_the_field(data: dict[str, Any], problem: str) -> None:
    assert problem in _problems(data)


def test_voting_jobs_need_a_pool_their_agents_read_whole() -> None:
    assert "data.public: pate-fl needs a public pool" in _problems({}, PATE)
    assert "data.public.agent_readable: pate-fl sends every public query" in _problems(
        {"public": {"source": "test", "count": 100, "agent_readable": 50}}, PATE
    )
    ok = _job({"public": {"source": "test", "count": 100, "agent_readable": 100}}, PATE)
    assert ok.data.has_public_pool


# -- splits ------------------------------------------------------------------------------------


def _split(data: dict[str, Any], agents: int = 4) -> Any:
    return DataSpec.model_validate(data).split(num_agents=agents)


def test_a_pool_from_the_test_split_leaves_the_rest_as_test_set() -> None:
    digits = load_dataset("digits")
    s = _split({"public": {"source": "test", "fraction": 0.3}, "seed": 2})
    assert s.test == "rest"
    # disjoint and covering: the pool and the test set are the test split, record for record
    assert _rows(s.public_x, s.test_x) == _rows(digits.x_test)
    assert len(s.public_x) + len(s.test_x) == len(digits.x_test)
    # stratified: each class's pool share rounds 30 % of its test records
    for c in range(10):
        n = int((digits.y_test == c).sum())
        assert int((s.public_y == c).sum()) == round(0.3 * n)
    # the agents keep the whole training split
    fed = s.federation
    assert sum(fed.agent_sizes()) == len(digits.x_train)
    assert _rows(*(fed.agent_dataset(i).x_train for i in range(4))) == _rows(digits.x_train)
    assert s.agent_readable == len(s.public_x)


def test_a_train_pool_is_held_out_before_partitioning_as_before() -> None:
    digits = load_dataset("digits")
    s = _split({"public_fraction": 0.2, "seed": 5})
    old = federate(digits, scheme=IidPartition(), num_agents=4, seed=5, public_fraction=0.2)
    np.testing.assert_array_equal(s.public_x, old.public_features())  # old jobs, same pool
    agents = [s.federation.agent_dataset(i).x_train for i in range(4)]
    assert _rows(s.public_x, *agents) == _rows(digits.x_train)
    np.testing.assert_array_equal(s.test_x, digits.x_test)


def test_a_counted_train_pool_is_exact_stratified_and_agents_never_hold_it() -> None:
    digits = load_dataset("digits")
    s = _split({"public": {"source": "train", "count": 101}})
    assert len(s.public_x) == 101
    share = np.bincount(s.public_y, minlength=10) / 101
    assert np.abs(share - np.bincount(digits.y_train) / len(digits.y_train)).max() < 0.011
    agents = [s.federation.agent_dataset(i).x_train for i in range(4)]
    assert _rows(s.public_x, *agents) == _rows(digits.x_train)


def test_splits_are_deterministic_per_seed() -> None:
    a = _split({"public": {"source": "test", "fraction": 0.3}, "seed": 1})
    b = _split({"public": {"source": "test", "fraction": 0.3}, "seed": 1})
    c = _split({"public": {"source": "test", "fraction": 0.3, "seed": 9}, "seed": 1})
    np.testing.assert_array_equal(a.public_x, b.public_x)
    np.testing.assert_array_equal(a.test_x, b.test_x)
    assert not np.array_equal(a.public_x, c.public_x)  # the pool's own seed moves the pool
    for i in range(4):  # but not the agents' partition
        np.testing.assert_array_equal(
            a.federation.agent_dataset(i).x_train, c.federation.agent_dataset(i).x_train
        )


def test_agent_readable_records_come_first_and_only_they_reach_agents() -> None:
    s = _split({"public": {"source": "test", "count": 200, "agent_readable": 50}})
    assert s.agent_readable == 50
    readable = s.public_for_agents()
    assert readable is not None
    assert readable.shape == (50, 1, 8, 8)
    np.testing.assert_array_equal(readable, s.public_x[:50])
    assert np.bincount(s.public_y[:50], minlength=10).min() >= 4  # stratified: every class
    data = CoordinatorData(
        input_shape=(1, 8, 8),
        num_classes=10,
        public_x=s.public_x,
        public_y=s.public_y,
        agent_readable=s.agent_readable,
    )
    sent = data.public_for_agents()
    assert sent is not None
    assert len(sent) == 50


def test_the_coordinator_serves_only_the_agent_readable_records() -> None:
    from dpfl.server.orchestrator.data import load_job_data

    spec = _job({"public": {"source": "test", "count": 200, "agent_readable": 50}})
    job_data = load_job_data(spec, population=4)
    assert job_data.public is not None
    import io

    served = np.load(io.BytesIO(job_data.public), allow_pickle=False)
    assert job_data.data.public_x is not None
    assert len(job_data.data.public_x) == 200
    np.testing.assert_array_equal(served, job_data.data.public_x[:50])
    assert job_data.data.test_x is not None
    assert len(job_data.data.test_x) == 450 - 200


def test_load_time_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(PartitionError, match=r"data\.public\.count: 500 records asked of"):
        _split({"public": {"source": "test", "count": 500}, "test": "rest"})
    with pytest.raises(PartitionError, match=r"nothing is left for the test set"):
        _split({"public": {"source": "test", "count": 450}})
    rng = np.random.default_rng(0)
    path = tmp_path / "three.npz"
    np.savez(path, x=rng.random((60, 1, 8, 8)), y=np.arange(60) % 3)
    with pytest.raises(PartitionError, match=r"data\.public\.source: npz:.* has 3 classes"):
        _split({"public": {"source": f"npz:{path}", "count": 10}})
    flat = tmp_path / "flat.npz"
    np.savez(flat, x=rng.random((60, 5)), y=np.arange(60) % 10)
    with pytest.raises(PartitionError, match=r"data\.public\.source: .* only images"):
        _split({"public": {"source": f"npz:{flat}", "count": 10}})


# -- image reconciliation ----------------------------------------------------------------------


def test_reconcile_resizes_keeps_range_and_constants() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((5, 1, 16, 16)).astype(np.float32)
    out = reconcile_images(x, (1, 28, 28))
    assert out.shape == (5, 1, 28, 28)
    assert out.dtype == np.float32
    assert out.min() >= x.min() - 1e-6
    assert out.max() <= x.max() + 1e-6
    flat = reconcile_images(np.full((2, 1, 16, 16), 0.7, np.float32), (1, 28, 28))
    np.testing.assert_allclose(flat, 0.7, atol=1e-6)
    # means are kept up to the border effects of bilinear resizing
    assert abs(float(out.mean()) - float(x.mean())) < 0.02


def test_reconcile_box_pads_with_zeros_and_channels_follow() -> None:
    x = np.ones((3, 1, 16, 16), np.float32)
    boxed = reconcile_images(x, (1, 28, 28), box=20)
    assert boxed[:, :, 4:24, 4:24].min() == 1.0
    assert boxed.sum() == 3 * 400
    rgb = reconcile_images(x, (3, 28, 28))
    assert rgb.shape == (3, 3, 28, 28)
    grey = reconcile_images(np.ones((2, 3, 8, 8), np.float32) * 0.5, (1, 16, 16))
    assert grey.shape == (2, 1, 16, 16)
    assert np.allclose(grey, 0.5)
    with pytest.raises(PartitionError, match="channels"):
        reconcile_images(np.ones((1, 2, 8, 8), np.float32), (3, 8, 8))
    with pytest.raises(PartitionError, match=r"data\.public\.box"):
        reconcile_images(x, (1, 28, 28), box=30)


def test_stratified_take_is_exact() -> None:
    labels = np.repeat(np.arange(3), [50, 30, 20])
    for count in (0, 1, 7, 33, 100):
        taken = stratified_take(labels, count=count, seed=4)
        assert taken.size == count
        assert np.unique(taken).size == count
    taken = stratified_take(labels, count=10, seed=4)
    assert np.bincount(labels[taken]).tolist() == [5, 3, 2]


# -- the paper's setting: agents hold MNIST, the public pool is USPS -----------------------------


@pytest.mark.parametrize("box", [None, 20])
def test_mnist_agents_with_a_usps_pool(
    box: int | None, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the data folder of every test (tests/conftest.py): $DPFL_DATA_DIR, else ../shared/data
    monkeypatch.setenv(DATA_DIR_ENV, str(shared_data_dir))
    public: dict[str, Any] = {"source": "usps", "count": 3000}
    if box is not None:
        public["box"] = box
    s = _split({"dataset": "mnist", "public": public}, agents=10)
    assert s.public_x.shape == (3000, 1, 28, 28)
    assert s.test_x.shape == (9298 - 3000, 1, 28, 28)  # the rest of the USPS domain
    for x in (s.public_x, s.test_x):
        assert x.dtype == np.float32
        assert x.min() >= 0.0
        assert x.max() <= 1.0
    assert set(np.unique(s.public_y)) == set(range(10))
    usps = load_dataset("usps")
    assert len(s.public_y) + len(s.test_y) == len(usps.y_train) + len(usps.y_test)
    assert sum(s.federation.agent_sizes()) == 60_000  # the agents keep all of MNIST's train
    mnist_mean = float(load_dataset("mnist").x_train.mean())
    if box == 20:  # USPS drawn in MNIST's 20x20 digit box has MNIST's ink density
        assert abs(float(s.public_x.mean()) - mnist_mean) < 0.02


def test_a_missing_foreign_source_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpfl.learning.errors import DatasetError

    monkeypatch.setenv(DATA_DIR_ENV, "/nonexistent-dpfl-data")
    pool = PublicPool(source="usps", count=10)
    with pytest.raises(DatasetError, match="usps"):
        split_job_data(
            load_dataset("digits"), public=pool, scheme=IidPartition(), num_agents=2, seed=0
        )
