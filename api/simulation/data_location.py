"""The data folder of a job run by a command (``dpfl simulate``, ``dpfl audit``) or by
``dpfl.simulate``: checked once, before anything starts, by the one rule of
:func:`dpfl.learning.data.images.locate_data_dir` (``--data-dir`` / ``data_dir=``, else
``$DPFL_DATA_DIR``; README, "Data").

A job that reads no file-based data set (``digits``, a silo's ``npz:``/``csv:`` file) needs no
data folder and is never refused for lack of one. Otherwise a missing folder is a usage error
(exit code 2) named the way the user gave it, instead of a failure of every agent halfway
through the run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from dpfl.learning.data.images import (
    DATA_DIR_ENV,
    FILE_DATASETS,
    DataFolder,
    locate_data_dir,
)
from dpfl.learning.data.registry import parse_dataset_spec
from dpfl.learning.jobs import JobSpec

__all__ = ["job_file_datasets", "locate_job_data", "using_data_dir"]


def job_file_datasets(job: JobSpec) -> tuple[str, ...]:
    """The file-based data sets (``FILE_DATASETS`` names) ``job`` reads, in order."""
    specs = [job.data.dataset]
    public = job.data.public
    if public is not None and public.source not in ("train", "test"):
        specs.append(public.source)
    names = (parse_dataset_spec(spec).name for spec in specs)
    return tuple(dict.fromkeys(n for n in names if n in FILE_DATASETS))


def locate_job_data(
    job: JobSpec, data_dir: str | Path | None, *, given_as: str
) -> DataFolder | None:
    """The data folder ``job`` reads from, or None when it reads no file-based data set.

    Raises:
        dpfl.learning.errors.DatasetError: the folder is not given, or is not there (or lacks
            a data set's folder), naming it as given (``given_as``: ``"--data-dir"``,
            ``"data_dir"``).
    """
    needs = job_file_datasets(job)
    if not needs:
        return None
    return locate_data_dir(data_dir, given_as=given_as, needs=needs)


@contextlib.contextmanager
def using_data_dir(folder: DataFolder | None) -> Iterator[None]:
    """``$DPFL_DATA_DIR`` set to ``folder`` while the job runs (its coordinator and agents in
    this process read it there), restored afterwards; nothing changes for None."""
    if folder is None:
        yield
        return
    before = os.environ.get(DATA_DIR_ENV)
    os.environ[DATA_DIR_ENV] = str(folder.path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DATA_DIR_ENV, None)
        else:
            os.environ[DATA_DIR_ENV] = before
