"""One candidate recipe run on a proxy federation, in this process, on the round driver.

The job's rounds run exactly as the coordinator runs them (:func:`dpfl.learning.rounds.run_round`:
release policy, setup, the agents' own check, the charge, decode, ``finish_round``) with the
algorithm's own agent side computing every contribution, noise included. Secure aggregation is
replaced by the sum it reveals: a recipe's accuracy depends on the released sum only, not on the
masks. Nothing here is persisted; the ledger is a no-op, since the proxy's records are public.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from dpfl.learning.algorithms.base import AgentData, CoordinatorData, CoordinatorState
from dpfl.learning.algorithms.parts.data_sizes import simulated_federation
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec
from dpfl.learning.rounds import (
    Acceptance,
    Commit,
    Invitation,
    RoundAborted,
    RoundJob,
    Summed,
    SumSetup,
    run_round,
)
from dpfl.learning.rounds.driver import NoiseStreams
from dpfl.learning.rounds.state import Commitment
from dpfl.secagg import SeededRandomSource

__all__ = ["TrialResult", "run_trial"]


@dataclass(frozen=True)
class TrialResult:
    """The candidate's last completed round: its metrics (``accuracy`` on the evaluation split
    the job's data gives the coordinator) and how long the run took."""

    accuracy: float | None
    rounds: int
    seconds: float
    metrics: Mapping[str, float] = field(default_factory=dict)


def run_trial(
    job: JobSpec,
    *,
    agents: int,
    seed: bytes,
    data: tuple[CoordinatorData, Mapping[str, AgentData]] | None = None,
    data_dir: str | None = None,
    device: str = "cpu",
) -> TrialResult:
    """Run ``job`` with ``agents`` simulated agents of its own data spec (read from
    ``data_dir``, default ``$DPFL_DATA_DIR``), or of ``data``.

    Raises:
        LearningError: the job cannot be planned or run on this data, or no round completed.
    """
    started = time.perf_counter()
    rng = SeededRandomSource(seed)
    algorithm = get_algorithm(job.algorithm).with_random_source(rng.child("trial/select"))
    coordinator_data, agent_data = (
        data if data is not None else simulated_federation(job, agents, data_dir=data_dir)
    )
    plan = algorithm.plan(job, population=len(agent_data), data=coordinator_data)
    side = algorithm.bind(job, plan)
    cohort = _Cohort(RoundJob(job.name, side, coordinator_data), agent_data, rng, device)
    state = side.initial_state(coordinator_data)
    try:
        completed, metrics = asyncio.run(cohort.rounds(state))
    except RoundAborted as exc:
        raise LearningError(f"a round aborted: {exc}") from exc
    if completed == 0:
        raise LearningError("no round completed (every sample was skipped)")
    accuracy = metrics.get("accuracy")
    return TrialResult(
        None if accuracy is None else float(accuracy),
        completed,
        time.perf_counter() - started,
        dict(metrics),
    )


@dataclass
class _Cohort:
    """Every invited agent accepts, checks the claim as a deployed agent does, and contributes;
    the contributions are summed in the ring as secure aggregation would reveal them."""

    job: RoundJob
    agent_data: Mapping[str, AgentData]
    rng: SeededRandomSource
    device: str
    state: CoordinatorState | None = None
    invitation: Invitation | None = None

    async def rounds(self, state: CoordinatorState) -> tuple[int, Mapping[str, float]]:
        side, population = self.job.coordinator, list(self.agent_data)
        completed = 0
        metrics: Mapping[str, float] = {}
        for number in range(1, side.spec.rounds + 1):
            self.state = state
            end = await run_round(
                self.job,
                number=number,
                state=state,
                population=population,
                invited=side.select(round_number=number, population=population),
                cohort=self,
                ledger=self,
                noise=self._streams(number),
            )
            if end.outcome is None:
                continue  # skipped, as the coordinator skips it
            state, metrics = end.outcome.state, end.outcome.metrics
            completed += 1
            if end.outcome.done:
                break
        return completed, metrics

    def _streams(self, number: int) -> NoiseStreams:
        return lambda purpose: self.rng.stream(f"trial/{purpose}/{number}")

    async def invite(self, invitation: Invitation) -> Acceptance:
        self.invitation = invitation
        return Acceptance(invitation.invited)

    async def set_up(self, setup: SumSetup) -> None:
        del setup

    async def commit(self, commitment: Commitment) -> None:
        del commitment  # public records: nothing to charge

    async def sum(self, setup: SumSetup, commit: Commit) -> Summed:
        invitation, state = self.invitation, self.state
        if invitation is None or state is None:
            raise RuntimeError("a trial sums after its invitation")
        task = invitation.task
        agent = self.job.coordinator.algorithm.agent(task.params)
        public = self.job.data.public_for_agents() if task.needs_public_data else None
        await commit(setup.accepted)
        total = np.zeros(setup.vector_length, dtype=np.uint64)
        for agent_id in setup.accepted:
            agent.check(
                invitation.events,
                setup.encoding,
                num_clients=len(setup.accepted),
                min_survivors=setup.min_survivors,
                honest_fraction=task.params.honest_fraction,
            )
            total = total + await asyncio.to_thread(  # uint64 wraps mod 2^64
                agent.contribution,
                self.agent_data[agent_id],
                model=state.model if task.model_version is not None else None,
                public_x=public,
                device=self.device,
                encoding=setup.encoding,
                stream=self.rng.child(f"agent/{agent_id}").stream(f"round/{invitation.number}"),
            )
        return Summed(total, setup.accepted)
