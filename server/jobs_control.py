"""Submitting, starting and stopping jobs: the seam between the REST API and the orchestrator.

The REST API never drives rounds itself. It validates a job document with :func:`submit_job`
(the same function ``dpfl-coordinator job submit`` uses, so both accept and refuse exactly the
same documents) and asks a :class:`JobControl` to start or stop a job. :class:`StoreJobControl`
only changes the job's status in the store; the orchestrator replaces it (or subclasses it) with
one that also launches and cancels the job's round loop.

Invariants: a refused document writes nothing (``parse_job`` runs before any transaction, and so
does the check that every file it names lies under the coordinator's data roots); status
changes follow the store's life cycle (``dpfl.server.store.directory.JOB_TRANSITIONS``), so
starting a completed job is an ``InvalidTransition`` (HTTP 409) and repeating a start or a stop is
a no-op that returns the job unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import anyio.to_thread

from dpfl.learning.jobs import JobSpecError, parse_job
from dpfl.server.data_access import DataAccess
from dpfl.server.documents import load_job_document
from dpfl.server.store import Job, JobStatus, Store

__all__ = ["JobControl", "StoreJobControl", "submit_job"]


def submit_job(
    store: Store,
    document: str | bytes | Mapping[str, Any],
    *,
    job_id: str | None = None,
    members: Iterable[str] = (),
    access: DataAccess | None = None,
) -> Job:
    """Validate a job document and store it as pending (blocking: call it from a thread).

    Args:
        store: the coordinator's store.
        document: YAML or JSON text (bytes are UTF-8), or an already-parsed mapping.
        job_id: a chosen id (default: a fresh ``job-…`` id).
        members: the job's population, if already known.
        access: the coordinator's data dir and data roots (default: ``$DPFL_DATA_DIR`` and
            ``$DPFL_DATA_ROOTS``); a file the job names must lie under them.

    Returns:
        The stored job, with every default of its specification filled in.

    Raises:
        JobSpecError: the document is not a valid job (too large or too deeply nested, see
            :mod:`dpfl.server.documents`; syntax, unknown algorithm or field, a bad value, a
            file outside the data roots), one ``path: problem`` entry per mistake; nothing is
            written.
        NotFound: a member agent does not exist.
        AlreadyExists: ``job_id`` is taken.
    """
    spec = parse_job(load_job_document(document))
    access = DataAccess.from_environment() if access is None else access
    refused = access.problems(spec)
    if refused:
        raise JobSpecError(refused)
    return store.create_job(spec, job_id=job_id, members=members)


@runtime_checkable
class JobControl(Protocol):
    """What the REST API needs to start and stop jobs.

    Both methods are coroutines because the orchestrator lives on the coordinator's event loop:
    an implementation may create or cancel tasks directly. They return the job as it stands
    afterwards and raise the store's typed errors (``NotFound``, ``InvalidTransition``).
    """

    async def start(self, job_id: str) -> Job:
        """Make the job run (pending or stopped → running); a running job is left as it is."""
        ...

    async def stop(self, job_id: str) -> Job:
        """Stop the job (pending or running → stopped); a stopped job is left as it is."""
        ...


class StoreJobControl:
    """A :class:`JobControl` that only records the status change in the store.

    Enough for an API without an orchestrator (tests, a read-mostly dashboard deployment); the
    orchestrator subclasses it and schedules or cancels the round loop after calling ``super()``.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    async def start(self, job_id: str) -> Job:
        return await anyio.to_thread.run_sync(self._set, job_id, JobStatus.RUNNING)

    async def stop(self, job_id: str) -> Job:
        return await anyio.to_thread.run_sync(self._set, job_id, JobStatus.STOPPED)

    def _set(self, job_id: str, status: JobStatus) -> Job:
        return self.store.set_job_status(job_id, status)
