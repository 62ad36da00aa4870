"""The progress that ``dpfl simulate`` and ``dpfl demo`` show: every round's report reaches the
bar once, in order, the last round's included, so the bar ends at N/N with the last round's
accuracy (it used to stop a round short: reports were polled, and the poller was cancelled
when the job ended, before it saw the rounds that ended after its last look)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rich.console import Console

from dpfl.cli.sim_report import run_with_progress
from dpfl.learning.jobs import parse_job
from dpfl.server.orchestrator import RoundReport
from dpfl.simulation import Simulation, SimulationResult

pytestmark = pytest.mark.slow

#: Short rounds, so several end between two looks of the poller, the last one among them.
JOB: dict[str, Any] = {
    "name": "progress",
    "algorithm": "dp-fedavg",
    "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
    "model": "logreg",
    "rounds": 4,
    "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 8.0, "noise": "skellam"},
    "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.05},
    "params": {"clip": 1.0, "sampling_rate": 1.0, "local_steps": 1, "learning_rate": 0.5},
}


async def _run(progress: Any) -> SimulationResult:
    sim = Simulation(parse_job(JOB), agents=3, transport="inproc")
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
