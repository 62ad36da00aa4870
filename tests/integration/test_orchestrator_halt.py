"""Halting a job never fails on a round that completes while it halts.

The job's task is cancelled, but a store call it made from a worker thread keeps running: the
round can complete between the orchestrator's listing of interrupted rounds and its abort. Seen
once as ``InvalidTransition: round 2 is completed and cannot be aborted`` when a benchmark
stopped its coordinator.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from dpfl.accounting import GaussianEvent
from dpfl.learning.jobs import parse_job
from dpfl.server.errors import InvalidTransition
from dpfl.server.orchestrator import Orchestrator
from dpfl.server.sessions import SessionRegistry
from dpfl.server.settings import Settings
from dpfl.server.store import Charge, JobStatus, ProtectedUnit, RoundStatus, open_store

SPEC = parse_job({"name": "halt", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}})


def test_a_round_completed_after_the_listing_is_left_completed(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'dpfl.db'}") as store:
        agent = store.create_agent(name="a")
        job = store.create_job(SPEC, members=[agent.id])
        store.set_job_status(job.id, JobStatus.RUNNING)
        finishing = store.start_round(job.id, 1, invited=[agent.id])
        store.commit_round(
            finishing.id, [Charge(agent.id, GaussianEvent(sigma=2.0), ProtectedUnit.AGENT)]
        )
        stalled = store.start_round(job.id, 2, invited=[agent.id])
        listed = store.interrupted_rounds(job_id=job.id)
        assert {r.id for r in listed} == {finishing.id, stalled.id}
        store.complete_round(finishing.id)  # what the cancelled task's thread still did
        with pytest.raises(InvalidTransition):
            store.abort_round(finishing.id, reason="halted")

        orchestrator = Orchestrator(
            store=store,
            settings=Settings(admin_token=secrets.token_urlsafe(32)),
            registry=SessionRegistry(),
        )
        stale = iter([listed])
        store.interrupted_rounds = lambda *, job_id=None: next(stale)  # type: ignore[method-assign]

        async def halt() -> None:
            orchestrator._tasks[job.id] = asyncio.create_task(asyncio.sleep(3600))
            await orchestrator._halt(job.id, "halted")

        asyncio.run(halt())
        assert store.get_round(finishing.id).status == RoundStatus.COMPLETED
        assert store.get_round(stalled.id).status == RoundStatus.ABORTED
