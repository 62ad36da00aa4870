"""Test-only: real agents (task loop, real policy and SQLite ledger) for a scripted coordinator.

- :func:`fedavg_round` builds a small DP-FedAvg job (logreg on digits), its plan, the round task
  and the initial model, exactly as a coordinator would;
- :class:`ExactSum` is DP-FedAvg whose agents contribute a known dyadic vector and whose encoding
  adds no noise, so that the coordinator's decoded sum can be checked for EXACT equality (the
  transport, the masking and the encoding lose nothing);
- :class:`AgentHandle` / :func:`start_agent` run one agent (its own state directory, ledger and
  policy) against a connector, in the test's event loop;
- :func:`federation` starts a scripted coordinator and N connected agents (in process or over
  gRPC on loopback); :func:`publish` puts a setup's model where the agents download it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfl.accounting import DpEvent
from dpfl.client.agent import ConnectionRunner
from dpfl.client.local_ledger import LocalLedger
from dpfl.client.policy import Policy
from dpfl.client.progress import AgentEvent
from dpfl.client.simulation import SimulatedAgent, start_simulated_agent
from dpfl.client.summation import PeerCredentials
from dpfl.client.transport import Backoff, Connector, GrpcTransport, InProcessConnector
from dpfl.learning.algorithms.base import (
    AgentData,
    Algorithm,
    AlgorithmError,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundTask,
)
from dpfl.learning.algorithms.dp_fedavg import (
    DpFedAvg,
    DpFedAvgJob,
    DpFedAvgPlan,
    DpFedAvgTask,
    FedAvgAgent,
    FedAvgCoordinator,
)
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.jobs import JobSpec, parse_job
from dpfl.mechanisms import EncodingConfig
from dpfl.mechanisms.noise import NoiseSpec
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import SeededRandomSource

from .scripted_coordinator import ScriptedCoordinator, start_grpc

DIGITS = CoordinatorData(input_shape=(1, 8, 8), num_classes=10)


def fedavg_job(**privacy: Any) -> JobSpec:
    return parse_job(
        {
            "name": "demo",
            "algorithm": "dp-fedavg",
            "data": {"dataset": "digits"},
            "model": "logreg",
            "rounds": 3,
            "privacy": {"unit": "agent", "delta": 1e-5, "noise_multiplier": 1.0, **privacy},
            "secagg": {"corrupt_fraction": 0.0, "dropout_fraction": 0.0},
            "params": {"clip": 1.0, "local_steps": 1, "learning_rate": 0.5, "batch_size": 16},
        }
    )


@dataclass
class Setup:
    algorithm: Algorithm
    job: JobSpec
    plan: JobPlan
    state: CoordinatorState
    task: RoundTask


def fedavg_round(
    algorithm: Algorithm | None = None,
    *,
    population: int = 4,
    round_number: int = 1,
    **privacy: Any,
) -> Setup:
    alg = algorithm if algorithm is not None else get_algorithm("dp-fedavg")
    job = fedavg_job(**privacy)
    plan = alg.plan(job, population=population, data=DIGITS)
    state = alg.bind(job, plan).initial_state(DIGITS)
    task = alg.bind(job, plan).round_task(state, round_number=round_number)
    return Setup(alg, job, plan, state, task)


class ExactSumCoordinator(FedAvgCoordinator[DpFedAvgJob, DpFedAvgPlan, DpFedAvgTask]):
    """DP-FedAvg's coordinator side with a noise-free encoding."""

    def encoding(self, task: RoundTask, *, participants: int, min_survivors: int) -> EncodingConfig:
        return EncodingConfig.for_summands(
            clip=self.spec.params.clip,
            scale_bits=int(self.details.scale_bits),
            summands=participants,
            noise=NoiseSpec.none(),
        )


class ExactSumAgent(FedAvgAgent[DpFedAvgTask]):
    """An agent side contributing :meth:`ExactSum.vector_for`, checking only clip and scale."""

    def check(
        self,
        events: Sequence[DpEvent],
        encoding: EncodingConfig,
        *,
        num_clients: int,
        min_survivors: int,
        honest_fraction: float,
    ) -> float:
        if encoding.clip != self.task.clip or encoding.scale_bits != self.task.scale_bits:
            raise AlgorithmError("encoding does not match the task")
        return 1.0  # no noise to verify: the charge is recorded as claimed

    def compute(
        self,
        data: AgentData,
        *,
        model: bytes | None,
        public_x: npt.NDArray[np.float32] | None,
        device: str,
    ) -> npt.NDArray[np.float64]:
        if model is None:
            raise AlgorithmError("the model was not downloaded")
        return ExactSum.vector_for(
            data, dimension=self.task.dimension, scale_bits=self.task.scale_bits
        )


class ExactSum(DpFedAvg):
    """DP-FedAvg with a noise-free encoding and a known vector per agent.

    Agent i contributes ``v_i[c] = (count of class c in its data mod 7) / 2^b`` for the first
    10 coordinates and 0 elsewhere: dyadic, so scaling by 2^b gives integers, rounding is exact,
    and the decoded sum equals the sum of the v_i exactly.
    """

    coordinator_type = ExactSumCoordinator
    agent_type = ExactSumAgent

    @staticmethod
    def vector_for(data: AgentData, *, dimension: int, scale_bits: int) -> npt.NDArray[np.float64]:
        out = np.zeros(dimension)
        counts = np.bincount(data.y, minlength=data.num_classes) % 7
        out[: data.num_classes] = np.ldexp(counts.astype(np.float64), -scale_bits)
        return out


@dataclass
class AgentHandle:
    """One running agent (:class:`SimulatedAgent`) and the events it emitted."""

    agent: SimulatedAgent
    events: list[AgentEvent] = field(default_factory=list)

    @property
    def agent_id(self) -> str:
        return self.agent.agent_id

    @property
    def data(self) -> AgentData:
        return self.agent.data

    @property
    def ledger(self) -> LocalLedger:
        return self.agent.ledger

    @property
    def runner(self) -> ConnectionRunner:
        return self.agent.runner

    def kinds(self) -> list[str]:
        return [e.kind.value for e in self.events]

    async def close(self) -> None:
        await self.agent.close()


def start_agent(
    *,
    agent_id: str,
    connector: Connector,
    state_dir: Path,
    index: int,
    agents: int,
    policy: Policy | None = None,
    algorithms: Mapping[str, Algorithm] | None = None,
    coordinator_id: str = "scripted",
    backoff: Backoff | None = None,
    peer: PeerCredentials | None = None,
) -> AgentHandle:
    """Start an agent on ``digits#index=I&agents=N`` in the running event loop."""
    events: list[AgentEvent] = []

    def resolve(name: str) -> Algorithm:
        if algorithms is not None and name in algorithms:
            return algorithms[name]
        return get_algorithm(name)

    agent = start_simulated_agent(
        agent_id=agent_id,
        connector=connector,
        data_spec=f"digits#index={index}&agents={agents}",
        state_dir=state_dir,
        policy=policy,
        coordinator_id=coordinator_id,
        rng=SeededRandomSource(f"agent-kit/{agent_id}".encode().ljust(16, b".")),
        observer=events.append,
        backoff=backoff or Backoff(initial=0.05, maximum=0.2),
        algorithms=resolve,
        peer=peer,
    )
    return AgentHandle(agent, events)


JOB = "job-1"


@asynccontextmanager
async def federation(
    tmp_path: Path, transport: str, count: int, **agent_options: object
) -> AsyncIterator[tuple[ScriptedCoordinator, list[AgentHandle]]]:
    """A scripted coordinator and ``count`` connected agents, torn down afterwards."""
    coordinator = ScriptedCoordinator()
    server = None
    channels: list[GrpcTransport] = []
    if transport == "grpc":
        server, address = await start_grpc(coordinator)

    def connector(agent_id: str, credential: str) -> Connector:
        if transport == "grpc":
            channel = GrpcTransport(address, insecure=True)
            channels.append(channel)
            return channel.connector(agent_id=agent_id, credential=credential)
        return InProcessConnector(
            connect_handler=coordinator.connect_handler,
            download_handler=coordinator.download_handler,
            agent_id=agent_id,
            credential=credential,
        )

    handles = []
    for i in range(count):
        agent_id = f"agent-{i}"
        credential = coordinator.add_agent(agent_id)
        handles.append(
            start_agent(
                agent_id=agent_id,
                connector=connector(agent_id, credential),
                state_dir=tmp_path / agent_id,
                index=i,
                agents=count,
                **agent_options,  # type: ignore[arg-type]
            )
        )
    try:
        await coordinator.wait_connected([h.agent_id for h in handles])
        yield coordinator, handles
    finally:
        for handle in handles:
            await handle.close()
        for channel in channels:
            await channel.close()
        if server is not None:
            await server.stop(None)


def publish(coordinator: ScriptedCoordinator, setup: Setup) -> None:
    assert setup.state.model is not None
    coordinator.blobs[(JOB, pb.BLOB_MODEL, setup.state.model_version)] = setup.state.model
