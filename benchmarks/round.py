"""Round overhead over loopback gRPC: per-stage latency of full rounds, ONE JSON line.

    python benchmarks/round.py --agents 50 --processes 4 --sizes 10000 100000 --rounds 3

A real coordinator (store on a temporary SQLite file, round engine, gRPC server) in this
process, and ``--agents`` real agents (``dpfl.client``: task loop, local policy and ledger,
secagg client, gRPC transport) spread over ``--processes`` worker processes. The job sums raw
vectors of each size (a benchmark-only algorithm plugged into both sides through the
``algorithms`` resolvers: ``agent_compute`` returns a random unit vector, so training is
excluded) with everything else as in production: invitations, secure aggregation with the
solver's (k, t), Skellam noise shares encoded into the ring, the ledger commit before unmasking,
decoding. Reported per size, as medians over the rounds: the coordinator's stage durations
(``Round.stage_seconds``), the round's wall time from its start to its completion (the round
overhead), and the coordinator process's CPU time per round (gRPC, unpacking, summing,
reconstruction, ledger). Target (issue 5): ≤ 3 s at 50 agents and 10⁵ parameters.

On a 2-core machine the agents' own work (encoding with Skellam noise, masking with k + 1 PRG
streams, packing) of all 50 agents shares the same two cores as the coordinator, so the wall time
includes 50 agents' compute serialised on 2 cores, which a deployment runs in parallel on 50
machines; ``coordinator_cpu_s_per_round`` isolates the coordinator's part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpfl.accounting import SkellamEvent
from dpfl.learning.algorithms.base import (
    AgentData,
    Algorithm,
    ClientCharge,
    CoordinatorData,
    CoordinatorState,
    JobPlan,
    RoundOutcome,
    RoundTask,
    TaskParams,
    get_algorithm,
)
from dpfl.learning.jobs import JobSpec, parse_job
from dpfl.secagg import EncodingConfig, NoiseSpec

TARGET_S = 3.0
CLIP = 1.0
SCALE_BITS = 16
MU_TOTAL = 4.0e9  # summed Skellam μ in ring units (z ≈ 1.4 at this scale): realistic noise work


class RawVectorSum(Algorithm):
    """Benchmark-only: every agent contributes a random unit vector of ``dimension`` floats."""

    name = "dp-fedavg"  # the job's tag; both sides resolve it to this class

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension

    def plan(self, job: JobSpec, *, population: int, data: Any = None) -> JobPlan:
        return JobPlan(1.0, {}, population, {"dimension": self.dimension})

    def initial_state(self, job: JobSpec, plan: JobPlan, data: Any) -> CoordinatorState:
        return CoordinatorState(model=None, model_version=0)

    def select(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> list[str]:
        return list(population)

    def round_task(
        self, job: JobSpec, plan: JobPlan, state: CoordinatorState, *, round_number: int
    ) -> RoundTask:
        params = {"algorithm": self.name, "dimension": self.dimension, "round": round_number}
        return RoundTask(params=params, vector_length=self.dimension)

    def encoding(
        self, job: JobSpec, plan: JobPlan, task: RoundTask, *, participants: int, min_survivors: int
    ) -> EncodingConfig:
        noise = NoiseSpec.skellam_share(
            total_mu=MU_TOTAL, honest_fraction=1.0, participants=min_survivors
        )
        return EncodingConfig.for_summands(
            clip=CLIP, scale_bits=SCALE_BITS, summands=participants, noise=noise
        )

    def _event(self) -> SkellamEvent:
        config = EncodingConfig(clip=CLIP, scale_bits=SCALE_BITS, ring_bits=64)
        return SkellamEvent(
            mu=MU_TOTAL,
            l1_sensitivity=config.rounded_l1_bound(self.dimension),
            l2_sensitivity=config.rounded_l2_bound(self.dimension),
            dimension=self.dimension,
        )

    def charges(
        self,
        job: JobSpec,
        plan: JobPlan,
        *,
        round_number: int,
        population: Sequence[str],
        participants: Sequence[str],
    ) -> dict[str, ClientCharge]:
        charge = ClientCharge(event=self._event(), unit="agent")
        return dict.fromkeys(participants, charge)

    def invitation_events(
        self, job: JobSpec, plan: JobPlan, *, round_number: int, population: Sequence[str]
    ) -> tuple[Any, ...]:
        return (self._event(),)

    def finish_round(
        self,
        job: JobSpec,
        plan: JobPlan,
        state: CoordinatorState,
        data: CoordinatorData,
        *,
        round_number: int,
        aggregate: Any,
        survivors: int,
    ) -> RoundOutcome:
        if aggregate.shape != (self.dimension,):
            raise ValueError("wrong aggregate length")
        return RoundOutcome(state=state, metrics={"survivors": float(survivors)})

    def agent_check(self, params: Mapping[str, Any], events: Any, encoding: Any, **_: Any) -> None:
        return None

    def agent_compute(
        self, params: TaskParams, data: AgentData, *, model: Any, public_x: Any, device: str
    ) -> np.ndarray:
        v = np.random.default_rng().standard_normal(self.task(params).dimension)
        return v / np.linalg.norm(v)


def _job(dimension: int) -> JobSpec:
    return parse_job(
        {
            "name": f"bench-round-{dimension}",
            "algorithm": "dp-fedavg",
            "data": {"dataset": "digits"},
            "rounds": 1000,
            "privacy": {"unit": "agent", "noise_multiplier": 1.0},
            "secagg": {"enabled": True, "corrupt_fraction": 0.05, "dropout_fraction": 0.05},
        }
    )


# -- worker processes: the agents ----------------------------------------------------------------


def _worker(address: str, credentials: list[tuple[str, str]], dims: list[int], ready: Any) -> None:
    from dpfl.learning.device import cpu_threads

    # many agents per process on few cores: one torch and one BLAS thread each (see cpu_threads)
    with cpu_threads(1):
        asyncio.run(_agents(address, credentials, dims, ready))


async def _agents(
    address: str, credentials: list[tuple[str, str]], dims: list[int], ready: Any
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
            )
            runner = ConnectionRunner(
                connector=transport.connector(agent_id=agent_id, credential=credential),
                loop=loop,
                backoff=Backoff(initial=0.05, maximum=0.5),
            )
            tasks.append(asyncio.create_task(runner.run(stop=stop)))
        ready.set()
        # the parent switches sizes by sending the next dimension on stdin-free pipe: a file
        switch = os.environ["DPFL_BENCH_SWITCH"]
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


# -- the coordinator -----------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from dpfl.server.coordinator import Coordinator
    from dpfl.server.handlers import submit
    from dpfl.server.settings import Settings, StageDeadlines

    current = {"dim": args.sizes[0]}

    def resolve(name: str) -> Algorithm:
        return RawVectorSum(current["dim"]) if name == "dp-fedavg" else get_algorithm(name)

    tmp = tempfile.TemporaryDirectory(prefix="dpfl-bench-")
    switch = os.path.join(tmp.name, "switch")
    with open(switch, "w", encoding="utf-8") as f:
        f.write(str(args.sizes[0]))
    os.environ["DPFL_BENCH_SWITCH"] = switch
    settings = Settings(
        database_url=f"sqlite:///{tmp.name}/c.db",
        grpc_port=0,
        admin_token=secrets.token_urlsafe(32),
        stage_deadlines=StageDeadlines(
            invitation=30, advertise_keys=30, share_keys=30, masked_input=60, unmask=30
        ),
    )
    coordinator = Coordinator(settings=settings, serve_api=False, algorithms=resolve)
    await coordinator.start()
    store = coordinator.store
    agents = [store.create_agent(name=f"bench-{i}") for i in range(args.agents)]
    creds = [(a.id, store.issue_credential(a.id)) for a in agents]
    ctx = mp.get_context("spawn")
    groups = [creds[p :: args.processes] for p in range(args.processes)]
    readies = [ctx.Event() for _ in groups]
    procs = [
        ctx.Process(target=_worker, args=(coordinator.grpc_address, g, args.sizes, r))
        for g, r in zip(groups, readies, strict=True)
    ]
    for p in procs:
        p.start()
    out: dict[str, Any] = {}
    try:
        ok = await coordinator.registry.wait_connected([a.id for a in agents], timeout=120)
        if not ok:
            raise RuntimeError("agents did not connect")
        for dim in args.sizes:
            current["dim"] = dim
            with open(switch, "w", encoding="utf-8") as f:
                f.write(str(dim))
            await asyncio.sleep(0.5)  # let every worker pick up the size
            job = submit(store, _job(dim).model_dump(mode="json"), members=[a.id for a in agents])
            await coordinator.orchestrator.start(job.id)
            total = args.rounds + args.warmup
            cpu_start: float | None = None
            while True:
                rounds = [r for r in store.list_rounds(job.id) if r.status.value == "completed"]
                if cpu_start is None and len(rounds) >= args.warmup:
                    cpu_start = time.process_time()
                if len(rounds) >= total:
                    cpu = (time.process_time() - (cpu_start or 0.0)) / args.rounds
                    break
                failed = store.get_job(job.id)
                if failed.status.value == "failed":
                    raise RuntimeError(f"benchmark job failed: {failed.error}")
                await asyncio.sleep(0.05)
            await coordinator.orchestrator.stop(job.id)
            measured = sorted(rounds, key=lambda r: r.number)[args.warmup : total]
            stages = {
                name: statistics.median(r.stage_seconds.get(name, 0.0) for r in measured)
                for name in (
                    "invitation",
                    "advertise_keys",
                    "share_keys",
                    "masked_input",
                    "unmask",
                    "decode",
                )
            }
            walls = [(r.finished_at - r.started_at).total_seconds() for r in measured]
            secagg = measured[0].noise.get("secagg", {})
            out[str(dim)] = {
                "stage_s": {k: round(v, 4) for k, v in stages.items()},
                "round_s": round(statistics.median(walls), 4),
                "round_s_all": [round(w, 4) for w in walls],
                "coordinator_cpu_s_per_round": round(cpu, 4),
                "degree": secagg.get("degree"),
                "threshold": secagg.get("threshold"),
                "ring_bits": secagg.get("ring_bits"),
            }
    finally:
        with open(switch, "w", encoding="utf-8") as f:
            f.write("stop")
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
        await coordinator.close()
        tmp.cleanup()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per size")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds per size")
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    from dpfl.learning.device import cpu_threads

    with cpu_threads(1):
        sizes = asyncio.run(_run(args))
    largest = sizes.get("100000")
    line = {
        "benchmark": "round",
        "transport": "grpc-loopback",
        "agents": args.agents,
        "processes": args.processes,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "sizes": sizes,
        "target_round_s_at_50_agents_1e5": TARGET_S,
        "meets_target": (
            largest["round_s"] <= TARGET_S if largest is not None and args.agents == 50 else None
        ),
        "wall_s": round(time.perf_counter() - started, 2),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
