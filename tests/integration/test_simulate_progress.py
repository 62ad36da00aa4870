"""The progress that ``dpfl simulate`` and ``dpfl demo`` show: every round's report reaches the
bar once, in order, the last round's included, so the bar ends at N/N with the last round's
accuracy. The reports are polled; the rounds that end after the poller's last look are handed
over when the job ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rich.console import Console
from support.coordination import small_job

from dpfl.cli.sim_report import run_with_progress
from dpfl.server.orchestrator import RoundReport
from dpfl.simulation import Simulation, SimulationResult

pytestmark = pytest.mark.slow

#: Short rounds, so several end between two looks of the poller, the last one among them.
JOB = small_job(name="progress", rounds=4, params={"local_steps": 1})


async def _run(progress: Any) -> SimulationResult:
    sim = Simulation(JOB, agents=3, transport="inproc")
    try:
        if isinstance(progress, Console):
            return await run_with_progress(sim, progress, description="rounds")
        return await sim.run(progress=progress)
    finally:
        await sim.close()


def test_every_round_report_reaches_the_callback_once_in_order() -> None:
    seen: list[RoundReport] = []
    result = asyncio.run(_run(seen.append))
    assert result.status == "completed"
    completed = [r for r in seen if r.completed]
    assert len(completed) == result.rounds_completed == 4
    assert [r.round.number for r in completed if r.round is not None] == [1, 2, 3, 4]
    assert len({id(r) for r in seen}) == len(seen)  # none twice


def test_the_bar_ends_at_the_last_round_with_its_accuracy() -> None:
    console = Console(record=True, width=200, force_terminal=False)
    result = asyncio.run(_run(console))
    text = console.export_text()
    assert result.accuracy is not None
    assert "4/4" in text, text
    assert f"accuracy {result.accuracy:.3f}" in text, text
