"""Many agents in one process (:class:`dpfl.client.simulation.AgentHost`, what ``dpfl simulate``
and ``dpfl demo`` run): every training runs with ONE torch intra-op thread, measured from inside
the agents' training; the host restores the thread count when it closes, and killing or closing
its agents ends them cleanly.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from support.agent_kit import JOB, ExactSum, ExactSumAgent, fedavg_round, publish
from support.scripted_coordinator import ScriptedCoordinator

from dpfl.client.simulation import AgentHost
from dpfl.client.transport import Backoff, InProcessConnector


class ThreadProbeAgent(ExactSumAgent):
    """ExactSum's agent side, recording torch's intra-op thread count where it trains."""

    def contribution(self, *args: Any, **kwargs: Any) -> npt.NDArray[np.uint64]:
        x = torch.ones(64, 64)
        (x @ x).sum()  # an operator first: torch fixes a thread's count when it first runs one
        assert isinstance(self.algorithm, ThreadProbe)
        self.algorithm.seen.append(torch.get_num_threads())
        return super().contribution(*args, **kwargs)


class ThreadProbe(ExactSum):
    """ExactSum that records torch's intra-op thread count in the thread it trains in."""

    agent_type = ThreadProbeAgent

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []


def test_hosted_agents_train_with_one_thread_and_the_count_is_restored(tmp_path: Path) -> None:
    probe = ThreadProbe()
    setup = fedavg_round(probe, population=3)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # what a 2-core machine starts with; the host must lower it

    async def main() -> None:
        coordinator = ScriptedCoordinator()
        publish(coordinator, setup)
        host = AgentHost()
        assert torch.get_num_threads() == 1
        # one training thread per core it may use: more would only take turns at the GIL
        assert host.executor._max_workers == len(os.sched_getaffinity(0))
        try:
            agents = []
            for i in range(3):
                agent_id = f"agent-{i}"
                connector = InProcessConnector(
                    connect_handler=coordinator.connect_handler,
                    download_handler=coordinator.download_handler,
                    agent_id=agent_id,
                    credential=coordinator.add_agent(agent_id),
                )
                agents.append(
                    await host.start(
                        agent_id=agent_id,
                        connector=connector,
                        data_spec=f"digits#index={i}&agents=3",
                        state_dir=tmp_path / agent_id,
                        algorithms=lambda name: probe,
                        backoff=Backoff(initial=0.05, maximum=0.2),
                    )
                )
            ids = [a.agent_id for a in agents]
            await coordinator.wait_connected(ids)
            report = await coordinator.run_round(
                job_id=JOB,
                round=1,
                agents=ids,
                algorithm=probe,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
            )
            assert report.aborted == ""
            assert probe.seen == [1, 1, 1]
            assert all(a.loop.executor is host.executor for a in agents)
            assert all(a.events for a in agents)  # the latest events are kept
            agents[0].kill()
            await asyncio.sleep(0.05)
            assert not agents[0].alive
            assert agents[1].alive
        finally:
            await host.close()
        assert not any(a.alive for a in agents)
        assert torch.get_num_threads() == 2
        await host.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            await host.start(
                agent_id="late", connector=connector, data_spec="digits", state_dir=tmp_path
            )

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        torch.set_num_threads(previous)
