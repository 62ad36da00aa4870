"""Agents hosted in a simulation's process: ``dpfl simulate`` and ``dpfl demo`` start N of these.

Each :class:`SimulatedAgent` is a complete agent (task loop, policy, its own ledger and state
directory) that differs from ``dpfl-agent run`` only in where it runs and how the caller's
connector reaches the coordinator (in process or gRPC on loopback).
:class:`AgentHost` hosts many in one process and caps torch's intra-op threads so that concurrent
trainings do not oversubscribe the cores (docs/agent.md#embedding-agents-simulations-tests); two
hosts alive at once must be closed in the reverse order of their creation.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpfl.client.agent import ConnectionRunner
from dpfl.client.data import parse_data_spec
from dpfl.client.gate import LocalGate
from dpfl.client.local_ledger import LocalLedger
from dpfl.client.policy import Policy
from dpfl.client.progress import AgentEvent, Observer
from dpfl.client.summation import PeerCredentials
from dpfl.client.task import TaskLoop
from dpfl.client.transport import Backoff, Connector
from dpfl.learning.algorithms.base import AgentData, Algorithm
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.secagg.randomness import RandomSource

__all__ = ["EVENT_HISTORY", "AgentHost", "SimulatedAgent", "start_simulated_agent"]

#: How many of its latest events each simulated agent keeps (:attr:`SimulatedAgent.events`).
EVENT_HISTORY = 1000


#: The policy of a simulated agent when none is given: the defaults, trusting the announced
#: cohort, since the coordinator it faces runs in the same simulation, which is the caller's
#: (docs/accounting.md#what-the-agent-can-verify).
SIMULATION_POLICY = Policy(trust_announced_cohort=True)


@dataclass(eq=False)
class SimulatedAgent:
    """A running in-process agent. ``task`` ends when :meth:`close` is called, or with the
    runner's error (e.g. ``CredentialRejectedError``); ``events`` holds its latest
    :data:`EVENT_HISTORY` events."""

    agent_id: str
    data: AgentData
    loop: TaskLoop
    runner: ConnectionRunner
    ledger: LocalLedger
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    events: collections.deque[AgentEvent] = field(
        default_factory=lambda: collections.deque(maxlen=EVENT_HISTORY)
    )

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def kill(self) -> None:
        """End the agent at once, as a crash would: its stream breaks and nothing more is sent
        (a round in flight is dropped; what its ledger recorded stays)."""
        if self.task is not None:
            self.task.cancel()

    async def close(self, *, timeout: float = 10.0) -> None:
        """Stop serving (a round in flight is dropped) and close the ledger; idempotent."""
        self.stop.set()
        task = self.task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=timeout)
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # seen: a runner's error ends the agent, not its caller
        self.ledger.close()


def _recording(events: collections.deque[AgentEvent], observer: Observer | None) -> Observer:
    """An observer that keeps each event in ``events`` and passes it on to ``observer``."""

    def observe(event: AgentEvent) -> None:
        events.append(event)
        if observer is not None:
            observer(event)

    return observe


def start_simulated_agent(
    *,
    agent_id: str,
    connector: Connector,
    data_spec: str | AgentData,
    state_dir: Path | str,
    policy: Policy | None = None,
    coordinator_id: str = "",
    device: str = "cpu",
    rng: RandomSource | None = None,
    observer: Observer | None = None,
    backoff: Backoff | None = None,
    executor: Executor | None = None,
    algorithms: Callable[[str], Algorithm] = get_algorithm,
    peer: PeerCredentials | None = None,
) -> SimulatedAgent:
    """Start an agent in the running event loop.

    Args:
        agent_id: the id the coordinator enrolled it under (``Hello.agent_id``).
        connector: how it reaches the coordinator (see the module docstring).
        data_spec: its ``--data`` spec, or already loaded data.
        state_dir: its own directory for the local ledger (``ledger.sqlite``).
        policy: its local policy (default: the default policy).
        coordinator_id: stored with each ledger record; checked by ``allowed_coordinators``.
        device: where it trains.
        rng: its CSPRNG (default: the system's; a seeded source makes a simulation reproducible,
            give each agent its own, e.g. ``root.child(agent_id)``).
        observer: receives its progress events (they are also kept in ``events``).
        backoff: reconnection delays (default: :class:`Backoff`'s).
        executor: where it trains and encodes (default: asyncio's thread pool).
        algorithms: resolves algorithm tags (tests substitute instrumented algorithms).
        peer: its peer certificate and federation CA (malicious-secure rounds need them).

    Raises:
        DataSpecError: the data spec is malformed or cannot be loaded.
        LocalLedgerError: the ledger cannot be opened.
    """
    data = data_spec if isinstance(data_spec, AgentData) else parse_data_spec(data_spec).load()
    ledger = LocalLedger.open(state_dir)
    events: collections.deque[AgentEvent] = collections.deque(maxlen=EVENT_HISTORY)
    observe = _recording(events, observer)
    loop = TaskLoop(
        agent_id=agent_id,
        data=data,
        gate=LocalGate(
            policy=policy or SIMULATION_POLICY, ledger=ledger, coordinator_id=coordinator_id
        ),
        device=device,
        rng=rng,
        observer=observe,
        executor=executor,
        algorithms=algorithms,
        peer=peer,
    )
    runner = ConnectionRunner(connector=connector, loop=loop, backoff=backoff, observer=observe)
    agent = SimulatedAgent(agent_id, data, loop, runner, ledger, events=events)
    name = f"dpfl-agent-{agent_id}"
    agent.task = asyncio.get_running_loop().create_task(runner.run(stop=agent.stop), name=name)
    return agent


class AgentHost:
    """Many simulated agents in one process; see the module docstring (training threads).

    Args:
        torch_threads: torch's intra-op CPU threads while the host lives (1: one per training).
        workers: threads of the training executor (default: one per core this process may run
            on; more only take turns at the GIL between small torch calls,
            docs/performance.md).

    Raises:
        TrainingError: ``torch_threads`` is not a positive integer.
    """

    def __init__(self, *, torch_threads: int = 1, workers: int | None = None) -> None:
        from dpfl.learning.device import cpu_threads, usable_cores

        self._threads = contextlib.ExitStack()
        self._threads.enter_context(cpu_threads(torch_threads))
        #: where every hosted agent trains and encodes (created under the thread count above)
        self.executor = ThreadPoolExecutor(
            max_workers=workers if workers is not None else usable_cores(),
            thread_name_prefix="dpfl-train",
        )
        self.agents: list[SimulatedAgent] = []
        self.closed = False

    async def start(self, *, data_spec: str | AgentData, **options: Any) -> SimulatedAgent:
        """Start an agent on the host's executor (:func:`start_simulated_agent`'s arguments;
        a data spec is loaded in a worker thread, not on the event loop).

        Raises:
            RuntimeError: the host is closed.
            DataSpecError, LocalLedgerError: as :func:`start_simulated_agent`.
        """
        if self.closed:
            raise RuntimeError("this agent host is closed")
        data = (
            data_spec
            if isinstance(data_spec, AgentData)
            else await asyncio.to_thread(parse_data_spec(data_spec).load)
        )
        agent = start_simulated_agent(data_spec=data, executor=self.executor, **options)
        self.agents.append(agent)
        return agent

    async def stop_agents(self, *, timeout: float = 10.0) -> None:
        """Stop every agent and close its ledger (the host stays open for more agents)."""
        await asyncio.gather(*(a.close(timeout=timeout) for a in self.agents))

    async def close(self, *, timeout: float = 10.0) -> None:
        """Stop every agent, shut the executor down and restore torch's thread count;
        idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            await self.stop_agents(timeout=timeout)
            await asyncio.to_thread(self.executor.shutdown, wait=True, cancel_futures=True)
        finally:
            self._threads.close()
