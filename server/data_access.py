"""Which files a job may make the coordinator read: its data roots.

A job's data section may name a file on the coordinator's host (``npz:PATH``, ``csv:PATH``, as
``data.dataset`` or ``data.public.source``), and the coordinator reads it to split the test set
and the public pool. Whoever may submit jobs must not thereby read any file the coordinator can
(``npz:/etc/passwd``, ``csv:/proc/self/environ?label=x``), nor learn whether one exists: such a
path must lie under a **data root** (``dpfl-coordinator serve --data-root DIR``, repeatable;
``DPFL_DATA_ROOTS``) or the **data dir** (``--data-dir``, ``DPFL_DATA_DIR``, where MNIST and the
other registered sets are read from). Nothing else is allowed, and by default no root is set.

The path is resolved as the loader would open it (``~`` expanded, relative to the working
folder), then symlinks and ``..`` are resolved before it is compared with the resolved roots.
The check never asks whether the file exists: a path outside every root gets the same refusal
whether it names a file, a folder or nothing. It runs at submission
(:func:`dpfl.server.jobs_control.submit_job`) and again before the coordinator loads a job's data
(:func:`dpfl.server.orchestrator.data.load_job_data`), so a job stored before the roots changed
is held to the roots of the coordinator that runs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dpfl.learning.data.images import DATA_DIR_ENV
from dpfl.learning.jobs import JobSpec
from dpfl.server.settings import Settings, parse_data_roots

__all__ = ["DATA_ROOTS_ENV", "DataAccess"]

#: The environment variable of the data roots (``os.pathsep``-separated, or a JSON list).
DATA_ROOTS_ENV = "DPFL_DATA_ROOTS"


def _resolved(path: str | Path) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass(frozen=True, slots=True)
class DataAccess:
    """The coordinator's data dir and data roots.

    Attributes:
        data_dir: where the registered file-based sets (MNIST...) are read from; also a root.
        roots: the folders under which a job may name files.
    """

    data_dir: Path | None = None
    roots: tuple[Path, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> DataAccess:
        return cls(data_dir=settings.data_dir, roots=tuple(settings.data_roots))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> DataAccess:
        """``$DPFL_DATA_DIR`` and ``$DPFL_DATA_ROOTS`` (what a coordinator without settings
        files would use)."""
        env = os.environ if environ is None else environ
        data_dir = env.get(DATA_DIR_ENV, "").strip()
        return cls(
            data_dir=Path(data_dir) if data_dir else None,
            roots=parse_data_roots(env.get(DATA_ROOTS_ENV, "")),
        )

    def allowed(self) -> tuple[Path, ...]:
        """The resolved folders files may lie under (the roots, then the data dir)."""
        folders: Iterable[Path] = (*self.roots, *([self.data_dir] if self.data_dir else []))
        return tuple(dict.fromkeys(_resolved(f) for f in folders))

    def problems(self, spec: JobSpec) -> list[str]:
        """One ``path: problem`` line per file the job names outside every allowed folder (the
        same line whether the file exists or not)."""
        allowed = self.allowed()
        if allowed:
            why = "is outside the coordinator's data roots and its data dir"
        else:
            why = "names a file of the coordinator's host, and no data root is configured"
        how = "(dpfl-coordinator serve --data-root DIR, DPFL_DATA_ROOTS)"
        return [
            f"{field}: {text!r} {why} {how}"
            for field, (text, path) in {**spec.data.files(), **spec.recipe.files()}.items()
            if not any(_within(_resolved(path), root) for root in allowed)
        ]
