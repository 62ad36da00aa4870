"""Shared pieces of the federation benchmarks (``round.py``, ``scale.py``): a benchmark-only
algorithm whose agents contribute a random unit vector (training excluded, everything else as in
production), its job, and the worker processes that host many real gRPC agents each.

A worker process serves its agents until the file at ``switch`` says ``stop``; when the file
holds another vector size, the workers' algorithm switches to it (the coordinator writes the size
before submitting the job of that size).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpfl.accounting import SkellamEvent
from dpfl.learning.algorithms.base import (
    AgentData,
    AgentSide,
    Algorithm,
    ClientCharge,
    CoordinatorData,
    CoordinatorSide,
    CoordinatorState,
    JobPlan,
    PlanDetails,
    RoundCharge,
    RoundOutcome,
    RoundTask,
    TaskParams,
)
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.jobs import JobSpec, parse_job
from dpfl.mechanisms import EncodingConfig, NoiseSpec

__all__ = ["CLIP", "MU_TOTAL", "SCALE_BITS", "RawVectorSum", "bench_job", "worker"]

CLIP = 1.0
SCALE_BITS = 16
MU_TOTAL = 4.0e9  # summed Skellam μ in ring units (z ≈ 1.4 at this scale): realistic noise work


class BenchPlan(PlanDetails):
    """The benchmark's plan: the shared fields and the vector's length."""

    dimension: int


class BenchTask(TaskParams):
    """The benchmark's task: the shared fields and the vector's length."""

    dimension: int


class RawVectorCoordinator(CoordinatorSide[JobSpec, BenchPlan, BenchTask]):
    """The benchmark's coordinator side: everyone takes part, a fixed Skellam encoding."""

    def initial_state(self, data: Any) -> CoordinatorState:
        model = bytes(4 * self.details.dimension) if self.algorithm.with_model else None
        return CoordinatorState(model=model, model_version=0)

    def select(self, *, round_number: int, population: Sequence[str]) -> list[str]:
        return list(population)

    def round_task(self, state: CoordinatorState, *, round_number: int) -> RoundTask:
        params = BenchTask(
            algorithm=self.name,
            job=self.spec.name,
            round=round_number,
            noise="skellam",
            noise_total=MU_TOTAL,
            noise_multiplier=1.0,
            scale_bits=SCALE_BITS,
            secure_aggregation=True,
            honest_fraction=1.0,
            unit="agent",
            delta=self.spec.privacy.delta,
            dimension=self.details.dimension,
        )
        return RoundTask(params=params, vector_length=self.details.dimension)

    def encoding(self, task: RoundTask, *, participants: int, min_survivors: int) -> EncodingConfig:
        noise = NoiseSpec.skellam_share(
            total_mu=MU_TOTAL, honest_fraction=1.0, participants=min_survivors
        )
        return EncodingConfig.for_summands(
            clip=CLIP, scale_bits=SCALE_BITS, summands=participants, noise=noise
        )

    def round_charge(self, *, round_number: int, population: Sequence[str]) -> RoundCharge:
        config = EncodingConfig(clip=CLIP, scale_bits=SCALE_BITS, ring_bits=64)
        dimension = self.details.dimension
        event = SkellamEvent(
            mu=MU_TOTAL,
            l1_sensitivity=config.rounded_l1_bound(dimension),
            l2_sensitivity=config.rounded_l2_bound(dimension),
            dimension=dimension,
        )
        return RoundCharge(ClientCharge(event=event, unit="agent"), tuple(population))

    def finish_round(
        self,
        state: CoordinatorState,
        data: CoordinatorData,
        *,
        round_number: int,
        aggregate: Any,
        survivors: int,
    ) -> RoundOutcome:
        if aggregate.shape != (self.details.dimension,):
            raise ValueError("wrong aggregate length")
        return RoundOutcome(state=state, metrics={"survivors": float(survivors)})


class RawVectorAgent(AgentSide[BenchTask]):
    """The benchmark's agent side: a random unit vector, no checks."""

    def check(self, events: Any, encoding: Any, **_: Any) -> float:
        return 1.0  # no noise to verify: the charge is recorded as claimed

    def compute(self, data: AgentData, *, model: Any, public_x: Any, device: str) -> np.ndarray:
        v = np.random.default_rng().standard_normal(self.task.dimension)
        return v / np.linalg.norm(v)


class RawVectorSum(Algorithm[JobSpec, BenchPlan, BenchTask]):
    """Benchmark-only: every agent contributes a random unit vector of ``dimension`` floats."""

    name = "dp-fedavg"  # the job's tag; both sides resolve it to this class
    spec_type = JobSpec
    plan_type = BenchPlan
    task_type = BenchTask
    coordinator_type = RawVectorCoordinator
    agent_type = RawVectorAgent

    def __init__(self, dimension: int, *, with_model: bool = False) -> None:
        super().__init__()
        self.dimension = dimension
        #: keep a model of ``dimension`` float32s that every agent downloads each round, as in
        #: a real job (without it the agents' model downloads answer NOT_FOUND)
        self.with_model = with_model

    def plan(self, job: JobSpec, *, population: int, data: Any = None) -> JobPlan:
        details = BenchPlan(
            noise="skellam",
            noise_total=MU_TOTAL,
            scale_bits=SCALE_BITS,
            secure_aggregation=True,
            honest_fraction=1.0,
            corrupt_fraction=0.05,
            dimension=self.dimension,
        )
        return JobPlan(1.0, {}, population, details)


def bench_job(
    dimension: int, name: str = "bench-round", threat_model: str = "semi-honest"
) -> JobSpec:
    """A DP-FedAvg-tagged job of ``dimension`` that every agent takes part in."""
    return parse_job(
        {
            "name": f"{name}-{dimension}",
            "algorithm": "dp-fedavg",
            "data": {"dataset": "digits"},
            "rounds": 1000,
            "privacy": {"unit": "agent", "noise_multiplier": 1.0},
            "secagg": {
                "enabled": True,
                "corrupt_fraction": 0.05,
                "dropout_fraction": 0.05,
                "threat_model": threat_model,
            },
        }
    )


def peer_pems(count: int) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A federation CA (its certificate) and ``count`` (key, peer certificate) PEM pairs, for
    agents of a malicious-secure benchmark in other processes."""
    from dpfl.server import tls

    ca = tls.create_ca(common_name="benchmark federation CA")
    pairs = [tls.issue_peer_certificate(ca, name=f"bench-{i}") for i in range(count)]
    return ca.certificate, [(p.private_key, p.certificate) for p in pairs]


# -- worker processes: the agents ----------------------------------------------------------------


def worker(
    address: str,
    credentials: list[tuple[str, str]],
    dims: list[int],
    ready: Any,
    switch: str,
    peers: tuple[bytes, list[tuple[bytes, bytes]]] | None = None,
) -> None:
    """A worker process's body: serve ``credentials``' agents until ``switch`` says stop;
    ``peers``: the federation CA and each agent's (key, peer certificate) for malicious-secure
    rounds."""
    from dpfl.learning.device import cpu_threads

    # many agents per process on few cores: one torch and one BLAS thread each (see cpu_threads)
    with cpu_threads(1):
        asyncio.run(_agents(address, credentials, dims, ready, switch, peers))


def _credentials(peers: tuple[bytes, list[tuple[bytes, bytes]]] | None) -> list[Any]:
    import datetime as dt

    from dpfl.client.summation import PeerCredentials
    from dpfl.secagg.identity import PeerAuthority, Signer

    if peers is None:
        return []
    ca, pairs = peers
    authority, now = PeerAuthority(ca), dt.datetime.now(dt.UTC)
    return [
        PeerCredentials(signer=Signer(k, c, authority=authority, now=now), authority=authority)
        for k, c in pairs
    ]


async def _agents(
    address: str,
    credentials: list[tuple[str, str]],
    dims: list[int],
    ready: Any,
    switch: str,
    peers: tuple[bytes, list[tuple[bytes, bytes]]] | None = None,
) -> None:
    from dpfl.client.agent import ConnectionRunner
    from dpfl.client.gate import LocalGate
    from dpfl.client.local_ledger import LocalLedger
    from dpfl.client.policy import Policy
    from dpfl.client.task import TaskLoop
    from dpfl.client.transport import Backoff, GrpcTransport

    by_dim = {d: RawVectorSum(d) for d in dims}
    current = {"dim": dims[0]}

    def resolve(name: str) -> Algorithm:
        return by_dim[current["dim"]] if name == "dp-fedavg" else get_algorithm(name)

    data = AgentData(
        x=np.zeros((1, 1), np.float32), y=np.zeros(1, np.int64), input_shape=(1,), num_classes=2
    )
    policy = Policy(max_epsilon_per_job=1e9, max_epsilon_total=1e9, min_noise_multiplier=0.0)
    identities = _credentials(peers)
    transport = GrpcTransport(address, insecure=True)
    stop = asyncio.Event()
    tasks = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (agent_id, credential) in enumerate(credentials):
            ledger = LocalLedger.open(f"{tmp}/{i}")
            loop = TaskLoop(
                agent_id=agent_id,
                data=data,
                gate=LocalGate(policy=policy, ledger=ledger),
                algorithms=resolve,
                peer=identities[i] if identities else None,
            )
            runner = ConnectionRunner(
                connector=transport.connector(agent_id=agent_id, credential=credential),
                loop=loop,
                backoff=Backoff(initial=0.05, maximum=0.5),
            )
            tasks.append(asyncio.create_task(runner.run(stop=stop)))
        ready.set()
        while True:
            await asyncio.sleep(0.2)
            try:
                text = open(switch, encoding="utf-8").read().strip()  # noqa: SIM115
            except OSError:
                continue
            if text == "stop":
                break
            if text and int(text) != current["dim"]:
                current["dim"] = int(text)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await transport.close()
