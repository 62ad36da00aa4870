"""A job's three kinds of records: the agents' private parts, the public pool and the test set.

The public pool comes from the agents' training split (held out before partitioning), from the
data set's test split (the test set is then the rest of it), or from another registered data set
(a second domain: the test set is then the rest of that domain, and its images are reconciled to
the agents' input shape). Rules and the reasons public data costs no privacy: docs/architecture.md
(section "The job's data"). Everything here is a pure function of the job's ``data`` section, so
the coordinator, the audit and every simulated agent build the same split.

Invariants: the agents' parts, the public pool and the test set are pairwise disjoint; a pool
drawn from one split is stratified by class and seeded (numpy's PCG64); the first
``agent_readable`` records of the pool are those agents may read (a stratified draw, so every
class is represented), the rest the coordinator keeps to itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from dpfl.learning.data.dataset import Dataset
from dpfl.learning.data.partition import (
    Federation,
    PartitionScheme,
    federate,
    public_stream_seed,
)
from dpfl.learning.data.registry import load_dataset
from dpfl.learning.data.split import stratified_split, stratified_take
from dpfl.learning.errors import PartitionError

__all__ = [
    "JobSplits",
    "PublicPool",
    "TestRule",
    "reconcile_images",
    "resolve_test_rule",
    "split_job_data",
]

TestRule = Literal["split", "rest"]

_READABLE_STREAM = 2  # seed-sequence tag of the agent-readable draw (public: 0, partition: 1)


@dataclass(frozen=True, slots=True)
class PublicPool:
    """Where the public pool comes from and how big it is (the job's ``data.public``).

    Attributes:
        source: ``"train"``, ``"test"`` or the spec of another data set.
        fraction: share of the source's records in the pool (exclusive with ``count``).
        count: exact number of records in the pool.
        agent_readable: how many of the pool's records agents may read (None: all).
        seed: the pool's own seed (None: the data section's seed).
        box: for another data set's images: resize them into a centred ``box`` x ``box`` square
            with zero padding around (None: stretch them to the whole image).
    """

    source: str = "train"
    fraction: float | None = None
    count: int | None = None
    agent_readable: int | None = None
    seed: int | None = None
    box: int | None = None

    @property
    def foreign(self) -> bool:
        """Whether the pool comes from another data set than the agents'."""
        return self.source not in ("train", "test")


def resolve_test_rule(public: PublicPool | None, test: TestRule | None) -> TestRule:
    """The test set's rule: ``split`` (the agents' data set's test split) or ``rest`` (the public
    source's records outside the pool); None picks ``rest`` for a pool drawn from the test split
    or another data set, else ``split``.

    Raises:
        PartitionError: a rule that would overlap the pool or the agents' records.
    """
    if test is None:
        return "rest" if public is not None and public.source != "train" else "split"
    if test == "rest" and (public is None or public.source == "train"):
        raise PartitionError(
            "data.test: 'rest' needs a public pool drawn from the test split or another data set "
            "(the rest of the training split is the agents' private data)"
        )
    if test == "split" and public is not None and public.source == "test":
        raise PartitionError(
            "data.test: 'split' would overlap the public pool drawn from the test split "
            "(use 'rest')"
        )
    return test


@dataclass(frozen=True, eq=False, slots=True)
class JobSplits:
    """The job's split records.

    Attributes:
        federation: the agents' private parts (of the training split of the agents' data set).
        public_x, public_y: the public pool (None when the job has none); its labels serve only to
            score pseudo-labels.
        agent_readable: the number of leading pool records agents may read (0 without a pool).
        test_x, test_y: the test set.
        test: the rule the test set was built with.
    """

    federation: Federation
    public_x: NDArray[np.float32] | None
    public_y: NDArray[np.int64] | None
    agent_readable: int
    test_x: NDArray[np.float32]
    test_y: NDArray[np.int64]
    test: TestRule

    def public_for_agents(self) -> NDArray[np.float32] | None:
        """The records agents may read: the first ``agent_readable`` of the pool (or None)."""
        if self.public_x is None:
            return None
        out = self.public_x[: self.agent_readable]
        out.flags.writeable = False
        return out


def _bilinear_matrix(size_in: int, size_out: int) -> NDArray[np.float64]:
    # half-pixel centres (as torch's interpolate with align_corners=False); each row is a convex
    # combination of at most two input pixels, so values stay inside the input's range
    centres = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
    centres = np.clip(centres, 0.0, size_in - 1.0)
    low = np.floor(centres).astype(np.int64)
    high = np.minimum(low + 1, size_in - 1)
    weight = centres - low
    out = np.zeros((size_out, size_in))
    out[np.arange(size_out), low] += 1.0 - weight
    out[np.arange(size_out), high] += weight
    return out


def reconcile_images(
    x: NDArray[np.float32],
    shape: tuple[int, ...],
    *,
    box: int | None = None,
    source: str = "public source",
) -> NDArray[np.float32]:
    """Images ``(n, C, H, W)`` reshaped to ``shape`` = ``(C', H', W')``.

    Height and width are resized bilinearly, to the whole image or (``box``) into a centred
    ``box`` x ``box`` square padded with zeros (the background of ink-on-black digits: MNIST
    draws its digits in a 20x20 box of its 28x28 images, USPS fills its 16x16 frame); one channel
    is repeated to C' channels, and C channels become one by their mean. Values stay in the
    input's range (bilinear weights are convex; padding adds zeros), so [0, 1] stays [0, 1].

    Raises:
        PartitionError: not images, or channel counts that cannot be reconciled.
    """
    if tuple(x.shape[1:]) == tuple(shape) and box is None:
        return x
    if x.ndim != 4 or len(shape) != 3:
        raise PartitionError(
            f"data.public.source: {source} has records of shape {tuple(x.shape[1:])}, the "
            f"agents' data {tuple(shape)}; only images (channels, height, width) can be resized"
        )
    channels, height, width = shape
    inner_h, inner_w = (height, width) if box is None else (box, box)
    if not (0 < inner_h <= height and 0 < inner_w <= width):
        raise PartitionError(
            f"data.public.box: {box} does not fit the agents' {height}x{width} images"
        )
    inner = np.einsum(
        "ph,nchw,qw->ncpq",
        _bilinear_matrix(x.shape[2], inner_h),
        x.astype(np.float64),
        _bilinear_matrix(x.shape[3], inner_w),
        optimize=True,
    )
    top, left = (height - inner_h) // 2, (width - inner_w) // 2
    out = np.zeros((x.shape[0], x.shape[1], height, width))
    out[:, :, top : top + inner_h, left : left + inner_w] = inner
    if out.shape[1] != channels:
        if out.shape[1] == 1:
            out = np.repeat(out, channels, axis=1)
        elif channels == 1:
            out = out.mean(axis=1, keepdims=True)
        else:
            raise PartitionError(
                f"data.public.source: {source} has {x.shape[1]} channels, the agents' data "
                f"{channels}; only 1 <-> C channels can be reconciled"
            )
    result: NDArray[np.float32] = np.ascontiguousarray(out, dtype=np.float32)
    return result


def _draw(
    labels: NDArray[np.int64], public: PublicPool, seed: int, where: str
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(pool, rest) indices into ``labels``, stratified and seeded."""
    n = labels.size
    if public.count is not None:
        if public.count > n:
            raise PartitionError(
                f"data.public.count: {public.count} records asked of {where}, which has {n}"
            )
        pool = stratified_take(labels, count=public.count, seed=seed)
        mask = np.ones(n, dtype=bool)
        mask[pool] = False
        return pool, np.flatnonzero(mask).astype(np.int64)
    fraction = float(public.fraction or 0.0)
    rest, pool = stratified_split(labels, test_fraction=fraction, seed=seed)
    if pool.size == 0:
        raise PartitionError(f"data.public.fraction: {fraction} of {where} ({n}) holds no record")
    return pool, rest


def _readable_first(
    labels: NDArray[np.int64], readable: int | None, seed: int
) -> tuple[NDArray[np.int64], int]:
    """An order of the pool with the agent-readable records first, and their number."""
    n = labels.size
    if readable is None or readable == n:
        return np.arange(n, dtype=np.int64), n
    if readable > n:
        raise PartitionError(
            f"data.public.agent_readable: {readable} exceeds the public pool's {n} records"
        )
    first = stratified_take(labels, count=readable, seed=seed)
    mask = np.ones(n, dtype=bool)
    mask[first] = False
    return np.concatenate([first, np.flatnonzero(mask)]).astype(np.int64), readable


def _pool_source(
    dataset: Dataset, public: PublicPool, data_dir: Path | str | None
) -> tuple[NDArray[np.float32], NDArray[np.int64], str]:
    """The records a pool drawn apart from the agents' training split comes from (the test
    split, or a foreign data set's train and test splits in the agents' image shape), and
    their name for messages."""
    if public.source == "test":
        if dataset.y_test.size == 0:
            raise PartitionError(f"data.public.source: {dataset.spec} has no test split")
        return dataset.x_test, dataset.y_test, "the test split"
    other = load_dataset(public.source, data_dir=data_dir)
    if other.num_classes != dataset.num_classes:
        raise PartitionError(
            f"data.public.source: {public.source} has {other.num_classes} classes, the "
            f"agents' data set {dataset.spec} {dataset.num_classes}"
        )
    source_x = reconcile_images(
        np.concatenate([other.x_train, other.x_test]),
        dataset.input_shape,
        box=public.box,
        source=public.source,
    )
    source_y = np.concatenate([other.y_train, other.y_test])
    return source_x, source_y, f"{public.source} (train and test splits)"


def split_job_data(
    dataset: Dataset,
    *,
    public: PublicPool | None,
    test: TestRule | None = None,
    scheme: PartitionScheme,
    num_agents: int,
    seed: int = 0,
    data_dir: Path | str | None = None,
) -> JobSplits:
    """Split the job's records: agents' parts, public pool, test set (see the module docstring).

    Args:
        dataset: the agents' data set.
        public: the public pool, or None.
        test: the test set's rule (None: :func:`resolve_test_rule`'s default).
        scheme, num_agents, seed: the partition, as :func:`federate` takes them.
        data_dir: where a foreign public source's files live (None: ``$DPFL_DATA_DIR``).

    Raises:
        PartitionError: a pool larger than its source, an empty test set, mismatched classes or
            shapes between domains, an impossible partition; messages name the job's field.
        DatasetError: a foreign public source that cannot be loaded.
    """
    rule = resolve_test_rule(public, test)
    if public is None:
        fed = federate(dataset, scheme=scheme, num_agents=num_agents, seed=seed)
        return JobSplits(fed, None, None, 0, dataset.x_test, dataset.y_test, rule)
    pool_seed = public.seed if public.seed is not None else seed
    if public.source == "train":
        fed = federate(
            dataset,
            scheme=scheme,
            num_agents=num_agents,
            seed=seed,
            public_fraction=public.fraction or 0.0,
            public_count=public.count,
            public_seed=pool_seed,
        )
        source_x: NDArray[np.float32] = dataset.x_train
        source_y: NDArray[np.int64] = dataset.y_train
        pool, rest = fed.public_indices, np.empty(0, dtype=np.int64)
    else:
        fed = federate(dataset, scheme=scheme, num_agents=num_agents, seed=seed)
        source_x, source_y, where = _pool_source(dataset, public, data_dir)
        pool, rest = _draw(source_y, public, public_stream_seed(pool_seed), where)
        if rule == "rest" and rest.size == 0:
            raise PartitionError(
                f"data.public: the pool takes all of {where}, nothing is left for the test set"
            )
    readable_seed = int(np.random.default_rng([pool_seed, _READABLE_STREAM]).integers(2**63))
    order, readable = _readable_first(source_y[pool], public.agent_readable, readable_seed)
    pool = pool[order]
    test_x, test_y = dataset.x_test, dataset.y_test
    if rule == "rest":
        test_x, test_y = source_x[rest], source_y[rest]
    public_x, public_y = source_x[pool], source_y[pool]
    for array in (public_x, public_y, test_x, test_y):
        array.flags.writeable = False
    return JobSplits(fed, public_x, public_y, readable, test_x, test_y, rule)
