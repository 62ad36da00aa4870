"""Submitting, starting and stopping jobs: the seam between the REST API and the orchestrator.

The REST API never drives rounds itself. It validates a job document with :func:`submit_job`
(the same function ``dpfl-coordinator job submit`` uses, so both accept and refuse exactly the
same documents) and asks a :class:`JobControl` to start or stop a job. :class:`StoreJobControl`
only changes the job's status in the store; the orchestrator replaces it (or subclasses it) with
one that also launches and cancels the job's round loop.

Invariants: a refused document writes nothing (``parse_job`` runs before any transaction, and so
do the check that every file it names lies under the coordinator's data roots and the plan of
its start: a job whose noise cannot be calibrated is refused at submission, not at start); status
changes follow the store's life cycle (``dpfl.server.store.directory.JOB_TRANSITIONS``), so
starting a completed job is an ``InvalidTransition`` (HTTP 409) and repeating a start or a stop is
a no-op that returns the job unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio.to_thread

from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, JobSpecError, parse_job
from dpfl.server.data_access import DataAccess
from dpfl.server.documents import load_job_document
from dpfl.server.errors import ConfigurationError
from dpfl.server.store import AgentStatus, Job, JobStatus, Store

__all__ = [
    "NOMINAL_POPULATION",
    "JobControl",
    "StoreJobControl",
    "check_runnable",
    "submit_job",
    "submit_population",
]

#: The population a job is planned for at submission when no agent is active yet: the size the
#: benchmarks and examples run at (10 to 1000 agents), large enough that a sampling rate of 0.01
#: expects a participant.
NOMINAL_POPULATION = 100


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

    The job is planned at once as its start would plan it (:func:`check_runnable`), on the
    population :func:`submit_population` says; it is planned again for its members when it
    starts.

    Raises:
        JobSpecError: the document is not a valid job (too large or too deeply nested, see
            :mod:`dpfl.server.documents`; syntax, unknown algorithm or field, a bad value, a
            file outside the data roots), one ``path: problem`` entry per mistake, or it cannot
            run (its data cannot be split for the population, its noise cannot be calibrated);
            nothing is written.
        NotFound: a member agent does not exist.
        AlreadyExists: ``job_id`` is taken.
    """
    spec = parse_job(load_job_document(document))
    access = DataAccess.from_environment() if access is None else access
    refused = access.problems(spec)
    if refused:
        raise JobSpecError(refused)
    members = list(members)
    population, why = submit_population(store, members)
    check_runnable(spec, population=population, why=why, access=access)
    return store.create_job(spec, job_id=job_id, members=members)


def submit_population(store: Store, members: Sequence[str]) -> tuple[int, str]:
    """The population a job is planned for at submission, and what it is.

    Its members when given (each must exist); else the agents active now, every one of which
    becomes a member when the job starts as things stand; else, when none is active yet,
    :data:`NOMINAL_POPULATION`.

    Raises:
        NotFound: a member agent does not exist.
    """
    if members:
        for agent_id in members:
            store.get_agent(agent_id)
        return len(set(members)), "its members"
    active = len(store.list_agents(status=AgentStatus.ACTIVE))
    if active:
        return active, "the agents active now"
    return NOMINAL_POPULATION, "a nominal population: no agent is active yet"


def check_runnable(
    spec: JobSpec, *, population: int, why: str = "", access: DataAccess | None = None
) -> None:
    """Plan the job as its start does, on ``population`` agents: load and split its data on the
    coordinator (under ``access``) and calibrate its noise (``Algorithm.plan``), so that a job
    that can never run is refused now rather than failing at start (blocking; seconds, up to
    about a minute for the largest DP-FedSGD jobs).

    Raises:
        JobSpecError: one line naming the population and why it cannot run (the data cannot be
            loaded or split for it, the noise cannot be calibrated, the plan refuses a setting).
    """
    from dpfl.learning.algorithms.registry import get_algorithm
    from dpfl.server.orchestrator.data import load_job_data

    try:
        data = load_job_data(spec, population=population, access=access).data
        get_algorithm(spec.algorithm).plan(spec, population=population, data=data)
    except (LearningError, ConfigurationError, ArithmeticError, ValueError) as exc:
        of = f"{population} agents ({why})" if why else f"{population} agents"
        raise JobSpecError([f"the job cannot run on {of}: {exc}"]) from exc


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
