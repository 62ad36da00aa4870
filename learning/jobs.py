"""Job specifications: one pydantic model per algorithm, parsed from YAML or JSON.

The ``algorithm`` tag selects the variant (a discriminated union over the registry). Every model
refuses unknown fields and has a default that runs; a parsed :class:`JobSpec` is frozen and fully
validated, noise is either given or derived from ``privacy.target_epsilon``, and every problem is
reported as ``path.to.field: what is wrong`` in a :class:`JobSpecError`.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import ErrorDetails

from dpfl.learning.errors import LearningError

if TYPE_CHECKING:
    from dpfl.learning.data.public import JobSplits, PublicPool

__all__ = [
    "ALTERNATIVE_FIELDS",
    "FIELD_RANGES",
    "RECIPE_FIELDS",
    "DataSpec",
    "FieldRange",
    "JobSpec",
    "JobSpecError",
    "ModelUpdateJob",
    "NumericField",
    "PrivacySpec",
    "PublicSpec",
    "RecipeChoice",
    "RecipeSpec",
    "RecipeTrial",
    "SecAggSpec",
    "Strict",
    "StudentSpec",
    "VotingJob",
    "VotingParams",
    "describe_error",
    "job_json_schema",
    "job_spec_union",
    "job_to_dict",
    "load_job",
    "numeric_fields",
    "parse_job",
]

_BUILTIN_DATASETS = ("digits", "mnist", "fashion-mnist", "usps")


class JobSpecError(LearningError, ValueError):
    """A job document that cannot run; ``problems`` holds one ``path: message`` line each."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid job specification: " + "; ".join(self.problems))


@dataclass(frozen=True, slots=True)
class FieldRange:
    """The closed interval ``[low, high]`` a numeric field must also lie in (None: no bound
    beyond the field's own constraint)."""

    low: float | None
    high: float | None


_SEED = FieldRange(0, 2**32 - 1)  # what every seeded generator (numpy's legacy ones too) takes
_RECORDS = FieldRange(None, 10**8)  # records of one data set: more than any host holds
_RATE = FieldRange(1e-6, None)  # a sampling rate: q·N ≥ 1 needs N ≤ 10**6 agents
_SCALE = FieldRange(1e-6, 1e6)  # a norm or radius in the data's units
_STEP = FieldRange(None, 100.0)  # a learning rate: larger ones diverge at the first step
_PASSES = FieldRange(None, 10_000)  # passes or steps of local work per round
_WIDTH = FieldRange(None, 65_536)  # a layer or feature width (weights d × width in memory)

#: The ranges of a job document's numeric fields beyond their own constraints, by field name (a
#: name means the same wherever it appears, so the algorithms' ``params`` are bounded here too).
#: Every numeric field of every registered algorithm has a finite range (its own constraint
#: meeting this one; tests/unit/learning/test_job_ranges.py holds them to it), which a job on
#: real hardware can use: the table in docs/api.md#job-document-ranges says why each.
FIELD_RANGES: Mapping[str, FieldRange] = MappingProxyType(
    {
        # the job
        "rounds": FieldRange(1, 100_000),
        "seed": _SEED,
        # data
        "classes_per_agent": FieldRange(1, 1000),
        "alpha": FieldRange(1e-3, 1e3),
        "count": _RECORDS,
        "agent_readable": _RECORDS,
        "box": FieldRange(1, 4096),
        # privacy
        "delta": FieldRange(1e-30, None),
        "target_epsilon": FieldRange(1e-3, 1e3),
        "noise_multiplier": FieldRange(0.01, 1e5),
        "sigma": FieldRange(0.01, 1e5),
        "honest_fraction": FieldRange(0.01, None),
        # params: local work
        "clip": _SCALE,
        "input_clip": _SCALE,
        "radius": _SCALE,
        "teacher_max_grad_norm": _SCALE,
        "regularization": _SCALE,
        "norm": _SCALE,
        "huber_h": FieldRange(1e-6, 10.0),
        "count_noise": FieldRange(None, 1e6),
        "sampling_rate": _RATE,
        "batch_sampling_rate": _RATE,
        "client_sampling_rate": _RATE,
        "local_steps": _PASSES,
        "local_epochs": FieldRange(None, 1000),
        "epochs": _PASSES,
        "teacher_epochs": _PASSES,
        "student_epochs": _PASSES,
        "teacher_patience": _PASSES,
        "iterations": _PASSES,
        "batch_size": FieldRange(None, 100_000),
        "expected_batch_size": FieldRange(None, 100_000),
        "min_local_size": _RECORDS,
        "max_local_size": _RECORDS,
        "samples": FieldRange(None, 10**7),
        "learning_rate": _STEP,
        "server_learning_rate": _STEP,
        "teacher_learning_rate": _STEP,
        "student_learning_rate": _STEP,
        "epsilon": FieldRange(1e-12, 10.0),
        "sigma_ls": FieldRange(None, 1000.0),
        "unlabeled_weight": FieldRange(None, 1000.0),
        "vat_epsilon": FieldRange(None, 100.0),
        # params: shapes
        "projection_dim": _WIDTH,
        "projection_seed": _SEED,
        "centroids": _WIDTH,
        "dim": _WIDTH,
        "patch": FieldRange(None, 64),
        "stride": FieldRange(None, 64),
        "queries": FieldRange(None, 1_000_000),
        "k": FieldRange(None, 100_000),
        # recipe: the search's simulated population, a trial's run time
        "agents": FieldRange(None, 100_000),
        "seconds": FieldRange(None, 1e7),
    }
)


def _leaf_types(annotation: Any, *, items: bool = False) -> list[Any]:
    """The types an annotation admits, through Optional, unions and Annotated (with ``items``,
    also the items of a tuple)."""
    out: list[Any] = []
    stack = [annotation]
    while stack:
        item = stack.pop()
        origin = typing.get_origin(item)
        if origin is Annotated:
            stack.append(typing.get_args(item)[0])
        elif origin is Union or origin is types.UnionType:
            stack.extend(typing.get_args(item))
        elif items and origin is tuple:
            stack.extend(a for a in typing.get_args(item) if a is not Ellipsis)
        else:
            out.append(item)
    return out


def _number_types(annotation: Any, *, items: bool = False) -> set[type]:
    """The int, float and bool types an annotation admits."""
    return {t for t in _leaf_types(annotation, items=items) if t in (int, float, bool)}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation admits."""
    leaves = _leaf_types(annotation)
    return [t for t in leaves if isinstance(t, type) and issubclass(t, BaseModel)]


@cache
def _is_number_field(model: type[BaseModel], name: str) -> bool:
    """Whether the field holds a number, or a tuple of numbers (never a boolean)."""
    field = model.model_fields.get(name)
    if field is None:
        return False
    kinds = _number_types(field.annotation, items=True)
    return bool(kinds & {int, float}) and bool not in kinds


def _flag_booleans(value: Any) -> Any:
    if isinstance(value, bool):
        return _BooleanNumber(value)
    if isinstance(value, list | tuple) and any(isinstance(v, bool) for v in value):
        return [_BooleanNumber(v) if isinstance(v, bool) else v for v in value]
    return value


def _out_of_range(name: str, value: Any) -> str | None:
    """``must be ... (got ...)`` when a number of field ``name`` leaves its range."""
    bounds = FIELD_RANGES.get(name)
    if bounds is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if bounds.low is not None and value < bounds.low:
        return f"must be >= {_num(bounds.low)} (got {_num(value)})"
    if bounds.high is not None and value > bounds.high:
        return f"must be <= {_num(bounds.high)} (got {_num(value)})"
    return None


class _BooleanNumber:
    """A boolean where a number is expected (:class:`Strict` puts it in place of the value): no
    number validator accepts it, and :func:`describe_error` names it."""

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "true" if self.value else "false"


class Strict(BaseModel):
    """The base of every model of a job document: unknown fields refused, frozen, finite numbers
    only; a boolean is not a number (``rounds: true`` is refused, not read as 1), and every
    number lies in its field's :data:`FIELD_RANGES` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        # pydantic reads true as 1 even where a number is expected; a before validator of each
        # field cannot do this check (discriminator fields refuse one), so the model's does
        if not isinstance(data, Mapping):
            return data
        flagged = [
            key
            for key, value in data.items()
            if isinstance(key, str)
            and _flag_booleans(value) is not value
            and _is_number_field(cls, key)
        ]
        if not flagged:
            return data
        return {k: _flag_booleans(v) if k in flagged else v for k, v in data.items()}

    @field_validator("*", mode="after")
    @classmethod
    def _in_range(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name:
            problem = _out_of_range(info.field_name, value)
            if problem is not None:
                raise ValueError(problem)
        if isinstance(value, BaseModel) and not isinstance(value, Strict):
            # a strict contract inside a job (e.g. params.adaptive_clipping): its numbers too
            for name in type(value).model_fields:
                problem = _out_of_range(name, getattr(value, name))
                if problem is not None:
                    raise ValueError(f"{info.field_name}.{name}: {problem}")
        return value


# ---------------------------------------------------------------------------------------------
# data


class IidPartition(Strict):
    """Records dealt uniformly at random to the agents."""

    scheme: Literal["iid"] = "iid"


class ShardsPartition(Strict):
    """Each agent holds records of only ``classes_per_agent`` classes (non-IID)."""

    scheme: Literal["shards"]
    classes_per_agent: int = Field(default=2, ge=1)


class DirichletPartition(Strict):
    """Class proportions per agent drawn from Dirichlet(alpha); small alpha is very skewed."""

    scheme: Literal["dirichlet"]
    alpha: float = Field(default=0.5, gt=0)


def _scheme_shorthand(value: Any) -> Any:
    return {"scheme": value} if isinstance(value, str) else value


Partition = Annotated[
    IidPartition | ShardsPartition | DirichletPartition,
    BeforeValidator(_scheme_shorthand),
    Field(discriminator="scheme"),
]


#: The label space of each built-in data set: a public pool of another data set must share it.
_LABEL_SPACES = {
    "digits": "digits",
    "mnist": "digits",
    "usps": "digits",
    "fashion-mnist": "clothing",
}
#: (train, test) records of the built-in sets whose sizes are fixed (digits' depend on options).
_KNOWN_SIZES = {"mnist": (60_000, 10_000), "fashion-mnist": (60_000, 10_000), "usps": (7291, 2007)}


def _check_dataset_name(value: str) -> str:
    if value in _BUILTIN_DATASETS:
        return value
    name, query, options = value.partition("?")
    if name in _BUILTIN_DATASETS and query and options:
        return value  # a built-in set with options (digits?test_fraction=F, mnist?holdout=F)
    kind, sep, path = value.partition(":")
    if sep and kind in ("npz", "csv") and path:
        return value
    raise ValueError(
        f"unknown dataset {value!r} (expected one of {', '.join(_BUILTIN_DATASETS)}, "
        "npz:PATH or csv:PATH)"
    )


def _bare_name(spec: str) -> str:
    return spec.split("?", 1)[0].split(":", 1)[0]


def _named_files(named: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The ``npz:``/``csv:`` files among data set specs: field path → (spec, file path)."""
    from dpfl.learning.specs import parse_spec

    out = {}
    for field, text in named.items():
        kind, sep, rest = text.partition(":")
        if not sep or kind not in ("npz", "csv"):
            continue
        try:
            path = parse_spec(text, what="data set", error=LearningError).path or rest
        except LearningError:  # the loader refuses it too; check the widest reading
            path = rest
        out[field] = (text, path)
    return out


#: The benchmark's image data sets, whose jobs get their algorithm's ``IMAGE_RECIPE``.
_IMAGE_SETS = ("mnist", "fashion-mnist", "usps")
#: Fields that answer one question: a default recipe never sets one beside the other.
ALTERNATIVE_FIELDS = {"local_epochs": ("local_steps",), "local_steps": ("local_epochs",)}


def _bare_data_set(spec: str) -> str:
    """A data set spec without its options: ``mnist``, ``npz:/silo/x.npz``."""
    return spec.split("?", 1)[0]


class PublicSpec(Strict):
    """The public pool: unlabeled records the coordinator (and, up to ``agent_readable``, the
    agents) may read; never any agent's private record (docs/architecture.md#the-jobs-data).

    ``source``: ``train`` (held out of the agents' training split before partitioning),
    ``test`` (part of the data set's test split; the test set is the rest of it) or another data
    set (e.g. ``usps`` for agents holding ``mnist``; the test set is the rest of that domain).
    Its size is ``fraction`` of the source's records or exactly ``count`` records (one of the
    two). ``agent_readable``: how many of the pool's records agents may read, the first ones of
    the pool (None: all). ``seed``: the pool's own seed (None: ``data.seed``). ``box``: another
    data set's images are resized bilinearly to the agents' image size, or into a centred
    ``box`` x ``box`` square padded with zeros (USPS into MNIST's 20x20 digit box: ``box: 20``).
    """

    source: str = "train"
    fraction: float | None = Field(default=None, gt=0, lt=1)
    count: int | None = Field(default=None, ge=1)
    agent_readable: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0)
    box: int | None = Field(default=None, ge=1)

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        if value in ("train", "test"):
            return value
        try:
            return _check_dataset_name(value)
        except ValueError as exc:
            raise ValueError(f"{exc}; or 'train' or 'test' of the agents' data set") from None

    @model_validator(mode="after")
    def _one_size(self) -> PublicSpec:
        if (self.fraction is None) == (self.count is None):
            raise ValueError("data.public: give its size as fraction or as count (exactly one)")
        if self.box is not None and self.source in ("train", "test"):
            raise ValueError(
                "data.public.box: only another data set's images are resized (source is "
                f"{self.source!r})"
            )
        if (
            self.count is not None
            and self.agent_readable is not None
            and self.agent_readable > self.count
        ):
            raise ValueError(
                f"data.public.agent_readable: {self.agent_readable} exceeds the pool's "
                f"count ({self.count})"
            )
        return self


class DataSpec(Strict):
    """Which data set, how it is split over agents, the public pool and the test set.

    ``public_fraction: F`` (older documents) is shorthand for ``public: {source: train,
    fraction: F}``; ``test``: ``split`` (the data set's own test split) or ``rest`` (the public
    source's records outside the pool); None: ``rest`` when the pool comes from the test split or
    another data set, else ``split``. ``test_fraction`` is kept for older documents and has no
    effect: the built-in sets carry their own test split (``digits?test_fraction=F`` sets
    digits').
    """

    dataset: str = "digits"
    partition: Partition = IidPartition()
    public: PublicSpec | None = None
    test: Literal["split", "rest"] | None = None
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _public_fraction_shorthand(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "public_fraction" not in data:
            return data
        out = dict(data)
        fraction = out.pop("public_fraction")
        if "public" in out:
            raise ValueError(
                "data.public_fraction: give public or public_fraction (its shorthand), not both"
            )
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValueError(f"data.public_fraction: must be a number (got {fraction!r})")
        if not 0 <= fraction < 1:
            raise ValueError(f"data.public_fraction: must be >= 0 and < 1 (got {fraction!r})")
        test_fraction = out.get("test_fraction", 0.2)
        if isinstance(test_fraction, int | float) and fraction + test_fraction >= 1:
            raise ValueError(
                "data: public_fraction + test_fraction must be < 1 (nothing left to train on)"
            )
        if fraction > 0:
            out["public"] = {"source": "train", "fraction": float(fraction)}
        return out

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        return _check_dataset_name(value)

    @model_validator(mode="after")
    def _consistent_splits(self) -> DataSpec:
        public, rule = self.public, self.test_rule
        if self.test == "rest" and (public is None or public.source == "train"):
            raise ValueError(
                "data.test: 'rest' needs a public pool drawn from the test split or another "
                "data set (the rest of the training split is the agents' private data)"
            )
        if self.test == "split" and public is not None and public.source == "test":
            raise ValueError(
                "data.test: 'split' would overlap the public pool drawn from the test split "
                "(use 'rest')"
            )
        if public is None:
            return self
        own, other = _bare_name(self.dataset), _bare_name(public.source)
        if public.source not in ("train", "test"):
            if public.source == self.dataset or (own == other and own in _BUILTIN_DATASETS):
                raise ValueError(
                    f"data.public.source: {public.source!r} is the agents' own data set; "
                    "use 'train' or 'test' to draw the pool from one of its splits"
                )
            spaces = (_LABEL_SPACES.get(own), _LABEL_SPACES.get(other))
            if None not in spaces and spaces[0] != spaces[1]:
                raise ValueError(
                    f"data.public.source: {public.source} labels {spaces[1]}, the agents' "
                    f"{self.dataset} labels {spaces[0]} (the classes must mean the same)"
                )
        if public.count is not None:
            # fixed-size built-in sets are checked here; others when the data is loaded
            foreign = public.source not in ("train", "test")
            spec = public.source if foreign else self.dataset
            sizes = _KNOWN_SIZES.get(spec)
            if sizes is not None:
                available = {"train": sizes[0], "test": sizes[1]}.get(public.source, sum(sizes))
                # the agents keep some training records; a 'rest' test set keeps some records
                keep = public.source == "train" or rule == "rest"
                if public.count > available or (keep and public.count == available):
                    what = "fewer than" if keep else "at most"
                    where = spec if foreign else f"the {public.source} split of {spec}"
                    raise ValueError(
                        f"data.public.count: {public.count} records asked of {where} "
                        f"({available} records; the pool must take {what} them)"
                    )
        return self

    def files(self) -> dict[str, tuple[str, str]]:
        """The files the section names (``npz:PATH``, ``csv:PATH``): field path → (the data set
        spec, the file path as its loader opens it). The coordinator reads them only under its
        data roots (``dpfl.server.data_access``)."""
        named = {"data.dataset": self.dataset}
        if self.public is not None and self.public.source not in ("train", "test"):
            named["data.public.source"] = self.public.source
        return _named_files(named)

    @property
    def has_public_pool(self) -> bool:
        """Whether the job has a public pool (voting algorithms need one for their queries)."""
        return self.public is not None

    @property
    def test_rule(self) -> Literal["split", "rest"]:
        """``test`` with its default filled in."""
        if self.test is not None:
            return self.test
        return "rest" if self.public is not None and self.public.source != "train" else "split"

    def public_pool(self) -> PublicPool | None:
        """The pool as :class:`dpfl.learning.data.PublicPool` (None when there is none)."""
        from dpfl.learning.data.public import PublicPool

        if self.public is None:
            return None
        p = self.public
        return PublicPool(p.source, p.fraction, p.count, p.agent_readable, p.seed, p.box)

    def split(self, *, num_agents: int, data_dir: str | None = None) -> JobSplits:
        """Load the data set and split it as every party of the job does
        (:class:`dpfl.learning.data.JobSplits`).

        Raises:
            LearningError: the data cannot be loaded or split as the section asks.
        """
        from dpfl.learning.data import load_dataset, partition_from_config, split_job_data

        return split_job_data(
            load_dataset(self.dataset, data_dir=data_dir),
            public=self.public_pool(),
            test=self.test_rule,
            scheme=partition_from_config(self.partition.model_dump()),
            num_agents=num_agents,
            seed=self.seed,
            data_dir=data_dir,
        )


# ---------------------------------------------------------------------------------------------
# privacy and secure aggregation


class PrivacySpec(Strict):
    """What is protected and how strongly.

    ``unit`` is the neighbouring relation: ``record`` (one example of any agent) or ``agent`` (an
    agent's whole data set). ``honest_fraction`` t: the noise must suffice even if a fraction
    1 − t of the participants removes its own noise (docs/algorithms.md#distributed-noise-rule).
    ``noise``: ``skellam`` integer noise is exact inside the secure-aggregation ring; a sum of
    ``gaussian`` (discrete Gaussian) noises is only close to one, so its entries are approximate.

    ``accounting`` (DP-FedSGD with ``local_steps`` > 1 under secure aggregation only):
    ``provable`` (default) charges the local-DP event that each agent's own noise proves for its
    own S-step DP-SGD run; ``sum-dominating`` is the operator's opt-in to the sum-dominating
    recipe's charge of the honest agents' summed noise, which is not a proven upper bound for S > 1
    (an agent's later gradients are taken at its private local model), so that figure is only
    shown as a labelled claim and each agent's own-share event is charged
    (docs/algorithms.md#dp-fedsgd). Every other job must leave it at ``provable``.
    """

    unit: Literal["record", "agent"] = "agent"
    delta: float = Field(default=1e-5, gt=0, lt=1)
    target_epsilon: float | None = Field(default=None, gt=0)
    noise_multiplier: float | None = Field(default=None, gt=0)
    honest_fraction: float = Field(default=1.0, gt=0, le=1)
    noise: Literal["skellam", "gaussian"] = "skellam"
    accounting: Literal["provable", "sum-dominating"] = "provable"


class SecAggSpec(Strict):
    """Secure aggregation (Bell et al. 2020) and the adversary it is sized for.

    ``threat_model`` (docs/secagg.md#threat-models): ``semi-honest`` (the server follows the
    protocol and reads everything), ``semi-malicious`` (it may also tell some neighbours of a
    client "alive" and others "dropped"; the threshold t is raised as fcp does) or ``malicious``
    (any deviation: signed keys, a graph seeded by the roster, neighbour attestations; every agent
    needs a peer certificate of the federation CA, docs/secagg.md#the-malicious-secure-variant).
    """

    enabled: bool = True
    corrupt_fraction: float = Field(default=0.05, ge=0, lt=0.5)
    dropout_fraction: float = Field(default=0.05, ge=0, lt=1)
    threat_model: Literal["semi-honest", "semi-malicious", "malicious"] = "semi-honest"
    scale_bits: int | None = Field(default=None, ge=1, le=48)

    @model_validator(mode="after")
    def _some_survive(self) -> SecAggSpec:
        if self.corrupt_fraction + self.dropout_fraction >= 1:
            raise ValueError("secagg: corrupt_fraction + dropout_fraction must be < 1")
        return self


# ---------------------------------------------------------------------------------------------
# the shared params of the voting algorithms


class StudentSpec(Strict):
    """How the coordinator trains a voting job's student on the public pool: ``supervised``
    (the answered queries only, ``student_epochs`` epochs), or semi-supervised on the whole pool
    with ``steps`` steps of ``consistency``, ``vat`` or ``self-training`` (post-processing, no
    privacy cost; docs/algorithms.md#semi-supervised-student). ``min_margin`` keeps only the
    pseudo-labels whose noisy vote margin reaches it."""

    method: Literal["supervised", "consistency", "vat", "self-training"] = "supervised"
    steps: int = Field(default=1000, ge=1, le=1_000_000)
    unlabeled_ratio: int = Field(default=3, ge=1, le=64)
    threshold: float = Field(default=0.9, gt=0, le=1)
    unlabeled_weight: float = Field(default=1.0, ge=0)
    vat_epsilon: float = Field(default=2.0, gt=0)
    self_training_rounds: int = Field(default=2, ge=1, le=20)
    augment: bool = True
    # answered queries whose noisy vote margin (top − second, over the survivors) is below this
    # stay unlabeled: a filter on the released histogram, so free (docs/algorithms.md)
    min_margin: float = Field(default=0.0, ge=0, lt=1)


class VotingParams(Strict):
    """What every voting job states: ``queries`` public examples, answered in ``rounds``
    batches, and ``sigma``, the noise std of the summed votes (None: calibrated from
    ``privacy.target_epsilon``). ``query_selection`` picks the queries from the public records
    alone (free); ``student`` says how the student learns from the answers. ``vote_share`` < 1
    lets each agent vote on at most that share of a round's queries (agent level only), and
    charges only those (docs/accounting.md#capped-votes)."""

    queries: int = Field(default=200, ge=1)
    sigma: float | None = Field(
        default=None,
        gt=0,
        description="null: calibrated to privacy.target_epsilon (or privacy.noise_multiplier)",
    )
    query_selection: Literal["random", "kmeans"] = "random"
    student: StudentSpec = StudentSpec()
    vote_share: float = Field(default=1.0, gt=0, le=1)


# ---------------------------------------------------------------------------------------------
# the recipe

#: At most this many candidates a search runs (each is a whole simulated run at submission).
MAX_CANDIDATES = 16
#: At most this many runs of each candidate a search makes (``recipe.repeats``).
MAX_REPEATS = 3
#: The job fields a recipe chooses besides ``params.*`` (docs/utility.md#recipes).
RECIPE_FIELDS = ("model", "rounds")


class RecipeTrial(Strict):
    """One candidate of a recipe search: the fields it sets, each run's accuracy on the proxy's
    validation split and their mean (``error``: why it could not run there)."""

    name: str = Field(min_length=1, max_length=64)
    overrides: dict[str, JsonValue]
    validation_accuracy: float | None = Field(default=None, ge=0, le=1)
    runs: tuple[float, ...] = Field(default=(), max_length=MAX_REPEATS)
    seconds: float = Field(default=0.0, ge=0)
    error: str | None = None

    @model_validator(mode="after")
    def _mean_of_the_runs(self) -> RecipeTrial:
        if not self.runs:
            return self
        if any(not 0 <= r <= 1 for r in self.runs):
            raise ValueError(f"recipe trial {self.name!r}: a run's accuracy outside [0, 1]")
        mean = sum(self.runs) / len(self.runs)
        if self.validation_accuracy is None or abs(mean - self.validation_accuracy) > 1e-9:
            raise ValueError(
                f"recipe trial {self.name!r}: validation_accuracy is not the mean of its runs"
            )
        return self


class RecipeChoice(Strict):
    """What a recipe search chose and the validation figures that chose it: stored with the
    job, shown by REST, ``dpfl recipe`` and the simulation's JSON."""

    proxy: str
    agents: int = Field(ge=1)
    chosen: str
    overrides: dict[str, JsonValue]
    trials: tuple[RecipeTrial, ...] = Field(min_length=1, max_length=MAX_CANDIDATES + 1)

    @model_validator(mode="after")
    def _chosen_is_a_trial(self) -> RecipeChoice:
        if self.chosen not in {t.name for t in self.trials}:
            raise ValueError(f"recipe.chosen.chosen: {self.chosen!r} names none of the trials")
        return self


class RecipeSpec(Strict):
    """How the job's recipe is chosen (docs/utility.md#recipes).

    ``search``: choose the fields the document left unset by simulating the job on ``proxy``, a
    labelled public data set other than the agents' own, of which only the training split is
    read: a stratified ``holdout`` of it is the validation split, the rest is partitioned over
    ``agents`` simulated agents (default: the job's population) as the job partitions its own.
    ``repeats``: runs of each candidate, each with its own noise and sampling; the mean of their
    validation accuracies decides. ``candidates``: the overrides to try (default: the
    algorithm's own list). ``defaults``: the recipe fields (``model``, ``rounds``, ``params.*``)
    the document left unset, recorded when it is first parsed. ``chosen``: the search's result,
    once it ran.
    """

    search: bool = False
    proxy: str | None = None
    holdout: float = Field(default=0.2, gt=0, le=0.5)
    agents: int | None = Field(default=None, ge=2)
    repeats: int = Field(default=1, ge=1, le=MAX_REPEATS)
    candidates: tuple[dict[str, JsonValue], ...] | None = Field(
        default=None, min_length=1, max_length=MAX_CANDIDATES
    )
    defaults: tuple[str, ...] | None = None
    chosen: RecipeChoice | None = None

    @field_validator("proxy")
    @classmethod
    def _proxy_is_a_data_set(cls, value: str | None) -> str | None:
        if value is None:
            return value
        checked = _check_dataset_name(value)
        if "holdout" in checked.partition("?")[2]:
            raise ValueError("give the proxy's holdout as recipe.holdout, not as a spec option")
        return checked

    def defaults_used(self) -> tuple[str, ...]:
        """The fields the document left unset that keep their default (those the chosen
        recipe does not set)."""
        overrides = {} if self.chosen is None else self.chosen.overrides
        params = overrides.get("params")
        chosen = {k for k in overrides if k != "params"}
        chosen |= {f"params.{k}" for k in params} if isinstance(params, dict) else set()
        return tuple(f for f in self.defaults or () if f not in chosen)

    def files(self) -> dict[str, tuple[str, str]]:
        """The proxy's file, as :meth:`DataSpec.files` names files."""
        return _named_files({"recipe.proxy": self.proxy} if self.proxy else {})

    @model_validator(mode="after")
    def _search_needs_a_proxy(self) -> RecipeSpec:
        if self.search and self.proxy is None:
            raise ValueError(
                "recipe.proxy: a search simulates the job on a labelled public data set; name "
                "one (e.g. proxy: mnist)"
            )
        return self


# ---------------------------------------------------------------------------------------------
# jobs

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class JobSpec(Strict):
    """What every job states; each algorithm's variant (in its module) adds its tag and
    ``params``."""

    algorithm: str
    name: str
    description: str = ""
    data: DataSpec = DataSpec()
    model: Literal["logreg", "mlp", "cnn"] = "logreg"
    rounds: int = Field(default=10, ge=1)
    privacy: PrivacySpec = PrivacySpec()
    secagg: SecAggSpec = SecAggSpec()
    seed: int = 0
    recipe: RecipeSpec = RecipeSpec()

    params: Strict

    #: The recipe a job of this algorithm on one of the benchmark's image data sets (MNIST,
    #: Fashion-MNIST, USPS) gets for the fields its document leaves unset, when it leaves the
    #: model unset or names the recipe's own (docs/utility.md#defaults-that-work); other data
    #: keep the fields' own defaults.
    IMAGE_RECIPE: ClassVar[Mapping[str, JsonValue]] = MappingProxyType({})
    #: The protected units this algorithm supports (checked against ``privacy.unit``).
    UNITS: ClassVar[tuple[str, ...]] = ("record", "agent")
    #: The ``privacy.accounting`` values this algorithm offers.
    ACCOUNTINGS: ClassVar[tuple[str, ...]] = ("provable",)

    @model_validator(mode="before")
    @classmethod
    def _default_unit(cls, data: Any) -> Any:
        # ``privacy.unit`` defaults to the last unit the algorithm supports, also when the
        # document gives some other privacy fields
        if isinstance(data, Mapping):
            privacy = data.get("privacy")
            if privacy is None:
                return {**data, "privacy": {"unit": cls.UNITS[-1]}}
            if isinstance(privacy, Mapping) and "unit" not in privacy:
                return {**data, "privacy": {**privacy, "unit": cls.UNITS[-1]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _record_defaults(cls, data: Any) -> Any:
        # which recipe fields the document leaves to defaults, as written (a stored job has
        # every default filled in, so only the first parse can tell)
        if not isinstance(data, Mapping):
            return data
        recipe, params = data.get("recipe", {}), data.get("params", {})
        if not isinstance(recipe, Mapping) or "defaults" in recipe:
            return data
        params_type = cls.model_fields["params"].annotation
        names = getattr(params_type, "model_fields", {})
        given = set(params) if isinstance(params, Mapping) else set(names)
        unset = [f for f in RECIPE_FIELDS if f not in data]
        unset += [f"params.{name}" for name in names if name not in given]
        return {**cls._image_recipe(data, unset), "recipe": {**recipe, "defaults": unset}}

    @classmethod
    def _image_recipe(cls, data: Mapping[object, object], unset: list[str]) -> dict[object, object]:
        """``data`` with :attr:`IMAGE_RECIPE` filling the fields in ``unset``, on an image
        data set of the benchmark; a field one of whose alternatives is given stays unset."""
        recipe, out = cls.IMAGE_RECIPE, dict(data)
        section = data.get("data")
        dataset = section.get("dataset") if isinstance(section, Mapping) else None
        model = data.get("model", recipe.get("model"))
        if not recipe or not isinstance(dataset, str) or _bare_name(dataset) not in _IMAGE_SETS:
            return out
        if model != recipe.get("model"):
            return out
        for field in RECIPE_FIELDS:
            if field in recipe and field in unset:
                out[field] = recipe[field]
        given = data.get("params", {})
        if not isinstance(given, Mapping):
            return out  # refused by validation, naming params
        params, defaults = dict(given), recipe.get("params")
        for name, value in defaults.items() if isinstance(defaults, Mapping) else ():
            if f"params.{name}" in unset and not any(
                a in params for a in ALTERNATIVE_FIELDS.get(name, ())
            ):
                params[name] = value
        out["params"] = params
        return out

    @model_validator(mode="after")
    def _proxy_is_not_private(self) -> JobSpec:
        proxy = self.recipe.proxy
        if proxy is not None and _bare_data_set(proxy) == _bare_data_set(self.data.dataset):
            raise ValueError(
                f"recipe.proxy: {proxy!r} is the agents' own data set; its training records "
                "are their private data (name a public data set of the same task)"
            )
        return self

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                "must be 1-64 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _supported_unit(self) -> JobSpec:
        if self.privacy.unit not in self.UNITS:
            raise ValueError(
                f"privacy.unit: {self.algorithm} protects {' or '.join(self.UNITS)}, "
                f"not {self.privacy.unit!r}"
            )
        return self

    @model_validator(mode="after")
    def _accounting_applies(self) -> JobSpec:
        if self.privacy.accounting not in self.ACCOUNTINGS:
            offering = [
                t.tag() for t in _registered_types() if self.privacy.accounting in t.ACCOUNTINGS
            ]
            raise ValueError(
                f"privacy.accounting: {self.privacy.accounting!r} applies to "
                f"{', '.join(offering) or 'no algorithm'} only; {self.algorithm} has one "
                "accounting (leave it at 'provable')"
            )
        return self

    @classmethod
    def tag(cls) -> str:
        """The variant's ``algorithm`` tag."""
        return str(getattr(cls.model_fields["algorithm"].annotation, "__args__", ("?",))[0])

    def _require_noise(self, sigma: float | None = None, sigma_name: str = "") -> None:
        given = (self.privacy.target_epsilon, self.privacy.noise_multiplier, sigma)
        if all(value is None for value in given):
            also = f"{sigma_name} or " if sigma_name else ""
            raise ValueError(
                f"privacy: set {also}privacy.noise_multiplier, or privacy.target_epsilon "
                "to calibrate the noise"
            )


class ModelUpdateJob(JobSpec):
    @model_validator(mode="after")
    def _noise_given(self) -> ModelUpdateJob:
        self._require_noise()
        return self


class VotingJob(JobSpec):
    rounds: int = 1
    params: VotingParams

    @model_validator(mode="after")
    def _voting_needs(self) -> VotingJob:
        params = self.params
        public = self.data.public
        if public is None:
            raise ValueError(
                f"data.public: {self.algorithm} needs a public pool (e.g. public: {{source: "
                "train, fraction: 0.2}); it holds the queries the agents vote on"
            )
        if public.agent_readable is not None and (
            public.count is None or public.agent_readable < public.count
        ):
            raise ValueError(
                f"data.public.agent_readable: {self.algorithm} sends every public query to the "
                "agents, so they read the whole pool (leave agent_readable unset)"
            )
        if params.queries < self.rounds:
            raise ValueError(
                f"params.queries: must be >= rounds ({self.rounds}), every round answers a batch"
            )
        if params.vote_share < 1 and self.privacy.unit != "agent":
            raise ValueError(
                f"params.vote_share {params.vote_share:g}: capped votes need privacy.unit agent "
                f"(at unit {self.privacy.unit} one record could move which queries an agent "
                "votes on, beyond a query's sensitivity)"
            )
        self._require_noise(params.sigma, "params.sigma")
        return self


def job_spec_union() -> Any:
    """The discriminated union of the registered algorithms' job variants (its JSON schema is
    the job document's); built at run time, so it has no static type."""
    variants: Any = Union[_registered_types()]  # noqa: UP007
    return Annotated[variants, Field(discriminator="algorithm")]


def _tighten(node: JsonSchemaValue, bounds: FieldRange) -> None:
    """Narrow a number schema's bounds to ``bounds`` (keeping a tighter one of its own)."""
    if node.get("type") not in ("integer", "number"):
        return
    if bounds.low is not None:
        own = max(node.get("minimum", -math.inf), node.get("exclusiveMinimum", -math.inf))
        if bounds.low > own or (bounds.low == own and "minimum" in node):
            node.pop("exclusiveMinimum", None)
            node["minimum"] = bounds.low
    if bounds.high is not None:
        own = min(node.get("maximum", math.inf), node.get("exclusiveMaximum", math.inf))
        if bounds.high < own or (bounds.high == own and "maximum" in node):
            node.pop("exclusiveMaximum", None)
            node["maximum"] = bounds.high


def job_json_schema(*, ref_template: str = "#/$defs/{model}") -> JsonSchemaValue:
    """The JSON schema of a job document (every registered variant), with each number's
    :data:`FIELD_RANGES` entry as its ``minimum`` and ``maximum``."""
    schema: JsonSchemaValue = TypeAdapter(job_spec_union()).json_schema(ref_template=ref_template)
    for definition in schema.get("$defs", {}).values():
        for name, prop in definition.get("properties", {}).items():
            bounds = FIELD_RANGES.get(name)
            if bounds is not None:
                for node in [prop, *prop.get("anyOf", [])]:
                    _tighten(node, bounds)
    return schema


@dataclass(frozen=True, slots=True)
class NumericField:
    """One numeric field of a job document and the range it may take.

    Attributes:
        path: where it is, e.g. ``params.clip``.
        integer: an integer (else a number).
        low, high: the bounds (None: none).
        low_open, high_open: the bound itself is excluded.
        algorithms: the algorithms whose documents have it.
    """

    path: str
    integer: bool
    low: float | None
    low_open: bool
    high: float | None
    high_open: bool
    algorithms: tuple[str, ...]


def _own_bounds(field: Any) -> tuple[float | None, bool, float | None, bool]:
    low: float | None = None
    high: float | None = None
    low_open = high_open = False
    for item in field.metadata:
        for attribute, is_low, is_open in (("ge", 1, 0), ("gt", 1, 1), ("le", 0, 0), ("lt", 0, 1)):
            bound = getattr(item, attribute, None)
            if bound is None:
                continue
            if is_low and (low is None or bound > low):
                low, low_open = float(bound), bool(is_open)
            elif not is_low and (high is None or bound < high):
                high, high_open = float(bound), bool(is_open)
    return low, low_open, high, high_open


def _walk(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, type[BaseModel], str]]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, model, name
        for sub in _models_in(field.annotation):
            yield from _walk(sub, f"{path}.")


def numeric_fields() -> list[NumericField]:
    """Every numeric field of the registered job documents with its effective range (its own
    constraint and its :data:`FIELD_RANGES` entry together), sorted by path."""
    found: dict[tuple[str, bool, float | None, bool, float | None, bool], list[str]] = {}
    for variant in _registered_types():
        seen: set[tuple[str, bool, float | None, bool, float | None, bool]] = set()
        for path, model, name in _walk(variant, ""):
            field = model.model_fields[name]
            kinds = _number_types(field.annotation)
            if not kinds & {int, float} or bool in kinds:
                continue
            low, low_open, high, high_open = _own_bounds(field)
            extra = FIELD_RANGES.get(name)
            if extra is not None and extra.low is not None and (low is None or extra.low > low):
                low, low_open = float(extra.low), False
            if extra is not None and extra.high is not None and (high is None or extra.high < high):
                high, high_open = float(extra.high), False
            key = (path, float not in kinds, low, low_open, high, high_open)
            if key not in seen:
                seen.add(key)
                found.setdefault(key, []).append(variant.tag())
    return sorted(
        (NumericField(*key, algorithms=tuple(sorted(tags))) for key, tags in found.items()),
        key=lambda f: (f.path, f.algorithms),
    )


@cache
def _adapter(types: tuple[type[JobSpec], ...]) -> TypeAdapter[JobSpec]:
    del types  # the cache key: the registered variants
    adapter: TypeAdapter[JobSpec] = TypeAdapter(job_spec_union())
    return adapter


def _registered_types() -> tuple[type[JobSpec], ...]:
    from dpfl.learning.algorithms.registry import job_types

    return job_types()


@dataclass(frozen=True, slots=True)
class _Unions:
    """The discriminated unions of the job documents: their tags by discriminator name
    (``algorithm``, ``scheme``, ``kind``...) and the fields that hold one."""

    tags: dict[str, tuple[str, ...]]
    fields: frozenset[str]


@cache
def _unions(variants: tuple[type[JobSpec], ...]) -> _Unions:
    tags: dict[str, list[str]] = {"algorithm": [t.tag() for t in variants]}
    fields: set[str] = set()

    def add(discriminator: str, annotation: Any) -> None:
        found = tags.setdefault(discriminator, [])
        for member in _models_in(annotation):
            tag = member.model_fields.get(discriminator)
            for value in typing.get_args(tag.annotation) if tag is not None else ():
                if str(value) not in found:
                    found.append(str(value))

    for variant in variants:
        for _, model, name in _walk(variant, ""):
            field = model.model_fields[name]
            if isinstance(field.discriminator, str):
                add(field.discriminator, field.annotation)
                fields.add(name)
            stack = [field.annotation]
            while stack:  # a discriminated union inside Optional[...]
                item = stack.pop()
                if typing.get_origin(item) is Annotated:
                    inner, *extras = typing.get_args(item)
                    for extra in extras:
                        discriminator = getattr(extra, "discriminator", None)
                        if isinstance(discriminator, str):
                            add(discriminator, inner)
                            fields.add(name)
                    stack.append(inner)
                elif typing.get_origin(item) in (Union, types.UnionType):
                    stack.extend(typing.get_args(item))
    return _Unions({k: tuple(v) for k, v in tags.items()}, frozenset(fields))


def _algorithm_names() -> tuple[str, ...]:
    return tuple(t.tag() for t in _registered_types())


# ---------------------------------------------------------------------------------------------
# parsing and error messages


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _discriminator(error: ErrorDetails) -> str:
    return str((error.get("ctx") or {}).get("discriminator", "algorithm")).strip("'")


def describe_error(error: ErrorDetails) -> str:
    """One pydantic error as ``what is wrong`` (the job's and the contracts' messages)."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = error.get("input")
    if isinstance(got, _BooleanNumber) or (
        isinstance(got, bool) and kind in ("int_type", "float_type")  # a strict contract's
    ):
        return f"must be a number, not a boolean (got {str(got).lower()})"
    scalar = isinstance(got, int | float | str) and not isinstance(got, bool)
    shown = f" (got {got!r})" if scalar else ""
    bounds = {
        "greater_than": ">",
        "greater_than_equal": ">=",
        "less_than": "<",
        "less_than_equal": "<=",
    }
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"must be {bounds[kind]} {_num(limit)}{shown}"
    if kind == "finite_number":
        return f"must be a finite number{shown}"
    if kind == "int_parsing_size":
        return f"is too large for an integer{shown}"
    if kind == "extra_forbidden":
        return "unknown field" + _did_you_mean(tuple(error.get("loc") or ()))
    if kind == "json_invalid":
        return f"not valid JSON ({ctx['error']})"
    if kind == "model_type":
        return "must be a JSON object"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}{shown}"
    tags = _unions(_registered_types()).tags
    choices = ", ".join(tags.get(_discriminator(error), tags["algorithm"]))
    if kind == "union_tag_invalid":
        return f"unknown {_discriminator(error)} {ctx['tag']!r} (expected one of {choices})"
    if kind == "union_tag_not_found":
        return f"required field is missing (one of {choices})"
    message = str(error["msg"]).removeprefix("Value error, ")
    return message[:1].lower() + message[1:] + (shown if kind.endswith("_parsing") else "")


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    """The field names a job document accepts beside the last part of ``loc`` (pydantic's
    location, union tags included: ``('dp-fedavg', 'data', 'partition', 'shards', 'x')``);
    empty when ``loc`` does not lead through a job's models."""
    variants = {t.tag(): t for t in _registered_types()}
    if len(loc) < 2 or loc[0] not in variants:
        return []
    models: list[type[BaseModel]] = [variants[loc[0]]]
    for part in loc[1:-1]:
        if isinstance(part, int):  # an item of a list: the same models
            continue
        fields = [m.model_fields[str(part)] for m in models if str(part) in m.model_fields]
        if fields:
            models = [sub for f in fields for sub in _models_in(f.annotation)]
        else:  # the tag pydantic puts after a discriminated union's field: its member
            models = [
                m
                for m in models
                if any(
                    str(part) in map(str, typing.get_args(f.annotation))
                    for f in m.model_fields.values()
                )
            ]
        if not models:
            return []
    return sorted({name for m in models for name in m.model_fields})


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """`` (did you mean 'rounds'?)`` for a misspelt field, naming the closest known field at
    that place of the document; empty when none is close."""
    if not loc:
        return ""
    import difflib

    close = difflib.get_close_matches(str(loc[-1]), _known_fields(loc), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _path(loc: tuple[Any, ...]) -> str:
    # pydantic puts union tags into the location ('dp-fedavg', 'params', 'clip'); users wrote the
    # path without them
    unions = _unions(_registered_types())
    tags = {t for values in unions.tags.values() for t in values}
    kept = []
    for i, part in enumerate(loc):
        if part in tags and (i == 0 or loc[i - 1] in unions.fields):
            continue  # the tag pydantic adds after a discriminated union's field
        kept.append(str(part))
    return ".".join(kept)


_PATHED = re.compile(r"^[a-z_]+(\.[a-z_]+)*: ")


def _problems(exc: ValidationError) -> list[str]:
    out = []
    for error in exc.errors():
        path = _path(tuple(error["loc"]))
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            path = f"{path}.{_discriminator(error)}" if path else _discriminator(error)
        message = describe_error(error)
        head, _, last = path.rpartition(".")
        if _PATHED.match(message) and (not path or message.startswith((f"{path}.", f"{path}:"))):
            out.append(message)  # a cross-field check that names its own (deeper) path
        elif path and _PATHED.match(message) and message.startswith(f"{last}."):
            out.append(f"{head}.{message}" if head else message)  # a field's own sub-field
        else:
            out.append(f"{path}: {message}" if path else message)
    return out


def _load_text(text: str) -> Any:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise JobSpecError(
                [f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"]
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise JobSpecError([f"invalid YAML{where}: {problem}"]) from None


def parse_job(source: str | bytes | Mapping[str, object]) -> JobSpec:
    """Validate a job document.

    Args:
        source: YAML or JSON text (bytes are read as UTF-8), or an already-parsed mapping.

    Returns:
        The frozen job of the variant named by its ``algorithm``.

    Raises:
        JobSpecError: bad syntax (with line and column), a document that is not a mapping, an
            unknown algorithm, or invalid fields, one ``path: problem`` entry per mistake.
    """
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JobSpecError([f"job document is not UTF-8 text: {exc.reason}"]) from None
    data = _load_text(source) if isinstance(source, str) else source
    if not isinstance(data, Mapping):
        kind = "an empty document" if data is None else type(data).__name__
        raise JobSpecError([f"a job must be a mapping of fields, got {kind}"])
    if any(not isinstance(k, str) for k in data):
        raise JobSpecError(["field names must be strings"])
    if "algorithm" in data and not isinstance(data["algorithm"], str):
        raise JobSpecError([f"algorithm: must be one of {', '.join(_algorithm_names())}"])
    try:
        return _adapter(_registered_types()).validate_python(dict(data))
    except ValidationError as exc:
        raise JobSpecError(_problems(exc)) from None


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file (YAML or JSON); errors name the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JobSpecError([f"cannot read job file {path}: {exc}"]) from None
    try:
        return parse_job(text)
    except JobSpecError as exc:
        raise JobSpecError([f"{path}: {p}" for p in exc.problems]) from None


def job_to_dict(spec: JobSpec) -> dict[str, JsonValue]:
    """The job as a JSON-serialisable mapping with every default filled in (what the store keeps).

    ``parse_job(job_to_dict(spec)) == spec`` holds for every valid job.
    """
    data: dict[str, JsonValue] = spec.model_dump(mode="json")
    return data
