"""Submitting, starting and stopping jobs: the seam between the REST API and the orchestrator.

The REST API never drives rounds itself. It validates a job document with :func:`submit_job`
(the same function ``dpfl-coordinator job submit`` uses, so both accept and refuse exactly the
same documents) and asks a :class:`JobControl` to start or stop a job; every start goes through
:func:`start_job`, which plans the job for the members it starts with before marking it
running. :class:`StoreJobControl` only changes the job's status in the store; the orchestrator
subclasses it with one that also launches and cancels the job's round loop.

Invariants: a refused document writes nothing (``parse_job`` runs before any transaction, and so
do the check that every file it names lies under the coordinator's data roots and the plan of
its start: a job whose noise cannot be calibrated is refused at submission, not at start); a
refused start writes only its reason (``Job.error``), never the members or a status; status
changes follow the store's life cycle (``dpfl.server.store.directory.JOB_TRANSITIONS``), so
starting a completed job is an ``InvalidTransition`` (HTTP 409) and repeating a start or a stop is
a no-op that returns the job unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio.to_thread

from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, JobSpecError, parse_job
from dpfl.server.data_access import DataAccess
from dpfl.server.documents import load_job_document
from dpfl.server.errors import CannotStart, ConfigurationError, InvalidTransition
from dpfl.server.store import AgentStatus, Job, JobStatus, Store
from dpfl.server.store.directory import JOB_TRANSITIONS

if TYPE_CHECKING:  # the algorithms (torch) are imported only when a job is planned
    from dpfl.learning.algorithms.base import Algorithm

__all__ = [
    "NOMINAL_POPULATION",
    "JobControl",
    "StoreJobControl",
    "plan_problem",
    "start_job",
    "submit_job",
]

#: The population a job is planned for at submission when no agent is active yet: the size the
#: benchmarks and examples run at (10 to 1000 agents), large enough that a sampling rate of 0.01
#: expects a participant.
NOMINAL_POPULATION = 100


def submit_job(
    store: Store,
    document: str | bytes | Mapping[str, object],
    *,
    job_id: str | None = None,
    members: Iterable[str] = (),
    access: DataAccess | None = None,
    start: bool = False,
) -> Job:
    """Validate a job document and store it as pending (blocking: call it from a thread).

    Args:
        store: the coordinator's store.
        document: YAML or JSON text (bytes are UTF-8), or an already-parsed mapping.
        job_id: a chosen id (default: a fresh ``job-…`` id).
        members: the job's population, if already known.
        access: the coordinator's data dir and data roots (default: ``$DPFL_DATA_DIR`` and
            ``$DPFL_DATA_ROOTS``); a file the job names must lie under them.
        start: store it running instead, in the same transaction, as :func:`start_job` would.

    Returns:
        The stored job, with every default of its specification filled in.

    A job whose ``recipe`` asks for a search gets its recipe chosen first, on its population
    (else :data:`NOMINAL_POPULATION`), and is stored with the choice (docs/utility.md#recipes).
    The job is planned at once as its start plans it (:func:`plan_problem`), on its members,
    else the agents active now (who become its members at start), else (without ``start``)
    :data:`NOMINAL_POPULATION`; it is planned again for its members when it starts.

    Raises:
        JobSpecError: the document is not a valid job (too large or too deeply nested, see
            :mod:`dpfl.server.documents`; syntax, unknown algorithm or field, a bad value, a
            file outside the data roots), one ``path: problem`` entry per mistake, or it cannot
            run (its data cannot be split for the population, its noise cannot be calibrated);
            nothing is written.
        CannotStart: with ``start``, as :func:`start_job`; nothing is written.
        NotFound: a member agent does not exist.
        AlreadyExists: ``job_id`` is taken.
    """
    spec = parse_job(load_job_document(document))
    access = DataAccess.from_environment() if access is None else access
    refused = access.problems(spec)
    if refused:
        raise JobSpecError(refused)
    members = sorted(set(members))
    for agent_id in members:
        store.get_agent(agent_id)
    population, why = _population(store, members)
    spec = _chosen_recipe(spec, population=len(population) or NOMINAL_POPULATION, access=access)
    if start:
        _check_startable(spec, spec.name, population, why, access)
        return store.create_job(spec, job_id=job_id, members=population, running=True)
    if not population:
        why = "a nominal population: no agent is active yet"
    size = len(population) or NOMINAL_POPULATION
    problem = plan_problem(spec, population=size, access=access)
    if problem is not None:
        raise JobSpecError([f"the job cannot run on {size} agents ({why}): {problem}"])
    return store.create_job(spec, job_id=job_id, members=members)


def start_job(
    store: Store,
    job_id: str,
    *,
    access: DataAccess | None = None,
    algorithms: Callable[[str], Algorithm] | None = None,
) -> Job:
    """Start a pending or stopped job once it is planned (:func:`plan_problem`, ``algorithms``
    resolving its tag as the runner does) for its members, else every agent active now (who
    become its members). A job that cannot run on them is refused before it is marked running:
    only the reason is written, as the job's ``error`` (``job list`` shows it).

    Raises:
        CannotStart: no agent to run it, or its data cannot be split or its noise calibrated
            for them; one line naming the population, the problem and what to do.
        NotFound, InvalidTransition: no such job; a completed or failed one.
    """
    job = store.get_job(job_id)
    if job.status == JobStatus.RUNNING:
        return job
    if JobStatus.RUNNING not in JOB_TRANSITIONS[job.status]:
        raise InvalidTransition(f"job {job_id!r} cannot go from {job.status.value} to running")
    members, why = _population(store, store.job_members(job_id))
    access = DataAccess.from_environment() if access is None else access
    try:
        _check_startable(parse_job(job.spec), job_id, members, why, access, algorithms)
    except CannotStart as exc:
        store.refuse_job_start(job_id, str(exc))
        raise
    return store.start_job(job_id, members=members)


def _chosen_recipe(spec: JobSpec, *, population: int, access: DataAccess) -> JobSpec:
    """The job with its recipe chosen on its proxy when it asks for a search that has not run
    (docs/utility.md#recipes; blocking, minutes: every candidate is a simulated run).

    Raises:
        JobSpecError: the search cannot run (no candidate ran on the proxy, each named).
    """
    if not spec.recipe.search or spec.recipe.chosen is not None:
        return spec
    from dpfl.learning.recipes import search_recipe

    data_dir = str(access.data_dir) if access.data_dir else None
    try:
        return search_recipe(spec, agents=population, data_dir=data_dir)
    except LearningError as exc:
        raise JobSpecError([f"recipe: {exc}"]) from None


def _population(store: Store, members: list[str]) -> tuple[list[str], str]:
    """The members when there are any, else the agents active now, and which it is."""
    if members:
        return members, "its members"
    return [a.id for a in store.list_agents(status=AgentStatus.ACTIVE)], "the agents active now"


def _check_startable(
    spec: JobSpec,
    job: str,
    members: Sequence[str],
    why: str,
    access: DataAccess,
    algorithms: Callable[[str], Algorithm] | None = None,
) -> None:
    """Raises: CannotStart, naming ``job`` (its id or name), the population and what to do."""
    if not members:
        raise CannotStart(
            f"job {job!r} cannot start: no agent is active to run it: run the agents "
            "(dpfl-agent run, each with its enrolment token) and start the job again"
        )
    problem = plan_problem(spec, population=len(members), access=access, algorithms=algorithms)
    if problem is not None:
        raise CannotStart(
            f"job {job!r} cannot start on {len(members)} agents ({why}): {problem}: enrol more "
            "agents (dpfl-coordinator enroll-token, dpfl-agent run) or change the job to fit them"
        )


def plan_problem(
    spec: JobSpec,
    *,
    population: int,
    access: DataAccess | None,
    algorithms: Callable[[str], Algorithm] | None = None,
) -> str | None:
    """Why the job cannot run on ``population`` agents, or None: its data is loaded and split
    on the coordinator (under ``access``) and its noise calibrated (``Algorithm.plan`` of
    ``algorithms``, default the registry's) exactly as its runner does (blocking; seconds, up
    to about a minute for the largest DP-FedSGD jobs)."""
    from dpfl.learning.algorithms.registry import get_algorithm
    from dpfl.server.orchestrator.data import load_job_data

    resolve = get_algorithm if algorithms is None else algorithms
    try:
        data = load_job_data(spec, population=population, access=access).data
        resolve(spec.algorithm).plan(spec, population=population, data=data)
    except (LearningError, ConfigurationError, ArithmeticError, ValueError) as exc:
        return str(exc)
    return None


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
    """A :class:`JobControl` that only records the status change in the store (a start after
    :func:`start_job`'s planning, under ``access``: the coordinator's data dir and roots).

    Enough for an API without an orchestrator (tests, a read-mostly dashboard deployment); the
    orchestrator subclasses it and schedules or cancels the round loop after calling ``super()``.
    """

    def __init__(
        self,
        store: Store,
        *,
        access: DataAccess | None = None,
        algorithms: Callable[[str], Algorithm] | None = None,
    ) -> None:
        self.store = store
        self.access = access
        self.algorithms = algorithms

    async def start(self, job_id: str) -> Job:
        start = functools.partial(
            start_job, self.store, job_id, access=self.access, algorithms=self.algorithms
        )
        return await anyio.to_thread.run_sync(start)

    async def stop(self, job_id: str) -> Job:
        return await anyio.to_thread.run_sync(self._set, job_id, JobStatus.STOPPED)

    def _set(self, job_id: str, status: JobStatus) -> Job:
        return self.store.set_job_status(job_id, status)
