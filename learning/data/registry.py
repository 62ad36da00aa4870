"""One entry point for every data set: :func:`load_dataset` parses a spec and dispatches by name.

Registry (fixed at import, never mutated): ``digits`` (embedded), ``mnist``, ``fashion-mnist``,
``usps`` (from ``$DPFL_DATA_DIR``), ``npz:PATH`` and ``csv:PATH`` (a silo's own files).

Every spec also takes ``holdout=F`` (and ``holdout_seed=S``, default 0): the data set's own test
split is dropped, never read past the loader, and a stratified fraction F of its training split
becomes the evaluation split. A recipe search simulates on such a view of a public proxy, so
that it chooses by validation accuracy without touching any test record.

Loaded data sets are cached per process, keyed by the canonical spec and data folder and
invalidated when a source file's size or modification time changes: an in-process simulation of a
hundred agents parses MNIST once, and because a :class:`Dataset`'s arrays are read-only, sharing the
cached value is safe.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from dpfl.learning.data.dataset import Dataset
from dpfl.learning.data.images import (
    DATA_DIR_ENV,
    load_digits_dataset,
    load_fashion_mnist,
    load_mnist,
    load_usps,
)
from dpfl.learning.data.split import stratified_split
from dpfl.learning.data.tabular import load_csv, load_npz
from dpfl.learning.errors import DatasetError
from dpfl.learning.specs import Spec, parse_spec

__all__ = ["clear_dataset_cache", "dataset_names", "load_dataset", "parse_dataset_spec"]

Loader = Callable[[Spec, "Path | str | None"], Dataset]

_LOADERS: MappingProxyType[str, Loader] = MappingProxyType(
    {
        "digits": load_digits_dataset,
        "mnist": load_mnist,
        "fashion-mnist": load_fashion_mnist,
        "usps": load_usps,
        "npz": load_npz,
        "csv": load_csv,
    }
)

_CACHE_SIZE = 8
_cache: OrderedDict[tuple[str, str], tuple[Dataset, tuple[tuple[str, int, int], ...]]] = (
    OrderedDict()
)
_lock = threading.Lock()


def dataset_names() -> tuple[str, ...]:
    """The names a data set spec may start with."""
    return tuple(_LOADERS)


def parse_dataset_spec(spec: str | Spec) -> Spec:
    """Parse and check the name of a data set spec (options are checked by the loader).

    Raises:
        DatasetError: malformed spec or unknown data set name.
    """
    parsed = (
        spec if isinstance(spec, Spec) else parse_spec(spec, what="data set", error=DatasetError)
    )
    if parsed.name not in _LOADERS:
        raise DatasetError(
            f"unknown data set {parsed.name!r} in {str(spec)!r} "
            f"(known: {', '.join(_LOADERS)}; files: npz:PATH, csv:PATH)"
        )
    return parsed


def _fingerprint(sources: tuple[str, ...]) -> tuple[tuple[str, int, int], ...] | None:
    stamps = []
    for source in sources:
        try:
            stat = Path(source).stat()
        except OSError:
            return None
        stamps.append((source, stat.st_size, stat.st_mtime_ns))
    return tuple(stamps)


def load_dataset(
    spec: str | Spec, *, data_dir: Path | str | None = None, cache: bool = True
) -> Dataset:
    """Load a data set from its spec string.

    Args:
        spec: e.g. ``"digits"``, ``"mnist"``, ``"usps"``, ``"npz:/silo/data.npz"``,
            ``"csv:/silo/table.csv?label=outcome&classes=2"``.
        data_dir: folder of the file-based image sets; ``None`` reads ``$DPFL_DATA_DIR`` (only
            when such a set is requested).
        cache: reuse a previously loaded value when its files are unchanged.

    Returns:
        The :class:`Dataset`, with read-only arrays.

    Raises:
        DatasetError: bad spec, unknown name or option, missing or corrupt files.
    """
    parsed = parse_dataset_spec(spec)
    if parsed.option("holdout") is not None or parsed.option("holdout_seed") is not None:
        return _holdout_view(parsed, data_dir=data_dir, cache=cache)
    key = (str(parsed), str(data_dir) if data_dir is not None else os.environ.get(DATA_DIR_ENV, ""))
    if cache:
        with _lock:
            hit = _cache.get(key)
        if hit is not None and _fingerprint(hit[0].sources) == hit[1]:
            with _lock:
                _cache.move_to_end(key)
            return hit[0]
    dataset = _LOADERS[parsed.name](parsed, data_dir)
    if cache:
        stamps = _fingerprint(dataset.sources)
        if stamps is not None:
            with _lock:
                _cache[key] = (dataset, stamps)
                while len(_cache) > _CACHE_SIZE:
                    _cache.popitem(last=False)
    return dataset


def _holdout_view(parsed: Spec, *, data_dir: Path | str | None, cache: bool) -> Dataset:
    """The ``holdout`` view of a spec: its training split only, a stratified fraction of it
    held out as the evaluation split (see the module docstring)."""
    fraction = parsed.float_option("holdout", 0.0, error=DatasetError, low=0.0, high=0.9)
    if parsed.option("holdout") is None or not fraction > 0:
        raise DatasetError(f"{parsed}: holdout must be a fraction in (0, 0.9]")
    seed = parsed.int_option("holdout_seed", 0, error=DatasetError, minimum=0)
    rest = tuple((k, v) for k, v in parsed.options if k not in ("holdout", "holdout_seed"))
    base = load_dataset(Spec(parsed.name, parsed.path, rest), data_dir=data_dir, cache=cache)
    train, held = stratified_split(base.y_train, test_fraction=fraction, seed=seed)
    if train.size == 0 or held.size == 0:
        raise DatasetError(
            f"{parsed}: a holdout of {fraction:g} leaves an empty split of "
            f"{base.y_train.size} training records"
        )
    return Dataset.from_arrays(
        spec=str(parsed),
        x_train=base.x_train[train],
        y_train=base.y_train[train],
        x_test=base.x_train[held],
        y_test=base.y_train[held],
        num_classes=base.num_classes,
        input_shape=base.input_shape,
        class_names=base.class_names,
        sources=base.sources,
        copy=False,
    )


def clear_dataset_cache() -> None:
    """Forget every cached data set (tests; or to release memory)."""
    with _lock:
        _cache.clear()
