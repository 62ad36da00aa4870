"""Loaders of the built-in image data sets: ``digits``, ``mnist``, ``fashion-mnist``, ``usps``.

``digits`` is scikit-learn's copy of the UCI optical digits (1,797 images of 8x8 pixels with
values 0..16), so it needs no files and is the default of demos and tests. The others are read
from the **data folder**, with the layout of the shared offline copy: ``mnist/`` and
``fashion-mnist/`` hold the official IDX ``.gz`` files, ``usps/usps.h5`` the HDF5 file with
``train/data``, ``train/target``, ``test/data``, ``test/target``.

One rule finds the data folder, for every command, the Python API and the coordinator
(:func:`locate_data_dir`; README, "Data"):

1. the folder given explicitly: ``--data-dir DIR`` (``dpfl simulate``, ``dpfl audit``,
   ``dpfl-coordinator serve`` and ``job submit``, the benchmarks), ``data_dir=`` (``dpfl.simulate``,
   :func:`~dpfl.learning.data.load_dataset`), the coordinator's ``data_dir`` setting;
2. else ``$DPFL_DATA_DIR``;
3. else none: a data set that needs files is refused, saying both ways to give the folder.

There is no default folder. An error names the folder the way it was given (``--data-dir X``,
``data_dir='X'``, ``DPFL_DATA_DIR=X``), never an option the user did not pass.

Invariant: pixel values are scaled to [0, 1] (``/16`` for digits, ``/255`` for IDX files, USPS
already is), images are shaped ``(1, H, W)``, and the published counts are checked (60,000/10,000
for the MNIST family), so a wrong or partial file fails loudly instead of training on garbage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from dpfl.learning.data.dataset import Dataset
from dpfl.learning.data.idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, read_idx
from dpfl.learning.data.split import stratified_split
from dpfl.learning.errors import DatasetError
from dpfl.learning.specs import Spec

__all__ = [
    "DATA_DIR_ENV",
    "FILE_DATASETS",
    "DataFolder",
    "load_digits_dataset",
    "load_fashion_mnist",
    "load_mnist",
    "load_usps",
    "locate_data_dir",
    "resolve_data_dir",
]

DATA_DIR_ENV = "DPFL_DATA_DIR"

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


#: The data sets read from the data folder, and the folder each one is in.
FILE_DATASETS: dict[str, str] = {"mnist": "mnist", "fashion-mnist": "fashion-mnist", "usps": "usps"}
_LAYOUT = "the folder holding mnist/, fashion-mnist/ and usps/"


@dataclass(frozen=True, slots=True)
class DataFolder:
    """The data folder and how it was given (for messages).

    Attributes:
        path: the folder (``~`` expanded).
        origin: how the user gave it, e.g. ``--data-dir /data``, ``data_dir='/data'``,
            ``DPFL_DATA_DIR=/data``.
    """

    path: Path
    origin: str


def locate_data_dir(
    data_dir: Path | str | None = None,
    *,
    given_as: str = "data_dir",
    needs: tuple[str, ...] = (),
) -> DataFolder:
    """The data folder by the one rule of this module: ``data_dir``, else ``$DPFL_DATA_DIR``.

    Args:
        data_dir: the folder given explicitly, or None.
        given_as: how ``data_dir`` was given, for messages: a flag (``"--data-dir"``) or a
            parameter name (``"data_dir"``).
        needs: data sets about to be read (``FILE_DATASETS`` names); their folders must be
            there.

    Raises:
        DatasetError: no folder given and ``$DPFL_DATA_DIR`` unset, or the folder (or one that
            ``needs`` names inside it) does not exist, naming the folder as it was given.
    """
    if needs:
        names = ", ".join(repr(n) for n in needs)
        what = f"data set {names} is" if len(needs) == 1 else f"data sets {names} are"
    else:
        what = "mnist, fashion-mnist and usps are"
    if data_dir is not None and str(data_dir).strip():
        raw = str(data_dir)
        origin = f"{given_as} {raw}" if given_as.startswith("-") else f"{given_as}={raw!r}"
    else:
        raw = os.environ.get(DATA_DIR_ENV, "").strip()
        if not raw:
            if given_as.startswith("-"):
                how = f"give it with {given_as} DIR or set {DATA_DIR_ENV}=DIR"
            else:
                how = f"set {DATA_DIR_ENV} to it (or pass {given_as})"
            raise DatasetError(f"{what} read from files in a data folder ({_LAYOUT}): {how}")
        origin = f"{DATA_DIR_ENV}={raw}"
    path = Path(raw).expanduser()
    if not path.is_dir():
        raise DatasetError(f"{origin}: no such folder (it should be {_LAYOUT})")
    for name in needs:
        folder = FILE_DATASETS.get(name)
        if folder is not None and not (path / folder).is_dir():
            raise DatasetError(
                f"{origin}: it holds no {folder}/ folder, which data set {name!r} is read from "
                f"(it should be {_LAYOUT})"
            )
    return DataFolder(path, origin)


def resolve_data_dir(data_dir: Path | str | None, *, dataset: str) -> DataFolder:
    """The data folder a loader reads ``dataset`` from (:func:`locate_data_dir`).

    Raises:
        DatasetError: as :func:`locate_data_dir`.
    """
    return locate_data_dir(data_dir, needs=(dataset,))


def load_digits_dataset(spec: Spec, data_dir: Path | str | None) -> Dataset:
    """``digits[?test_fraction=0.25&seed=0]``: scikit-learn's 8x8 digits with a stratified split."""
    del data_dir  # embedded: never reads files
    spec.check_options(("test_fraction", "seed"), error=DatasetError)
    if spec.path is not None:
        raise DatasetError(f"{spec}: the digits data set is embedded and takes no path")
    test_fraction = spec.float_option("test_fraction", 0.25, error=DatasetError, low=0.0, high=0.9)
    seed = spec.int_option("seed", 0, error=DatasetError, minimum=0)
    from sklearn.datasets import load_digits  # deferred: scikit-learn is slow to import

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0)
    labels = np.asarray(bunch.target, dtype=np.int64)
    train, test = stratified_split(labels, test_fraction=test_fraction, seed=seed)
    return Dataset.from_arrays(
        spec=str(spec),
        x_train=images[train],
        y_train=labels[train],
        x_test=images[test],
        y_test=labels[test],
        num_classes=10,
        input_shape=(1, 8, 8),
        copy=False,
    )


def _idx_file(folder: Path, stem: str) -> Path:
    gz = folder / f"{stem}.gz"
    if gz.exists() or not (folder / stem).exists():
        return gz
    return folder / stem


def _load_idx_family(
    spec: Spec, data_dir: Path | str | None, *, folder: str, class_names: tuple[str, ...] | None
) -> Dataset:
    spec.check_options((), error=DatasetError)
    if spec.path is not None:
        raise DatasetError(f"{spec}: takes no path; it is read from ${DATA_DIR_ENV}/{folder}/")
    located = resolve_data_dir(data_dir, dataset=spec.name)
    root = located.path / folder
    arrays: dict[str, NDArray[np.uint8]] = {}
    sources = []
    for split, prefix, count in (("train", "train", 60_000), ("test", "t10k", 10_000)):
        images_path = _idx_file(root, f"{prefix}-images-idx3-ubyte")
        labels_path = _idx_file(root, f"{prefix}-labels-idx1-ubyte")
        try:
            images = read_idx(images_path, expected_magic=IDX_IMAGES_MAGIC)
            labels = read_idx(labels_path, expected_magic=IDX_LABELS_MAGIC)
        except DatasetError as exc:
            raise DatasetError(f"{spec.name} ({located.origin}): {exc}") from None
        if images.shape != (count, 28, 28) or labels.shape != (count,):
            raise DatasetError(
                f"{spec.name}: {images_path} has shape {images.shape} and {labels_path} "
                f"{labels.shape}; expected ({count}, 28, 28) and ({count},)"
            )
        if int(labels.max()) > 9:
            raise DatasetError(f"{spec.name}: {labels_path} holds labels above 9")
        arrays[split + "_x"], arrays[split + "_y"] = images, labels
        sources += [str(images_path), str(labels_path)]
    scale = np.float32(1.0 / 255.0)
    return Dataset.from_arrays(
        spec=str(spec),
        x_train=arrays["train_x"].astype(np.float32) * scale,
        y_train=arrays["train_y"].astype(np.int64),
        x_test=arrays["test_x"].astype(np.float32) * scale,
        y_test=arrays["test_y"].astype(np.int64),
        num_classes=10,
        input_shape=(1, 28, 28),
        class_names=class_names,
        sources=tuple(sources),
        copy=False,
    )


def load_mnist(spec: Spec, data_dir: Path | str | None) -> Dataset:
    """``mnist``: the official MNIST IDX files under ``$DPFL_DATA_DIR/mnist/``."""
    return _load_idx_family(spec, data_dir, folder="mnist", class_names=None)


def load_fashion_mnist(spec: Spec, data_dir: Path | str | None) -> Dataset:
    """``fashion-mnist``: Zalando's IDX files under ``$DPFL_DATA_DIR/fashion-mnist/``."""
    return _load_idx_family(
        spec, data_dir, folder="fashion-mnist", class_names=FASHION_MNIST_CLASSES
    )


def load_usps(spec: Spec, data_dir: Path | str | None) -> Dataset:
    """``usps``: the 16x16 USPS digits in ``$DPFL_DATA_DIR/usps/usps.h5`` (values in [0, 1])."""
    spec.check_options((), error=DatasetError)
    if spec.path is not None:
        raise DatasetError(f"{spec}: takes no path; it is read from ${DATA_DIR_ENV}/usps/usps.h5")
    located = resolve_data_dir(data_dir, dataset="usps")
    path = located.path / "usps" / "usps.h5"
    if not path.is_file():
        raise DatasetError(f"usps: file {path} not found ({located.origin})")
    import h5py  # deferred: only this loader needs it

    parts: dict[str, NDArray[np.generic]] = {}
    try:
        with h5py.File(path, "r") as handle:
            for key in ("train/data", "train/target", "test/data", "test/target"):
                if key not in handle:
                    raise DatasetError(f"usps: {path} has no dataset {key!r}")
                parts[key] = np.asarray(handle[key][()])
    except OSError as exc:
        raise DatasetError(f"usps: {path} is not a readable HDF5 file ({exc})") from exc
    for split in ("train", "test"):
        x, y = parts[f"{split}/data"], parts[f"{split}/target"]
        if x.ndim != 2 or x.shape[1] != 256 or y.shape != (x.shape[0],):
            raise DatasetError(
                f"usps: {path} {split} arrays have shapes {x.shape} and {y.shape}; "
                "expected (n, 256) and (n,)"
            )
        if x.size and (float(x.min()) < -1e-6 or float(x.max()) > 1 + 1e-6):
            raise DatasetError(f"usps: {path} {split} pixels lie outside [0, 1]")
    return Dataset.from_arrays(
        spec=str(spec),
        x_train=parts["train/data"],
        y_train=parts["train/target"],
        x_test=parts["test/data"],
        y_test=parts["test/target"],
        num_classes=10,
        input_shape=(1, 16, 16),
        sources=(str(path),),
    )
