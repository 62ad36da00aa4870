"""One running job: plan once, then rounds until the job is done, stopped or failed.

The runner resumes where the store says the job is (:func:`.state.restore`):
a round interrupted by a crash is redone as a new attempt from the plan and state its record
holds. A round that aborts is retried as a new attempt, on the same sample until an attempt
commits (:mod:`.sampling`), up to ``max_attempts`` aborts of its own; then the job fails with the
last reason. Attempts the coordinator ended (a restart, a shutdown, a stop) are redone without
counting (:func:`.state.counts_toward_abort_limit`). A round that sampled too few clients for an
algorithm that credits no client sampling is skipped (nothing was sent or charged); the others
release every sample. When no client of the population can afford another round, the job fails
saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from dpfl.learning.algorithms.base import CoordinatorState
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import parse_job
from dpfl.learning.rounds import RoundJob
from dpfl.server.errors import ConfigurationError
from dpfl.server.orchestrator.data import load_job_data
from dpfl.server.orchestrator.round import RoundReport
from dpfl.server.orchestrator.state import restore
from dpfl.server.store import JobStatus

if TYPE_CHECKING:
    from dpfl.server.orchestrator.core import Orchestrator

__all__ = ["JobRunner"]

log = logging.getLogger("dpfl.coordinator")

#: Failures that name their cause (data, noise calibration): logged without a traceback.
EXPECTED_FAILURES: tuple[type[Exception], ...] = (LearningError, ConfigurationError)


class JobRunner:
    """Drives the rounds of one job on the coordinator's event loop."""

    def __init__(self, orchestrator: Orchestrator, job_id: str) -> None:
        self.orchestrator = orchestrator
        self.store = orchestrator.store
        self.job_id = job_id
        self.reports: list[RoundReport] = []

    async def run(self) -> None:
        """Run the job to its end; marks it completed or failed (never on cancellation)."""
        store = self.store
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, EXPECTED_FAILURES):
                log.error("job %s failed: %s", self.job_id, message)
            else:
                log.exception("job %s failed: %s", self.job_id, message)
            await asyncio.to_thread(
                store.set_job_status, self.job_id, JobStatus.FAILED, error=message
            )

    async def _context(self) -> tuple[RoundJob, int, int, CoordinatorState]:
        store = self.store
        job = await asyncio.to_thread(store.get_job, self.job_id)
        spec = parse_job(job.spec)
        algorithm = self.orchestrator.algorithms(spec.algorithm)
        members = await asyncio.to_thread(store.job_members, self.job_id)
        job_data = await asyncio.to_thread(
            load_job_data, spec, population=len(members), access=self.orchestrator.access
        )
        self.orchestrator.set_public_data(self.job_id, job_data.public)
        restored = await asyncio.to_thread(restore, store, self.job_id, algorithm)
        if restored is not None:
            ctx = RoundJob(self.job_id, algorithm.bind(spec, restored.plan), job_data.data)
            return ctx, restored.number, restored.attempts, restored.state
        plan = await asyncio.to_thread(
            algorithm.plan, spec, population=len(members), data=job_data.data
        )
        side = algorithm.bind(spec, plan)
        state = await asyncio.to_thread(side.initial_state, job_data.data)
        if state.model is not None:
            versions = await asyncio.to_thread(store.list_model_versions, self.job_id)
            if versions:
                first = await asyncio.to_thread(store.get_model_version, self.job_id, 0)
                model = first.data
            else:
                first = await asyncio.to_thread(store.add_model_version, self.job_id, state.model)
                model = state.model
            state = replace(state, model=model, model_version=first.version)
        return RoundJob(self.job_id, side, job_data.data), 1, 0, state

    async def _run(self) -> None:
        store = self.store
        log.info("job %s starting: loading its data and planning its noise", self.job_id)
        started = time.monotonic()
        ctx, number, attempts, state = await self._context()
        log.info(
            "job %s (%s, %s) planned in %.1f s: rounds %d to %d",
            self.job_id,
            ctx.spec.name,
            ctx.spec.algorithm,
            time.monotonic() - started,
            number,
            ctx.spec.rounds,
        )
        minimum = 2 if ctx.spec.secagg.enabled else 1
        last_reason = ""
        while number <= ctx.spec.rounds:
            await self._wait_for_agents(minimum)
            report = await self.orchestrator.engine.run(ctx, number=number, state=state)
            self.reports.append(report)
            if report.completed:
                log.info("job %s round %d completed %s", self.job_id, number, dict(report.metrics))
                assert report.state is not None  # a completed round has a state
                state, number, attempts = report.state, number + 1, 0
                if report.done:
                    break
            elif report.skipped:
                log.info("job %s round %d skipped: %s", self.job_id, number, report.reason)
                number, attempts = number + 1, 0
            elif report.exhausted:
                log.error("job %s failed in round %d: %s", self.job_id, number, report.reason)
                await asyncio.to_thread(
                    store.set_job_status, self.job_id, JobStatus.FAILED, error=report.reason
                )
                return
            else:
                attempts += 1
                last_reason = report.reason
                log.warning("job %s round %d aborted: %s", self.job_id, number, report.reason)
                if attempts >= self.orchestrator.max_attempts:
                    error = f"round {number} aborted {attempts} times; last: {last_reason}"
                    log.error("job %s failed: %s", self.job_id, error)
                    await asyncio.to_thread(
                        store.set_job_status, self.job_id, JobStatus.FAILED, error=error
                    )
                    return
                await asyncio.sleep(self.orchestrator.retry_delay)
        await asyncio.to_thread(store.set_job_status, self.job_id, JobStatus.COMPLETED)
        log.info(
            "job %s completed: %d rounds in %.1f s",
            self.job_id,
            sum(1 for r in self.reports if r.completed),
            time.monotonic() - started,
        )

    async def _wait_for_agents(self, minimum: int) -> None:
        """Wait until at least ``minimum`` members of the job are connected."""
        members = set(await asyncio.to_thread(self.store.job_members, self.job_id))
        need = min(minimum, len(members))
        told = False
        while len(self.orchestrator.registry.connected() & members) < need:
            if not told:
                log.info(
                    "job %s waits for %d of its %d members to connect (%d connected)",
                    self.job_id,
                    need,
                    len(members),
                    len(self.orchestrator.registry.connected() & members),
                )
                told = True
            await asyncio.sleep(0.1)
