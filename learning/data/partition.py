"""Splitting a data set among simulated agents, and the public unlabeled split for voting.

A partition is a pure function of (data set, scheme, parameters, number of agents, seed): agent
``i`` of a simulation rebuilds the whole partition from the job's spec and keeps its own part, and
gets exactly the records the coordinator's simulation assigned to it, on any machine (numpy's PCG64
streams are stable across versions and platforms).

Invariants:
- a public split drawn from the TRAIN split (``public_fraction`` or ``public_count``) is a
  stratified, held-out part of it; its labels are kept only for evaluating pseudo-labels and
  never reach an agent; pools drawn from elsewhere (the test split, another data set) are built by
  :mod:`.public` and leave the training split whole;
- the agents' parts are disjoint, cover every non-public training record, and none is empty
  (a :class:`PartitionError` says why when that is impossible);
- ``shards`` gives every agent records of exactly ``classes_per_agent`` classes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from dpfl.learning.data.dataset import Dataset
from dpfl.learning.data.registry import load_dataset
from dpfl.learning.data.split import stratified_split, stratified_take
from dpfl.learning.errors import PartitionError

__all__ = [
    "DirichletPartition",
    "Federation",
    "IidPartition",
    "PartitionScheme",
    "ShardsPartition",
    "federate",
    "load_agent_dataset",
    "partition_from_config",
    "partition_indices",
    "partition_to_config",
    "public_stream_seed",
]

_PUBLIC_STREAM = 0  # seed-sequence tags: independent streams for the public split and the parts
_PARTITION_STREAM = 1


@dataclass(frozen=True, slots=True)
class IidPartition:
    """Uniformly random parts of (almost) equal size."""

    scheme: ClassVar[str] = "iid"


@dataclass(frozen=True, slots=True)
class ShardsPartition:
    """Each agent holds records of exactly ``classes_per_agent`` classes (label skew).

    Classes are placed on a random cycle and agent ``i`` takes the ``classes_per_agent`` classes
    starting at position ``i * classes_per_agent``: every class is held by ``floor`` or ``ceil`` of
    ``num_agents * classes_per_agent / num_classes`` agents, which split its records evenly.
    """

    classes_per_agent: int
    scheme: ClassVar[str] = "shards"

    def __post_init__(self) -> None:
        if isinstance(self.classes_per_agent, bool) or not isinstance(self.classes_per_agent, int):
            raise PartitionError(
                f"shards: classes_per_agent must be an integer, got {self.classes_per_agent!r}"
            )
        if self.classes_per_agent < 1:
            raise PartitionError(
                f"shards: classes_per_agent must be >= 1, got {self.classes_per_agent}"
            )


@dataclass(frozen=True, slots=True)
class DirichletPartition:
    """Per class, agents' shares drawn from Dirichlet(alpha); small alpha = strong label skew.

    A draw that leaves an agent with fewer than ``min_samples`` records is redrawn (up to
    ``max_attempts`` times, deterministically from the seed), the usual practice in the
    federated-learning literature.
    """

    alpha: float
    min_samples: int = 1
    max_attempts: int = 100
    scheme: ClassVar[str] = "dirichlet"

    def __post_init__(self) -> None:
        if not isinstance(self.alpha, int | float) or not 0 < float(self.alpha) < float("inf"):
            raise PartitionError(f"dirichlet: alpha must be a positive number, got {self.alpha!r}")
        if self.min_samples < 1 or self.max_attempts < 1:
            raise PartitionError("dirichlet: min_samples and max_attempts must be >= 1")


PartitionScheme = IidPartition | ShardsPartition | DirichletPartition


def partition_from_config(config: Mapping[str, object] | str) -> PartitionScheme:
    """Build a scheme from a job's ``partition`` mapping (or a bare scheme name).

    Examples: ``{"scheme": "iid"}``, ``{"scheme": "shards", "classes_per_agent": 3}``,
    ``{"scheme": "dirichlet", "alpha": 0.5}``, ``"iid"``.

    Raises:
        PartitionError: unknown scheme, missing or unknown keys, bad values.
    """
    items: dict[str, object] = {"scheme": config} if isinstance(config, str) else dict(config)
    scheme = items.pop("scheme", None)
    allowed: dict[str, tuple[str, ...]] = {
        "iid": (),
        "shards": ("classes_per_agent",),
        "dirichlet": ("alpha", "min_samples", "max_attempts"),
    }
    if not isinstance(scheme, str) or scheme not in allowed:
        raise PartitionError(
            f"unknown partition scheme {scheme!r} (expected iid, shards, dirichlet)"
        )
    unknown = sorted(set(items) - set(allowed[scheme]))
    if unknown:
        raise PartitionError(
            f"partition {scheme}: unknown key(s) {unknown} (allowed: {list(allowed[scheme])})"
        )
    try:
        if scheme == "iid":
            return IidPartition()
        if scheme == "shards":
            if "classes_per_agent" not in items:
                raise PartitionError("partition shards: classes_per_agent is required")
            return ShardsPartition(classes_per_agent=items["classes_per_agent"])  # type: ignore[arg-type]
        if "alpha" not in items:
            raise PartitionError("partition dirichlet: alpha is required")
        return DirichletPartition(**items)  # type: ignore[arg-type]
    except TypeError as exc:
        raise PartitionError(f"partition {scheme}: {exc}") from None


def partition_to_config(scheme: PartitionScheme) -> dict[str, object]:
    """The mapping :func:`partition_from_config` turns back into ``scheme``."""
    if isinstance(scheme, ShardsPartition):
        return {"scheme": "shards", "classes_per_agent": scheme.classes_per_agent}
    if isinstance(scheme, DirichletPartition):
        return {
            "scheme": "dirichlet",
            "alpha": scheme.alpha,
            "min_samples": scheme.min_samples,
            "max_attempts": scheme.max_attempts,
        }
    return {"scheme": "iid"}


def _iid(n: int, num_agents: int, rng: np.random.Generator) -> list[NDArray[np.int64]]:
    return [part.astype(np.int64) for part in np.array_split(rng.permutation(n), num_agents)]


def _shards(
    labels: NDArray[np.int64], num_agents: int, per_agent: int, rng: np.random.Generator
) -> list[NDArray[np.int64]]:
    classes = np.unique(labels)
    k = classes.size
    if per_agent > k:
        raise PartitionError(
            f"shards: classes_per_agent={per_agent} exceeds the {k} classes present in the data"
        )
    if num_agents * per_agent < k:
        raise PartitionError(
            f"shards: {num_agents} agents x {per_agent} classes cannot cover all {k} classes: "
            f"it needs at least {-(-k // per_agent)} agents, or classes_per_agent >= "
            f"{-(-k // num_agents)}"
        )
    cycle = rng.permutation(classes)
    held = [[cycle[(i * per_agent + j) % k] for j in range(per_agent)] for i in range(num_agents)]
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for agent, owned in enumerate(held):
        for c in owned:
            holders[int(c)].append(agent)
    parts: list[list[NDArray[np.int64]]] = [[] for _ in range(num_agents)]
    for c in classes:
        members = rng.permutation(np.flatnonzero(labels == c))
        owners = holders[int(c)]
        if members.size < len(owners):
            raise PartitionError(
                f"shards: class {int(c)} has {members.size} records for {len(owners)} agents; "
                "use fewer agents or fewer classes per agent"
            )
        for owner, piece in zip(owners, np.array_split(members, len(owners)), strict=True):
            parts[owner].append(piece)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def _dirichlet(
    labels: NDArray[np.int64], num_agents: int, scheme: DirichletPartition, rng: np.random.Generator
) -> list[NDArray[np.int64]]:
    classes = np.unique(labels)
    for _ in range(scheme.max_attempts):
        parts: list[list[NDArray[np.int64]]] = [[] for _ in range(num_agents)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_agents, float(scheme.alpha)))
            cuts = (np.cumsum(shares)[:-1] * members.size).astype(np.int64)
            for agent, piece in enumerate(np.split(members, cuts)):
                parts[agent].append(piece)
        merged = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(m.size for m in merged) >= scheme.min_samples:
            return merged
    raise PartitionError(
        f"dirichlet(alpha={scheme.alpha}): {scheme.max_attempts} draws all left an agent with "
        f"fewer than {scheme.min_samples} record(s) among {labels.size} records for {num_agents} "
        "agents; use a larger alpha, fewer agents or more data"
    )


def partition_indices(
    labels: NDArray[np.int64], *, scheme: PartitionScheme, num_agents: int, seed: int
) -> tuple[NDArray[np.int64], ...]:
    """Split record indices ``0..len(labels)-1`` among ``num_agents`` agents.

    Returns:
        One sorted index array per agent; disjoint, covering, none empty.

    Raises:
        PartitionError: too few records or an impossible scheme for this data.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise PartitionError(f"num_agents must be a positive integer, got {num_agents!r}")
    if labels.size < num_agents:
        raise PartitionError(
            f"{labels.size} records cannot give each of {num_agents} agents at least one"
        )
    rng = np.random.default_rng([seed, _PARTITION_STREAM])
    if isinstance(scheme, IidPartition):
        parts = _iid(labels.size, num_agents, rng)
    elif isinstance(scheme, ShardsPartition):
        parts = _shards(labels, num_agents, scheme.classes_per_agent, rng)
    elif isinstance(scheme, DirichletPartition):
        parts = _dirichlet(labels, num_agents, scheme, rng)
    else:
        raise PartitionError(f"unknown partition scheme {scheme!r}")
    return tuple(parts)


@dataclass(frozen=True, eq=False, slots=True)
class Federation:
    """A data set split into a public unlabeled part and one private part per agent.

    Attributes:
        dataset: the full data set.
        scheme: how private records were split.
        seed: the seed of the partition (and of the public split unless ``public_seed`` was given).
        public_fraction: share of the training split held out as public data (0 when the public
            split was given as a count, or there is none).
        public_indices: indices (into ``dataset.x_train``) of the public records.
        agent_indices: per agent, indices (into ``dataset.x_train``) of its records.
    """

    dataset: Dataset
    scheme: PartitionScheme
    seed: int
    public_fraction: float
    public_indices: NDArray[np.int64]
    agent_indices: tuple[NDArray[np.int64], ...]

    @property
    def num_agents(self) -> int:
        """Number of agents the private records were split among."""
        return len(self.agent_indices)

    def agent_sizes(self) -> tuple[int, ...]:
        """Records per agent (e.g. for weighting or for the local sampling rate)."""
        return tuple(int(p.size) for p in self.agent_indices)

    def agent_dataset(self, agent: int) -> Dataset:
        """Agent ``agent``'s private data as a :class:`Dataset` (its test split is the global one).

        Raises:
            PartitionError: ``agent`` is not in ``[0, num_agents)``.
        """
        if (
            isinstance(agent, bool)
            or not isinstance(agent, int)
            or not 0 <= agent < self.num_agents
        ):
            raise PartitionError(f"agent index {agent!r} outside [0, {self.num_agents})")
        return self.dataset.subset(
            self.agent_indices[agent], spec=f"{self.dataset.spec}#agent={agent}/{self.num_agents}"
        )

    def public_features(self) -> NDArray[np.float32]:
        """The public unlabeled records (shape ``(n_public, *input_shape)``)."""
        out = self.dataset.x_train[self.public_indices]
        out.flags.writeable = False
        return out

    def public_labels_for_evaluation(self) -> NDArray[np.int64]:
        """True labels of the public records: ONLY to score pseudo-labels, never to train."""
        out = self.dataset.y_train[self.public_indices]
        out.flags.writeable = False
        return out


def public_stream_seed(seed: int) -> int:
    """The seed of the public pool's draw for a job seed (a stream independent of the partition)."""
    return int(np.random.default_rng([seed, _PUBLIC_STREAM]).integers(2**63))


def _public_split(
    labels: NDArray[np.int64], fraction: float, count: int | None, seed: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The agents' and the public pool's indices of the training split: a stratified ``count``
    or ``fraction`` of the records drawn with ``seed`` (no pool when neither is given)."""
    if count is not None:
        if fraction > 0:
            raise PartitionError("give public_fraction or public_count, not both")
        if not 0 < count < labels.size:
            raise PartitionError(
                f"public_count={count} must lie in [1, {labels.size}) (the training "
                "split's records; some must stay with the agents)"
            )
        public = stratified_take(labels, count=count, seed=seed)
        return np.setdiff1d(np.arange(labels.size), public).astype(np.int64), public
    if fraction > 0:
        private, public = stratified_split(labels, test_fraction=fraction, seed=seed)
        if public.size == 0:
            raise PartitionError(
                f"public_fraction={fraction} of {labels.size} records holds out no record"
            )
        return private, public
    return np.arange(labels.size, dtype=np.int64), np.empty(0, dtype=np.int64)


def federate(
    dataset: Dataset,
    *,
    scheme: PartitionScheme,
    num_agents: int,
    seed: int = 0,
    public_fraction: float = 0.0,
    public_count: int | None = None,
    public_seed: int | None = None,
) -> Federation:
    """Hold out the public split, then partition the remaining training records among agents.

    Args:
        dataset: the data set (its test split is left untouched).
        scheme: :class:`IidPartition`, :class:`ShardsPartition` or :class:`DirichletPartition`.
        num_agents: number of agents.
        seed: seed of the partition, and of the public split unless ``public_seed`` is given.
        public_fraction: share of the training split held out as public unlabeled data, in [0, 1).
        public_count: instead of a fraction, exactly this many training records (stratified).
        public_seed: the public split's own seed (default: ``seed``).

    Returns:
        The :class:`Federation`, identical for identical arguments.

    Raises:
        PartitionError: bad fraction or count, or a partition that cannot give every agent a
            record.
    """
    fraction = float(public_fraction)
    if not 0.0 <= fraction < 1.0:
        raise PartitionError(f"public_fraction must lie in [0, 1), got {public_fraction!r}")
    labels = dataset.y_train
    draw = public_stream_seed(seed if public_seed is None else public_seed)
    private, public = _public_split(labels, fraction, public_count, draw)
    parts = partition_indices(labels[private], scheme=scheme, num_agents=num_agents, seed=seed)
    return Federation(
        dataset=dataset,
        scheme=scheme,
        seed=seed,
        public_fraction=fraction,
        public_indices=public,
        agent_indices=tuple(private[p] for p in parts),
    )


def load_agent_dataset(
    spec: str,
    *,
    scheme: PartitionScheme,
    num_agents: int,
    agent: int,
    seed: int = 0,
    public_fraction: float = 0.0,
    public_count: int | None = None,
    public_seed: int | None = None,
    data_dir: Path | str | None = None,
) -> Dataset:
    """Agent ``agent``'s own part of a simulated federation, rebuilt from the job's spec alone.

    Equal to ``federate(load_dataset(spec), ...).agent_dataset(agent)``: every process that calls
    it with the same arguments gets the same records, so simulated agents need no data transfer.

    Raises:
        DatasetError: the data set cannot be loaded.
        PartitionError: the partition is impossible or ``agent`` is out of range.
    """
    federation = _cached_federation(
        load_dataset(spec, data_dir=data_dir),
        scheme=scheme,
        num_agents=num_agents,
        seed=seed,
        public_fraction=public_fraction,
        public_count=public_count,
        public_seed=public_seed,
    )
    return federation.agent_dataset(agent)


#: :func:`federate`, kept per process for the last few data sets: a simulation's agents load
#: their shares every round, and the partition is a pure function of the arguments (a data set is
#: keyed by identity, and :func:`load_dataset` hands out a new one when its files change).
_cached_federation = functools.lru_cache(maxsize=4)(federate)
