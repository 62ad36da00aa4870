"""The agent's ``--data`` spec: a silo's own data set, or agent i's share of a simulated federation.

Grammar and examples: docs/agent.md (section ``--data``). Without ``#`` the agent trains on the
data set's whole training split; with ``#`` it rebuilds the federation a simulation builds
(:func:`dpfl.learning.data.load_agent_dataset`) and keeps part ``I``, a pure function of the spec,
so simulated agents need no data transfer. ``#`` separates because data set specs already use
``?``, ``&`` and ``:`` (a path containing ``#`` cannot be used). :meth:`DataSource.__str__`
renders the canonical form, so equal sources render equally.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpfl.client.errors import DataSpecError
from dpfl.learning.algorithms.base import AgentData
from dpfl.learning.errors import LearningError

__all__ = [
    "DataSource",
    "SimulatedShare",
    "data_spec_for_job",
    "parse_data_spec",
    "simulated_data_spec",
]

_SCHEME_KEYS: dict[str, tuple[str, ...]] = {
    "iid": (),
    "shards": ("classes_per_agent",),
    "dirichlet": ("alpha", "min_samples", "max_attempts"),
}
_INT_KEYS = (
    "index",
    "agents",
    "classes_per_agent",
    "min_samples",
    "max_attempts",
    "seed",
    "public_count",
    "public_seed",
)
_ORDER = (
    "index",
    "agents",
    "partition",
    "classes_per_agent",
    "alpha",
    "min_samples",
    "max_attempts",
    "seed",
    "public_fraction",
    "public_count",
    "public_seed",
)


@dataclass(frozen=True, slots=True)
class SimulatedShare:
    """Which part of a simulated federation an agent holds.

    Attributes:
        index: this agent's part, ``0 <= index < agents``.
        agents: the number of parts.
        partition: the scheme as :func:`dpfl.learning.data.partition_from_config` takes it.
        seed: seed of the partition (and of the public split unless ``public_seed`` is given).
        public_fraction: share of the training split held out as public data.
        public_count: instead, exactly this many training records held out (None: by fraction).
        public_seed: the public split's own seed (None: ``seed``).
    """

    index: int
    agents: int
    partition: Mapping[str, Any] = field(default_factory=lambda: {"scheme": "iid"})
    seed: int = 0
    public_fraction: float = 0.0
    public_count: int | None = None
    public_seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("index", "agents", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise DataSpecError(f"{name} must be an integer, got {value!r}")
        if self.agents < 1:
            raise DataSpecError(f"agents must be >= 1, got {self.agents}")
        if not 0 <= self.index < self.agents:
            raise DataSpecError(f"index {self.index} outside [0, agents={self.agents})")
        if self.seed < 0:
            raise DataSpecError(f"seed must be >= 0, got {self.seed}")
        fraction = self.public_fraction
        if not (isinstance(fraction, int | float) and 0.0 <= float(fraction) < 1.0):
            raise DataSpecError(f"public_fraction must lie in [0, 1), got {fraction!r}")
        for name in ("public_count", "public_seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise DataSpecError(f"{name} must be an integer, got {value!r}")
        if self.public_count is not None:
            if self.public_count < 1:
                raise DataSpecError(f"public_count must be >= 1, got {self.public_count}")
            if fraction > 0:
                raise DataSpecError("give public_fraction or public_count, not both")
        if self.public_seed is not None and self.public_seed < 0:
            raise DataSpecError(f"public_seed must be >= 0, got {self.public_seed}")
        from dpfl.learning.data import partition_from_config

        try:
            partition_from_config(dict(self.partition))
        except LearningError as exc:
            raise DataSpecError(str(exc)) from None

    def fragment(self) -> str:
        """The ``SHARE`` part of the grammar, canonical."""
        values: dict[str, Any] = {
            "index": self.index,
            "agents": self.agents,
            "partition": self.partition["scheme"],
            **{k: v for k, v in self.partition.items() if k != "scheme"},
            "seed": self.seed,
            "public_fraction": float(self.public_fraction),
        }
        if self.public_count is not None:
            values["public_count"] = self.public_count
        if self.public_seed is not None:
            values["public_seed"] = self.public_seed
        return "&".join(f"{k}={_render(values[k])}" for k in _ORDER if k in values)


@dataclass(frozen=True, slots=True)
class DataSource:
    """A parsed ``--data`` spec.

    Attributes:
        dataset: the canonical data set spec (``dpfl.learning`` grammar).
        share: the simulated share, or None for a silo's own data.
    """

    dataset: str
    share: SimulatedShare | None = None

    def __str__(self) -> str:
        return self.dataset if self.share is None else f"{self.dataset}#{self.share.fragment()}"

    def load(self, *, data_dir: Path | str | None = None, given_as: str = "data_dir") -> AgentData:
        """The agent's private training data.

        Args:
            data_dir: folder of the file-based image sets (None: ``$DPFL_DATA_DIR``).
            given_as: how ``data_dir`` was given, for messages (``"--data-dir"``).

        Raises:
            DataSpecError: the data (or its folder) cannot be loaded or partitioned, naming why.
        """
        from dpfl.learning.data import load_agent_dataset, load_dataset, partition_from_config
        from dpfl.learning.data.images import FILE_DATASETS, locate_data_dir
        from dpfl.learning.data.registry import parse_dataset_spec

        try:
            name = parse_dataset_spec(self.dataset).name
            if name in FILE_DATASETS:
                data_dir = locate_data_dir(data_dir, given_as=given_as, needs=(name,)).path
            if self.share is None:
                ds = load_dataset(self.dataset, data_dir=data_dir)
            else:
                ds = load_agent_dataset(
                    self.dataset,
                    scheme=partition_from_config(dict(self.share.partition)),
                    num_agents=self.share.agents,
                    agent=self.share.index,
                    seed=self.share.seed,
                    public_fraction=self.share.public_fraction,
                    public_count=self.share.public_count,
                    public_seed=self.share.public_seed,
                    data_dir=data_dir,
                )
        except LearningError as exc:
            raise DataSpecError(f"--data {self}: {exc}") from None
        return AgentData(
            x=ds.x_train, y=ds.y_train, input_shape=ds.input_shape, num_classes=ds.num_classes
        )


def parse_data_spec(text: str) -> DataSource:
    """Parse and validate a ``--data`` spec without loading any data.

    Raises:
        DataSpecError: naming what is wrong (unknown data set, malformed or unknown key, a value
            out of range, a partition option of another scheme, a missing required key).
    """
    if not isinstance(text, str) or not text.strip():
        raise DataSpecError("empty --data spec (e.g. 'digits' or 'csv:/silo/data.csv?label=y')")
    text = text.strip()
    head, sep, fragment = text.rpartition("#")
    if not sep:
        head, fragment = text, ""
    from dpfl.learning.data import parse_dataset_spec

    try:
        dataset = str(parse_dataset_spec(head))
    except LearningError as exc:
        raise DataSpecError(f"--data {text!r}: {exc}") from None
    if not sep:
        return DataSource(dataset)
    return DataSource(dataset, _parse_share(fragment, text))


def _parse_share(fragment: str, text: str) -> SimulatedShare:
    where = f"--data {text!r}"
    if not fragment:
        raise DataSpecError(f"{where}: nothing after '#' (expected index=I&agents=N...)")
    values: dict[str, str] = {}
    for item in fragment.split("&"):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise DataSpecError(
                f"{where}: malformed item {item!r} after '#' (expected KEY=VALUE; "
                "a '#' starts the simulation options, so paths cannot contain one)"
            )
        if key not in _ORDER:
            raise DataSpecError(
                f"{where}: unknown key {key!r} after '#' (expected: {', '.join(_ORDER)})"
            )
        if key in values:
            raise DataSpecError(f"{where}: key {key!r} given twice")
        values[key] = value
    for required in ("index", "agents"):
        if required not in values:
            raise DataSpecError(f"{where}: {required}= is required after '#'")
    scheme = values.pop("partition", "iid")
    if scheme not in _SCHEME_KEYS:
        raise DataSpecError(
            f"{where}: unknown partition {scheme!r} (expected {', '.join(_SCHEME_KEYS)})"
        )
    parsed: dict[str, Any] = {key: _number(key, raw, where) for key, raw in values.items()}
    partition: dict[str, Any] = {"scheme": scheme}
    for key in ("classes_per_agent", "alpha", "min_samples", "max_attempts"):
        if key in parsed:
            if key not in _SCHEME_KEYS[scheme]:
                raise DataSpecError(f"{where}: {key}= does not apply to partition={scheme}")
            partition[key] = parsed.pop(key)
    try:
        return SimulatedShare(partition=partition, **parsed)
    except DataSpecError as exc:
        raise DataSpecError(f"{where}: {exc}") from None


def _number(key: str, raw: str, where: str) -> int | float:
    """An integer for the keys that count, else a finite number."""
    integer = key in _INT_KEYS
    try:
        number = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise DataSpecError(f"{where}: {key}={raw!r} is not {kind}") from None
    if not math.isfinite(number):
        raise DataSpecError(f"{where}: {key}={raw!r} must be finite")
    return number


def simulated_data_spec(
    dataset: str,
    *,
    index: int,
    agents: int,
    partition: Mapping[str, Any] | str = "iid",
    seed: int = 0,
    public_fraction: float = 0.0,
    public_count: int | None = None,
    public_seed: int | None = None,
) -> str:
    """The ``--data`` spec of agent ``index`` of ``agents`` in a simulated federation.

    Args:
        dataset: the data set spec, as the coordinator loads it.
        index, agents: which part, of how many.
        partition: a scheme name or a mapping as :func:`dpfl.learning.data.partition_from_config`
            takes it (e.g. ``{"scheme": "shards", "classes_per_agent": 3}``).
        seed: the job's ``data.seed``.
        public_fraction, public_count, public_seed: the part of the training split held out as
            the public pool (a pool drawn from elsewhere leaves the agents' split whole).

    Raises:
        DataSpecError: any value the grammar refuses (the result always parses back).
    """
    config = {"scheme": partition} if isinstance(partition, str) else dict(partition)
    share = SimulatedShare(
        index=index,
        agents=agents,
        partition=config,
        seed=seed,
        public_fraction=public_fraction,
        public_count=public_count,
        public_seed=public_seed,
    )
    text = str(DataSource(dataset, share))
    return str(parse_data_spec(text))


def data_spec_for_job(job_data: Any, *, index: int, agents: int) -> str:
    """:func:`simulated_data_spec` from a job's ``data`` section (``dpfl.learning.jobs.DataSpec``).

    Only a public pool drawn from the training split changes an agent's share (its records are
    held out before partitioning); a pool from the test split or another data set does not.

    Raises:
        DataSpecError: as :func:`simulated_data_spec`.
    """
    public = job_data.public
    from_train = public is not None and public.source == "train"
    return simulated_data_spec(
        job_data.dataset,
        index=index,
        agents=agents,
        partition=job_data.partition.model_dump(),
        seed=job_data.seed,
        public_fraction=(public.fraction or 0.0) if from_train else 0.0,
        public_count=public.count if from_train else None,
        public_seed=public.seed if from_train else None,
    )


def _render(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)
