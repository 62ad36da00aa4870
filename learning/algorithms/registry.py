"""The one registry of algorithms: job tags, job-spec variants and implementations.

An algorithm is a module exposing ``ALGORITHM`` (an
:class:`~dpfl.learning.algorithms.base.Algorithm` whose ``spec_type`` is its job variant), found
in the ``dpfl.learning.algorithms`` package or through the ``dpfl.algorithms`` entry-point group.
Job parsing, the agent's default policy, the CLI and :func:`get_algorithm` all read it, so a new
module is the whole registration (docs/adding-an-algorithm.md). Modules are found once per
process; :func:`refresh` forgets them. Tags are unique, and a module whose tag disagrees with its
job variant is refused.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from dpfl.learning.errors import AlgorithmError, LearningError

if TYPE_CHECKING:
    from dpfl.learning.algorithms.base import AnyAlgorithm
    from dpfl.learning.jobs import JobSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "algorithm_names",
    "algorithms",
    "get_algorithm",
    "job_types",
    "refresh",
]

#: Plugin distributions register algorithm modules under this entry-point group.
ENTRY_POINT_GROUP = "dpfl.algorithms"
_PACKAGE = "dpfl.learning.algorithms"


def _builtin_modules() -> tuple[str, ...]:
    package = importlib.import_module(_PACKAGE)
    return tuple(
        f"{_PACKAGE}.{info.name}"
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    )


def _plugin_modules() -> tuple[str, ...]:
    return tuple(
        sorted({ep.value.partition(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)})
    )


@runtime_checkable
class _Contract(Protocol):
    """What the registry reads of an algorithm and the contract's entry points, checked by name
    (the registry does not import the contract's module, which imports the job documents, which
    read the registry)."""

    name: Any
    spec_type: Any

    def plan(self, *args: Any, **kwargs: Any) -> Any: ...
    def parse_task(self, *args: Any, **kwargs: Any) -> Any: ...
    def bind(self, *args: Any, **kwargs: Any) -> Any: ...
    def agent(self, *args: Any, **kwargs: Any) -> Any: ...


def _algorithm_of(module: ModuleType) -> AnyAlgorithm | None:
    algorithm = getattr(module, "ALGORITHM", None)
    if algorithm is None:
        return None
    if not isinstance(algorithm, _Contract):
        raise LearningError(f"{module.__name__}.ALGORITHM is not an Algorithm")
    tag = algorithm.spec_type.model_fields["algorithm"].annotation
    if getattr(tag, "__args__", None) != (algorithm.name,):
        raise LearningError(
            f"{module.__name__}: the job variant {algorithm.spec_type.__name__} is not tagged "
            f"{algorithm.name!r}"
        )
    return cast("AnyAlgorithm", algorithm)


@cache
def algorithms() -> Mapping[str, AnyAlgorithm]:
    """Every registered algorithm by its job tag (sorted by tag).

    Raises:
        LearningError: two modules claim one tag, or a malformed ``ALGORITHM``.
    """
    found: dict[str, AnyAlgorithm] = {}
    for name in _builtin_modules() + _plugin_modules():
        algorithm = _algorithm_of(importlib.import_module(name))
        if algorithm is None:
            continue
        if algorithm.name in found:
            raise LearningError(f"algorithm {algorithm.name!r} is registered twice ({name})")
        found[algorithm.name] = algorithm
    return dict(sorted(found.items()))


def refresh() -> None:
    """Find the algorithms again on the next lookup (after installing a plugin)."""
    importlib.invalidate_caches()
    algorithms.cache_clear()


def algorithm_names() -> tuple[str, ...]:
    """The registered job tags, sorted."""
    return tuple(algorithms())


def job_types() -> tuple[type[JobSpec], ...]:
    """The job-spec variants of the registered algorithms (the union ``parse_job`` validates)."""
    return tuple(a.spec_type for a in algorithms().values())


def get_algorithm(name: str) -> AnyAlgorithm:
    """The algorithm whose job tag is ``name``.

    Raises:
        AlgorithmError: no such algorithm is registered.
    """
    found = algorithms().get(name)
    if found is None:
        raise AlgorithmError(f"unknown algorithm {name!r}")
    return found
