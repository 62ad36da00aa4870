"""A job with discrete Gaussian noise (``privacy.noise: gaussian``) is charged with an approximate
ε, not a proven upper bound, so agents on the default policy decline it at the invitation, saying
how to proceed; an agent whose policy says ``allow_approximate: true`` takes part.

Real agents (task loop, real policy, SQLite ledger) against the scripted coordinator, in process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.agent_kit import JOB, fedavg_round, federation, publish

from dpfl.client.policy import Policy
from dpfl.client.progress import EventKind

pytestmark = pytest.mark.slow  # real agents, one round of training: a few seconds


def test_default_agents_decline_a_gaussian_job_and_opted_in_agents_take_part(
    tmp_path: Path,
) -> None:
    setup = fedavg_round(population=2, noise="gaussian")
    assert setup.task.params.approximate  # what the agents see in the task

    async def round_with(policy: Policy | None, where: Path) -> None:
        async with federation(where, "inproc", 2, policy=policy) as (coord, agents):
            publish(coord, setup)
            report = await coord.run_round(
                job_id=JOB,
                round=1,
                agents=[a.agent_id for a in agents],
                algorithm=setup.algorithm,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
            )
            if policy is None:  # the default policy
                assert report.accepted == []
                assert set(report.declined) == {a.agent_id for a in agents}
                for reason in report.declined.values():
                    assert reason.startswith("allow_approximate: ")
                    assert "privacy.noise: skellam" in reason
                    assert "allow_approximate: true" in reason
                for agent in agents:
                    declined = [e for e in agent.events if e.kind is EventKind.DECLINED]
                    assert [e.message for e in declined] == [report.declined[agent.agent_id]]
                    assert agent.ledger.entries() == []
                assert coord.downloads == []  # declined before fetching anything
            else:
                assert sorted(report.accepted) == sorted(a.agent_id for a in agents)
                assert report.declined == {}
                assert report.aborted == ""
                assert report.survivors == frozenset(a.agent_id for a in agents)
                for agent in agents:
                    assert len(agent.ledger.entries()) == 1

    async def main() -> None:
        await round_with(None, tmp_path / "default")
        await round_with(Policy.from_mapping({"allow_approximate": True}), tmp_path / "opt-in")

    asyncio.run(asyncio.wait_for(main(), 90))
