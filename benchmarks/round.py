"""Round overhead over loopback gRPC: per-stage latency of full rounds, ONE JSON line.

    python benchmarks/round.py --agents 50 --processes 4 --sizes 10000 100000 --rounds 3

A real coordinator and real agents in worker processes summing random unit vectors (training
excluded, everything else as in production). Target: ≤ 3 s at 50 agents and 10⁵ parameters.
Method, JSON fields and results:
docs/performance.md#a-whole-round-over-loopback-grpc-benchmarksroundpy.
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
from collections.abc import Sequence
from typing import Any

from harness.federation import RawVectorSum, bench_job, worker

from dpfl.learning.algorithms.base import Algorithm
from dpfl.learning.algorithms.registry import get_algorithm

TARGET_S = 3.0


# -- the coordinator -----------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from dpfl.server.agent_protocol import submit
    from dpfl.server.coordinator import Coordinator
    from dpfl.server.settings import Settings, StageDeadlines

    current = {"dim": args.sizes[0]}

    def resolve(name: str) -> Algorithm:
        return RawVectorSum(current["dim"]) if name == "dp-fedavg" else get_algorithm(name)

    tmp = tempfile.TemporaryDirectory(prefix="dpfl-bench-")
    switch = os.path.join(tmp.name, "switch")
    with open(switch, "w", encoding="utf-8") as f:
        f.write(str(args.sizes[0]))
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
        ctx.Process(target=worker, args=(coordinator.grpc_address, g, args.sizes, r, switch))
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
            spec = bench_job(dim).model_dump(mode="json")
            job = submit(store, spec, members=[a.id for a in agents])
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
            secagg = measured[0].setup.secagg
            out[str(dim)] = {
                "stage_s": {k: round(v, 4) for k, v in stages.items()},
                "round_s": round(statistics.median(walls), 4),
                "round_s_all": [round(w, 4) for w in walls],
                "coordinator_cpu_s_per_round": round(cpu, 4),
                "degree": None if secagg is None else secagg.degree,
                "threshold": None if secagg is None else secagg.threshold,
                "ring_bits": None if secagg is None else secagg.ring_bits,
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
