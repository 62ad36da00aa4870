"""The :class:`Dataset` value every loader returns and every partitioner and trainer consumes.

Invariants (checked on construction): features are C-contiguous read-only ``float32`` arrays shaped
``(n, *input_shape)``; labels are read-only ``int64`` vectors with values in ``[0, num_classes)``;
train and test share the input shape. Read-only arrays make a cached data set safe to hand to many
in-process agents: nobody can change the data another agent trains on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpfl.learning.errors import DatasetError

__all__ = ["Dataset"]


_Scalar = TypeVar("_Scalar", bound=np.generic)


def _frozen(array: NDArray[np.generic], dtype: type[_Scalar], copy: bool) -> NDArray[_Scalar]:
    out = np.array(array, dtype=dtype, order="C", copy=True if copy else None)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False, slots=True)
class Dataset:
    """A labelled data set with its fixed train/test split.

    Attributes:
        spec: the canonical spec string it was loaded from (reproducibility key).
        x_train: features, ``float32``, shape ``(n_train, *input_shape)``.
        y_train: labels, ``int64``, shape ``(n_train,)``.
        x_test: features of the held-out evaluation split (may have 0 rows).
        y_test: labels of the held-out evaluation split.
        input_shape: ``(channels, height, width)`` for images, ``(d,)`` for tabular data.
        num_classes: number of classes C (labels lie in ``[0, C)``).
        class_names: names of the classes when the source had named labels, else ``None``.
        sources: the files it was read from (empty for embedded data).
    """

    spec: str
    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]
    input_shape: tuple[int, ...]
    num_classes: int
    class_names: tuple[str, ...] | None = None
    sources: tuple[str, ...] = ()

    @classmethod
    def from_arrays(
        cls,
        *,
        spec: str,
        x_train: ArrayLike,
        y_train: ArrayLike,
        x_test: ArrayLike,
        y_test: ArrayLike,
        num_classes: int,
        input_shape: tuple[int, ...] | None = None,
        class_names: tuple[str, ...] | None = None,
        sources: tuple[str, ...] = (),
        copy: bool = True,
    ) -> Dataset:
        """Build a data set from arrays, converting dtypes and freezing them.

        Args:
            spec: the spec string to record.
            x_train: features; reshaped to ``(n, *input_shape)`` when ``input_shape`` is given.
            y_train: integer labels.
            x_test: test features (may be empty).
            y_test: test labels.
            num_classes: number of classes.
            input_shape: the per-sample shape; default: ``x_train.shape[1:]``.
            class_names: optional class names (length ``num_classes``).
            sources: files it came from.
            copy: copy the arrays (``False`` lets a loader hand over arrays it owns, which are
                then frozen in place).

        Raises:
            DatasetError: inconsistent shapes, non-finite features or labels out of range.
        """
        xtr = np.asarray(x_train)
        xte = np.asarray(x_test)
        shape = tuple(int(s) for s in (input_shape if input_shape is not None else xtr.shape[1:]))
        if not shape or any(s <= 0 for s in shape):
            raise DatasetError(f"{spec}: bad input shape {shape}")
        try:
            xtr = xtr.reshape((xtr.shape[0], *shape)) if xtr.ndim else xtr
            xte = xte.reshape((xte.shape[0] if xte.ndim else 0, *shape))
        except ValueError as exc:
            raise DatasetError(f"{spec}: features do not fit input shape {shape}: {exc}") from None
        ytr, yte = np.asarray(y_train), np.asarray(y_test)
        for name, y in (("train", ytr), ("test", yte)):
            integral = np.issubdtype(y.dtype, np.integer) or np.all(np.equal(np.mod(y, 1), 0))
            if y.size and not integral:
                raise DatasetError(f"{spec}: {name} labels are not integers")
        return cls(
            spec=spec,
            x_train=_frozen(xtr, np.float32, copy),
            y_train=_frozen(ytr, np.int64, copy),
            x_test=_frozen(xte, np.float32, copy),
            y_test=_frozen(yte, np.int64, copy),
            input_shape=shape,
            num_classes=int(num_classes),
            class_names=class_names,
            sources=sources,
        )

    def subset(self, indices: NDArray[np.int64], *, spec: str) -> Dataset:
        """The training records at ``indices`` (a copy, frozen) with this data set's test split
        shared, as ``spec``. Every invariant :meth:`__post_init__` checks holds by construction
        (the rows are this validated data set's), so nothing is checked again: an agent of a
        simulated federation loads its share every round, and re-checking the whole shared test
        split each time was most of the load."""
        x, y = self.x_train[indices], self.y_train[indices]
        x.flags.writeable = False
        y.flags.writeable = False
        out = object.__new__(Dataset)
        for name, value in (
            ("spec", spec),
            ("x_train", x),
            ("y_train", y),
            ("x_test", self.x_test),
            ("y_test", self.y_test),
            ("input_shape", self.input_shape),
            ("num_classes", self.num_classes),
            ("class_names", self.class_names),
            ("sources", self.sources),
        ):
            object.__setattr__(out, name, value)
        return out

    def __post_init__(self) -> None:
        spec = self.spec
        if self.num_classes < 2:
            raise DatasetError(f"{spec}: needs at least 2 classes, got {self.num_classes}")
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise DatasetError(
                f"{spec}: {len(self.class_names)} class names for {self.num_classes} classes"
            )
        for split, x, y in (
            ("train", self.x_train, self.y_train),
            ("test", self.x_test, self.y_test),
        ):
            if x.dtype != np.float32 or y.dtype != np.int64:
                raise DatasetError(
                    f"{spec}: {split} arrays must be float32/int64 (use from_arrays)"
                )
            if x.flags.writeable or y.flags.writeable:
                raise DatasetError(f"{spec}: {split} arrays must be read-only (use from_arrays)")
            if x.shape[1:] != self.input_shape:
                raise DatasetError(
                    f"{spec}: {split} features have shape {x.shape[1:]}, "
                    f"expected {self.input_shape}"
                )
            if y.shape != (x.shape[0],):
                raise DatasetError(
                    f"{spec}: {split} has {x.shape[0]} feature rows but labels of shape {y.shape}"
                )
            if y.size and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise DatasetError(
                    f"{spec}: {split} labels span [{int(y.min())}, {int(y.max())}], "
                    f"outside [0, {self.num_classes})"
                )
            if x.size and not np.isfinite(x).all():
                raise DatasetError(f"{spec}: {split} features contain NaN or infinity")
        if self.x_train.shape[0] == 0:
            raise DatasetError(f"{spec}: the training split is empty")

    @property
    def is_image(self) -> bool:
        """Whether samples are ``(channels, height, width)`` images (so a CNN applies)."""
        return len(self.input_shape) == 3

    @property
    def num_features(self) -> int:
        """Length of one flattened sample."""
        return math.prod(self.input_shape)

    def __repr__(self) -> str:
        return (
            f"Dataset({self.spec!r}, train={self.x_train.shape[0]}, test={self.x_test.shape[0]}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes})"
        )
