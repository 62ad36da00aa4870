"""Data set loaders: the embedded digits, the shared offline image sets, npz and csv files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from dpfl.learning.data import Dataset, clear_dataset_cache, dataset_names, load_dataset
from dpfl.learning.errors import DatasetError, LearningError


def test_registry_names() -> None:
    assert dataset_names() == ("digits", "mnist", "fashion-mnist", "usps", "npz", "csv")
    with pytest.raises(DatasetError, match="unknown data set 'cifar'"):
        load_dataset("cifar")
    with pytest.raises(DatasetError, match="unknown option"):
        load_dataset("digits?sede=1")
    assert issubclass(DatasetError, LearningError)


def test_digits_is_embedded_scaled_and_split_reproducibly() -> None:
    ds = load_dataset("digits")
    assert (ds.x_train.shape, ds.x_test.shape) == ((1347, 1, 8, 8), (450, 1, 8, 8))
    assert ds.x_train.dtype == np.float32
    assert ds.y_train.dtype == np.int64
    assert ds.input_shape == (1, 8, 8)
    assert ds.num_classes == 10
    assert ds.is_image
    assert ds.x_train.min() == 0.0
    assert ds.x_train.max() == 1.0
    assert not ds.x_train.flags.writeable
    assert not ds.y_test.flags.writeable
    # stratified: every class keeps about a quarter of its records in the test split
    counts = np.bincount(ds.y_test, minlength=10)
    assert counts.min() >= 44
    assert counts.max() <= 46
    again = load_dataset("digits?seed=0", cache=False)
    np.testing.assert_array_equal(again.x_test, ds.x_test)
    other = load_dataset("digits?seed=1&test_fraction=0.5")
    assert other.x_test.shape[0] == 898  # per-class rounding (banker's) of 0.5 x counts
    assert not np.array_equal(other.y_test[:50], ds.y_test[:50])


def test_cache_returns_the_same_value() -> None:
    assert load_dataset("digits") is load_dataset("digits")
    clear_dataset_cache()
    assert load_dataset("digits?seed=0") is not None


@pytest.mark.slow
def test_mnist_counts(shared_data_dir: Path) -> None:
    ds = load_dataset("mnist", data_dir=shared_data_dir)
    assert ds.x_train.shape == (60000, 1, 28, 28)
    assert ds.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_train).tolist() == [
        5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949
    ]  # fmt: skip
    assert np.bincount(ds.y_test).tolist() == [
        980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009
    ]  # fmt: skip
    assert abs(float(ds.x_train.mean()) - 0.1307) < 1e-4
    assert abs(float(ds.x_train.std()) - 0.3081) < 1e-4


@pytest.mark.slow
def test_fashion_mnist_counts(shared_data_dir: Path) -> None:
    ds = load_dataset("fashion-mnist", data_dir=shared_data_dir)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
    assert np.bincount(ds.y_test).tolist() == [1000] * 10
    assert abs(float(ds.x_train.mean()) - 0.2860) < 1e-4
    assert ds.class_names is not None
    assert ds.class_names[9] == "Ankle boot"


def test_usps_counts(shared_data_dir: Path) -> None:
    ds = load_dataset("usps", data_dir=shared_data_dir)
    assert ds.input_shape == (1, 16, 16)
    assert np.bincount(ds.y_train).tolist() == [
        1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644
    ]  # fmt: skip
    assert np.bincount(ds.y_test).tolist() == [359, 264, 198, 166, 200, 160, 170, 147, 166, 177]
    assert float(ds.x_train.min()) >= 0.0
    assert float(ds.x_train.max()) <= 1.0


def test_the_data_dir_comes_from_the_environment(
    shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPFL_DATA_DIR", str(shared_data_dir))
    assert load_dataset("usps", cache=False).x_test.shape[0] == 2007


def test_missing_data_dir_says_which_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPFL_DATA_DIR", raising=False)
    with pytest.raises(DatasetError, match="set DPFL_DATA_DIR"):
        load_dataset("mnist", cache=False)
    monkeypatch.setenv("DPFL_DATA_DIR", "/nonexistent/dpfl-data")
    with pytest.raises(DatasetError, match="DPFL_DATA_DIR=/nonexistent/dpfl-data: no such folder"):
        load_dataset("usps", cache=False)


def _write_idx(path: Path, magic: int, array: np.ndarray) -> None:
    header = struct.pack(f">I{array.ndim}I", magic, *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_missing_and_corrupt_mnist_files_name_path_and_variable(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    with pytest.raises(DatasetError, match=r"data_dir=.*train-images-idx3-ubyte.gz: file not"):
        load_dataset("mnist", data_dir=tmp_path, cache=False)
    images = np.zeros((5, 28, 28), dtype=np.uint8)
    _write_idx(folder / "train-images-idx3-ubyte.gz", 2049, images)  # wrong magic
    _write_idx(folder / "train-labels-idx1-ubyte.gz", 2049, np.zeros(5, dtype=np.uint8))
    with pytest.raises(DatasetError, match="magic number 2049, expected 2051"):
        load_dataset("mnist", data_dir=tmp_path, cache=False)
    _write_idx(folder / "train-images-idx3-ubyte.gz", 2051, images)  # right format, wrong count
    with pytest.raises(DatasetError, match=r"expected \(60000, 28, 28\)"):
        load_dataset("mnist", data_dir=tmp_path, cache=False)


def test_corrupt_usps_file(tmp_path: Path) -> None:
    (tmp_path / "usps").mkdir()
    (tmp_path / "usps" / "usps.h5").write_bytes(b"not hdf5")
    with pytest.raises(DatasetError, match="not a readable HDF5 file"):
        load_dataset("usps", data_dir=tmp_path, cache=False)


def test_npz_tabular_and_images(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tab = tmp_path / "tab.npz"
    np.savez(tab, x=rng.normal(size=(40, 5)), y=np.arange(40) % 3)
    ds = load_dataset(f"npz:{tab}?test_fraction=0.25&seed=1")
    assert ds.input_shape == (5,)
    assert ds.num_classes == 3
    assert not ds.is_image
    assert ds.x_train.shape == (30, 5)
    assert ds.x_test.shape == (10, 5)
    assert load_dataset(f"npz:{tab}?classes=10").num_classes == 10
    with pytest.raises(DatasetError, match="outside classes=2"):
        load_dataset(f"npz:{tab}?classes=2")
    img = tmp_path / "img.npz"
    pixels = rng.integers(0, 256, size=(6, 8, 8))
    np.savez(img, x=pixels, y=[0, 1] * 3, x_test=pixels[:2], y_test=[1, 0])
    ds = load_dataset(f"npz:{img}?scale=255")
    assert ds.input_shape == (1, 8, 8)
    assert ds.x_test.shape == (2, 1, 8, 8)
    assert float(ds.x_train.max()) <= 1.0
    np.testing.assert_allclose(ds.x_train[0, 0], pixels[0] / 255, rtol=1e-6)


def test_npz_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, x=np.zeros((3, 2)))
    with pytest.raises(DatasetError, match=r"lacks array\(s\) \['y'\]"):
        load_dataset(f"npz:{path}")
    np.savez(path, x=np.zeros((3, 2)), y=np.array([{"a": 1}] * 3, dtype=object))
    with pytest.raises(DatasetError, match=r"not a readable \.npz"):
        load_dataset(f"npz:{path}")  # object arrays need pickle, which is never allowed
    np.savez(path, x=np.zeros((3, 2)), y=[0, 1])
    with pytest.raises(DatasetError, match="x has 3 rows but y has 2"):
        load_dataset(f"npz:{path}")
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(f"npz:{tmp_path / 'missing.npz'}")
    with pytest.raises(DatasetError, match="missing file path"):
        load_dataset("npz")


def test_npz_cache_sees_a_rewritten_file(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((4, 2)), y=[0, 1, 0, 1])
    first = load_dataset(f"npz:{path}")
    assert load_dataset(f"npz:{path}") is first
    np.savez(path, x=np.ones((6, 2)), y=[0, 1, 0, 1, 0, 1])
    assert load_dataset(f"npz:{path}").x_train.shape == (6, 2)


def test_csv_with_header_and_named_label(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("age,outcome,income\n30,yes,1.5\n40,no,2.5\n\n50,yes,3.0\n")
    ds = load_dataset(f"csv:{path}?label=outcome")
    assert ds.input_shape == (2,)
    assert ds.class_names == ("no", "yes")
    np.testing.assert_array_equal(ds.y_train, [1, 0, 1])
    np.testing.assert_allclose(ds.x_train[:, 1], [1.5, 2.5, 3.0])
    fixed = load_dataset(f"csv:{path}?label=outcome&classes=yes,no,maybe")
    assert fixed.num_classes == 3
    np.testing.assert_array_equal(fixed.y_train, [0, 1, 0])


def test_csv_without_header_uses_the_last_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("0.5,1.5,2\n1.5,0.5,0\n2.0,2.0,1\n")
    ds = load_dataset(f"csv:{path}")
    assert ds.x_train.shape == (3, 2)
    assert ds.num_classes == 3
    np.testing.assert_array_equal(ds.y_train, [2, 0, 1])
    by_index = load_dataset(f"csv:{path}?label=0&header=false")
    np.testing.assert_allclose(by_index.x_train[:, 1], [2, 0, 1])


def test_csv_errors_name_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,label\n1,2,0\n3,oops,1\n")
    with pytest.raises(DatasetError, match=r"line 3, column 'b': 'oops' is not a number"):
        load_dataset(f"csv:{path}")
    path.write_text("a,b,label\n1,2,0\n3,4\n")
    with pytest.raises(DatasetError, match="line 3 has 2 cells, expected 3"):
        load_dataset(f"csv:{path}")
    path.write_text("a,b,label\n1,2,0\n3,4,1\n")
    with pytest.raises(DatasetError, match="label column 'target' not found"):
        load_dataset(f"csv:{path}?label=target")
    path.write_text("")
    with pytest.raises(DatasetError, match="is empty"):
        load_dataset(f"csv:{path}")


def test_dataset_invariants_are_checked() -> None:
    x, y = np.zeros((4, 3)), np.array([0, 1, 2, 1])
    with pytest.raises(DatasetError, match="outside"):
        Dataset.from_arrays(spec="t", x_train=x, y_train=y, x_test=x, y_test=y, num_classes=2)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(DatasetError, match="NaN"):
        Dataset.from_arrays(spec="t", x_train=bad, y_train=y, x_test=x, y_test=y, num_classes=3)
    with pytest.raises(DatasetError, match="labels of shape"):
        Dataset.from_arrays(spec="t", x_train=x, y_train=y[:3], x_test=x, y_test=y, num_classes=3)
    with pytest.raises(DatasetError, match="not integers"):
        Dataset.from_arrays(spec="t", x_train=x, y_train=y + 0.5, x_test=x, y_test=y, num_classes=3)
