"""The orchestrator: one :class:`~dpfl.server.orchestrator.runner.JobRunner` task per running
job, and the :class:`~dpfl.server.jobs_control.JobControl` the REST API starts and stops jobs
through.

Life cycle: :meth:`Orchestrator.resume` (at coordinator start, after the store's
``abort_interrupted_rounds``) relaunches every job the store says is running. Starting a job
plans it for its population first (:func:`dpfl.server.jobs_control.start_job`: a job whose
population is empty gets every active agent, and one that cannot run on them is refused).
Stopping a job cancels its runner and aborts its unfinished round ("job stopped": a committed
round keeps its charge). :meth:`close` stops every runner the same way but leaves the jobs
running in the store, so that the next coordinator resumes them; :meth:`crash` (tests only)
cancels the runners without writing anything. None of these aborts counts toward a round's
abort limit (:mod:`.state`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from dpfl.learning.algorithms.base import Algorithm
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.server.data_access import DataAccess
from dpfl.server.errors import InvalidTransition
from dpfl.server.jobs_control import StoreJobControl
from dpfl.server.orchestrator.hooks import NO_HOOKS, FaultHooks
from dpfl.server.orchestrator.round import RoundEngine
from dpfl.server.orchestrator.runner import JobRunner
from dpfl.server.orchestrator.state import COORDINATOR_SHUT_DOWN, halt_reason
from dpfl.server.sessions import SessionRegistry
from dpfl.server.settings import Settings, StageDeadlines
from dpfl.server.store import Job, JobStatus, Store

__all__ = ["MODEL_CACHE_ENTRIES", "Orchestrator"]

#: Model versions kept in memory for downloads (the current one of each running job, mostly).
MODEL_CACHE_ENTRIES = 16


class Orchestrator(StoreJobControl):
    """Runs every running job's rounds on the event loop.

    Args:
        store: the coordinator's store.
        settings: deadlines, data folder, data-dependent budgets.
        registry: the connected agents' sessions.
        hooks: fault-injection points (tests only; the default does nothing).
        metrics: ``dpfl.server.metrics.Metrics`` or None.
        enforce_budgets: False only for tests of the agents' own budget check.
        max_attempts: aborts of its own per round number before the job fails (a restart,
            a shutdown or a stop does not count).
        retry_delay: seconds between two attempts.
        deadlines: stage deadlines (default: the settings').
        algorithms: resolves a job's algorithm tag (benchmarks inject their own).
    """

    def __init__(
        self,
        *,
        store: Store,
        settings: Settings,
        registry: SessionRegistry,
        hooks: FaultHooks = NO_HOOKS,
        metrics: Any = None,
        enforce_budgets: bool = True,
        max_attempts: int = 3,
        retry_delay: float = 0.5,
        deadlines: StageDeadlines | None = None,
        algorithms: Callable[[str], Algorithm] = get_algorithm,
    ) -> None:
        access = DataAccess.from_settings(settings)
        super().__init__(store, access=access, algorithms=algorithms)
        self.engine = RoundEngine(
            store=store,
            registry=registry,
            deadlines=deadlines or settings.stage_deadlines,
            hooks=hooks,
            metrics=metrics,
            enforce_budgets=enforce_budgets,
            data_dependent_budget=settings.budget_data_dependent,
        )
        self.algorithms: Callable[[str], Algorithm] = algorithms
        self.registry = registry
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: jobs being halted: never relaunched meanwhile (the store still says "running")
        self._halting: set[str] = set()
        self._runners: dict[str, JobRunner] = {}
        self._public: dict[str, bytes | None] = {}
        # model versions served to downloads (immutable; downloads run in worker threads)
        self._models: collections.OrderedDict[tuple[str, int], bytes] = collections.OrderedDict()
        self._models_lock = threading.Lock()

    # -- JobControl ------------------------------------------------------------------------------

    async def start(self, job_id: str) -> Job:
        job = await super().start(job_id)
        if job.status == JobStatus.RUNNING:
            self._launch(job_id)
        return job

    async def stop(self, job_id: str) -> Job:
        self._halting.add(job_id)
        try:
            await self._halt(job_id, halt_reason(JobStatus.STOPPED))
            return await super().stop(job_id)
        finally:
            self._halting.discard(job_id)

    # -- life cycle ------------------------------------------------------------------------------

    async def resume(self) -> list[str]:
        """Relaunch every running job (call after ``abort_interrupted_rounds``)."""
        jobs = await asyncio.to_thread(self.store.list_jobs, status=JobStatus.RUNNING)
        for job in jobs:
            self._launch(job.id)
        return [j.id for j in jobs]

    async def watch(self, *, interval: float = 2.0) -> None:
        """Follow the jobs' status in the store (changed by ``dpfl-coordinator job start/stop``
        in another process): launch running jobs without a runner, halt runners whose job is
        no longer running. Runs until cancelled."""
        while True:
            await asyncio.sleep(interval)
            jobs = await asyncio.to_thread(self.store.list_jobs)
            for job in jobs:
                if job.status == JobStatus.RUNNING and job.id not in self._tasks:
                    self._launch(job.id)
                elif job.status != JobStatus.RUNNING and job.id in self._tasks:
                    await self._halt(job.id, halt_reason(job.status))

    async def close(self, reason: str = COORDINATOR_SHUT_DOWN) -> None:
        """Stop every runner, aborting its unfinished round; the jobs stay running."""
        for job_id in list(self._tasks):
            await self._halt(job_id, reason)

    async def crash(self) -> None:
        """Cancel every runner without writing anything (tests: a coordinator crash)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def wait(self, job_id: str) -> Job:
        """Wait for a job's runner to end; returns the job as stored."""
        task = self._tasks.get(job_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        return await asyncio.to_thread(self.store.get_job, job_id)

    def runner(self, job_id: str) -> JobRunner | None:
        return self._runners.get(job_id)

    def running(self) -> list[str]:
        return list(self._tasks)

    # -- blobs -----------------------------------------------------------------------------------

    def set_public_data(self, job_id: str, blob: bytes | None) -> None:
        self._public[job_id] = blob

    def public_data(self, job_id: str) -> bytes | None:
        return self._public.get(job_id)

    def cached_model(self, job_id: str, version: int) -> bytes | None:
        with self._models_lock:
            data = self._models.get((job_id, version))
            if data is not None:
                self._models.move_to_end((job_id, version))
            return data

    def cache_model(self, job_id: str, version: int, data: bytes) -> None:
        with self._models_lock:
            self._models[(job_id, version)] = data
            self._models.move_to_end((job_id, version))
            while len(self._models) > MODEL_CACHE_ENTRIES:
                self._models.popitem(last=False)

    # -- internals -------------------------------------------------------------------------------

    def _launch(self, job_id: str) -> None:
        if job_id in self._tasks or job_id in self._halting:
            return
        runner = JobRunner(self, job_id)
        task = asyncio.get_running_loop().create_task(runner.run(), name=f"dpfl-job-{job_id}")
        self._tasks[job_id] = task
        self._runners[job_id] = runner

        def done(t: asyncio.Task[None], job_id: str = job_id) -> None:
            if self._tasks.get(job_id) is t:
                del self._tasks[job_id]

        task.add_done_callback(done)

    async def _halt(self, job_id: str, reason: str) -> None:
        task = self._tasks.pop(job_id, None)
        if task is None:
            return
        owned = job_id not in self._halting
        self._halting.add(job_id)
        try:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            for rnd in await asyncio.to_thread(self.store.interrupted_rounds, job_id=job_id):
                # a store call of the cancelled task still runs in its thread and may finish the
                # round after the listing: a completed round is done, not interrupted
                with contextlib.suppress(InvalidTransition):
                    await asyncio.to_thread(self.store.abort_round, rnd.id, reason=reason)
        finally:
            if owned:
                self._halting.discard(job_id)
