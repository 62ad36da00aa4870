"""Loaders of a silo's own files: ``npz:PATH`` (numpy arrays) and ``csv:PATH`` (a table).

``npz`` holds ``x``, ``y`` and optionally ``x_test``, ``y_test``, opened with
``allow_pickle=False`` so a data file can never execute code. ``csv`` is numeric apart from the
label column (``?label=NAME``, else the last one), with a guessed header. Options common to both:
``classes=`` (fix the label mapping so every silo of a federation agrees), ``test_fraction=``,
``seed=`` and ``scale=``.
"""

from __future__ import annotations

import csv
import math
import zipfile
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from dpfl.learning.data.dataset import Dataset
from dpfl.learning.data.split import stratified_split
from dpfl.learning.errors import DatasetError
from dpfl.learning.specs import Spec

__all__ = ["load_csv", "load_npz"]

_COMMON_OPTIONS = ("classes", "test_fraction", "seed", "scale")


def _file(spec: Spec) -> Path:
    if spec.path is None:
        raise DatasetError(f"{spec}: missing file path (use '{spec.name}:PATH')")
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise DatasetError(f"{spec}: file {path} not found")
    return path


def _label_mapping(
    spec: Spec, raw_labels: list[str]
) -> tuple[NDArray[np.int64], int, tuple[str, ...] | None]:
    """Map label cells to class indices; see the module docstring for the ``classes`` rule."""
    classes = spec.option("classes")
    try:
        ints = np.array([int(v) for v in raw_labels], dtype=np.int64)
    except ValueError:
        ints = None
    if ints is not None and (classes is None or classes.isdigit()):
        if ints.size and ints.min() < 0:
            raise DatasetError(f"{spec}: negative label {int(ints.min())}")
        inferred = int(ints.max()) + 1 if ints.size else 0
        count = spec.int_option("classes", inferred, error=DatasetError, minimum=2)
        if inferred > count:
            raise DatasetError(f"{spec}: label {inferred - 1} is outside classes={count}")
        return ints, count, None
    names = (
        tuple(c.strip() for c in classes.split(",")) if classes else tuple(sorted(set(raw_labels)))
    )
    if len(set(names)) != len(names):
        raise DatasetError(f"{spec}: duplicate names in classes={classes}")
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(raw_labels) - index.keys())
    if unknown:
        raise DatasetError(f"{spec}: labels {unknown[:5]} are not among classes={classes}")
    return np.array([index[v] for v in raw_labels], dtype=np.int64), len(names), names


def _finish(
    spec: Spec,
    *,
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    x_test: NDArray[np.float32] | None,
    y_test: NDArray[np.int64] | None,
    num_classes: int,
    class_names: tuple[str, ...] | None,
    input_shape: tuple[int, ...],
    source: Path,
) -> Dataset:
    scale = spec.float_option("scale", 1.0, error=DatasetError, low=1e-12)
    fraction = spec.float_option("test_fraction", 0.0, error=DatasetError, low=0.0, high=0.9)
    seed = spec.int_option("seed", 0, error=DatasetError, minimum=0)
    if x_test is None or y_test is None:
        if fraction > 0:
            train, test = stratified_split(y, test_fraction=fraction, seed=seed)
            x, y, x_test, y_test = x[train], y[train], x[test], y[test]
        else:
            x_test = np.empty((0, *input_shape), dtype=np.float32)
            y_test = np.empty(0, dtype=np.int64)
    elif fraction > 0:
        raise DatasetError(f"{spec}: test_fraction given but the file already has a test split")
    if scale != 1.0:
        x, x_test = x / np.float32(scale), x_test / np.float32(scale)
    return Dataset.from_arrays(
        spec=str(spec),
        x_train=x,
        y_train=y,
        x_test=x_test,
        y_test=y_test,
        num_classes=num_classes,
        input_shape=input_shape,
        class_names=class_names,
        sources=(str(source),),
    )


def load_npz(spec: Spec, data_dir: Path | str | None) -> Dataset:
    """``npz:PATH``: arrays ``x``, ``y`` [, ``x_test``, ``y_test``] (see the module docstring)."""
    del data_dir  # the path is explicit
    spec.check_options(_COMMON_OPTIONS, error=DatasetError)
    path = _file(spec)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: np.asarray(archive[key]) for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(f"{spec}: {path} is not a readable .npz file ({exc})") from exc
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise DatasetError(f"{spec}: {path} lacks array(s) {missing} (has {sorted(arrays)})")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise DatasetError(f"{spec}: {path} must hold both x_test and y_test, or neither")
    x = arrays["x"]
    if x.ndim not in (2, 3, 4) or x.shape[0] == 0:
        raise DatasetError(
            f"{spec}: x has shape {x.shape}; expected (n, d), (n, H, W) or (n, C, H, W), n > 0"
        )
    shape = (1, *x.shape[1:]) if x.ndim == 3 else tuple(x.shape[1:])
    for key in ("x", "x_test"):
        if key in arrays and not np.issubdtype(arrays[key].dtype, np.number):
            raise DatasetError(f"{spec}: array {key} has non-numeric dtype {arrays[key].dtype}")
    y_all = [arrays["y"], *([arrays["y_test"]] if "y_test" in arrays else [])]
    for y in y_all:
        if y.ndim != 1:
            raise DatasetError(f"{spec}: labels must be a vector, got shape {y.shape}")
    cells = [str(v) for y in y_all for v in (y.astype(np.int64) if _integral(y) else y).tolist()]
    labels, num_classes, names = _label_mapping(spec, cells)
    n = arrays["y"].shape[0]
    if n != x.shape[0]:
        raise DatasetError(f"{spec}: x has {x.shape[0]} rows but y has {n}")
    has_test = "x_test" in arrays
    return _finish(
        spec,
        x=x.reshape((x.shape[0], *shape)).astype(np.float32),
        y=labels[:n],
        x_test=arrays["x_test"].astype(np.float32).reshape((-1, *shape)) if has_test else None,
        y_test=labels[n:] if has_test else None,
        num_classes=num_classes,
        class_names=names,
        input_shape=shape,
        source=path,
    )


def _integral(y: NDArray[np.generic]) -> bool:
    if np.issubdtype(y.dtype, np.integer):
        return True
    if np.issubdtype(y.dtype, np.floating):
        return bool(np.all(np.isfinite(y)) and np.all(np.mod(y, 1) == 0))
    return False


def _is_number(cell: str) -> bool:
    try:
        return math.isfinite(float(cell))
    except ValueError:
        return False


def _csv_rows(spec: Spec, path: Path) -> list[tuple[int, list[str]]]:
    """The file's non-blank rows with their line numbers, cells stripped, all of one width ≥ 2.

    Raises:
        DatasetError: unreadable, empty, or ragged.
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = [
                (number, [cell.strip() for cell in row])
                for number, row in enumerate(csv.reader(handle), start=1)
                if row and any(cell.strip() for cell in row)
            ]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{spec}: cannot read {path} as CSV ({exc})") from exc
    if not rows:
        raise DatasetError(f"{spec}: {path} is empty")
    width = len(rows[0][1])
    if width < 2:
        raise DatasetError(f"{spec}: {path} needs at least one feature column and a label column")
    for number, row in rows:
        if len(row) != width:
            raise DatasetError(
                f"{spec}: {path} line {number} has {len(row)} cells, expected {width}"
            )
    return rows


def load_csv(spec: Spec, data_dir: Path | str | None) -> Dataset:
    """``csv:PATH``: one record per row, numeric features, label column by name or last."""
    del data_dir
    spec.check_options((*_COMMON_OPTIONS, "label", "header"), error=DatasetError)
    path = _file(spec)
    rows = _csv_rows(spec, path)
    width = len(rows[0][1])
    header = spec.bool_option("header", error=DatasetError)
    if header is None:
        first = rows[0][1]
        second = rows[1][1] if len(rows) > 1 else first
        header = any(
            not _is_number(a) and _is_number(b) for a, b in zip(first, second, strict=True)
        )
    names = rows[0][1] if header else [str(i) for i in range(width)]
    body = rows[1:] if header else rows
    if not body:
        raise DatasetError(f"{spec}: {path} has a header but no records")
    label_key = spec.option("label")
    if label_key is None:
        label_col = width - 1
    elif label_key in names and header:
        label_col = names.index(label_key)
    elif label_key.lstrip("-").isdigit() and -width <= int(label_key) < width:
        label_col = int(label_key) % width
    else:
        raise DatasetError(
            f"{spec}: label column {label_key!r} not found in {path} "
            f"(columns: {', '.join(names) if header else f'{width} unnamed'})"
        )
    features = np.empty((len(body), width - 1), dtype=np.float32)
    feature_cols = [c for c in range(width) if c != label_col]
    for i, (number, row) in enumerate(body):
        for j, c in enumerate(feature_cols):
            try:
                features[i, j] = float(row[c])
            except ValueError:
                raise DatasetError(
                    f"{spec}: {path} line {number}, column {names[c]!r}: {row[c]!r} is not a number"
                ) from None
    if not np.isfinite(features).all():
        raise DatasetError(f"{spec}: {path} holds NaN or infinite feature values")
    labels, num_classes, class_names = _label_mapping(spec, [row[label_col] for _, row in body])
    return _finish(
        spec,
        x=features,
        y=labels,
        x_test=None,
        y_test=None,
        num_classes=num_classes,
        class_names=class_names,
        input_shape=(width - 1,),
        source=path,
    )
