"""Coordinator scale: rounds with 100 to 1000 real gRPC agents, ONE JSON line per point.

    python benchmarks/scale.py --agents 100 300 1000 --sizes 10000 100000 --plot scale.png

One coordinator with a PostgreSQL ledger and N real agents in worker processes summing random
unit vectors, per N and vector size. Method, JSON fields and results:
docs/performance.md#scale-100-to-1000-agents-benchmarksscalepy.
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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from harness.federation import RawVectorSum, bench_job, peer_pems, worker
from harness.postgres import DEFAULT_POSTGRES, fresh_postgres

from dpfl.learning.algorithms.base import Algorithm
from dpfl.learning.algorithms.registry import get_algorithm

STAGES = (
    "invitation",
    "advertise_keys",
    "share_keys",
    "masked_input",
    "consistency",
    "unmask",
    "decode",
)
TARGETS = {  # (agents, size) -> round seconds, on a quiet 2-core machine
    (1000, 10_000): 10.0,
    (300, 100_000): 10.0,
}
RSS_TARGET_MB = 1024.0


@dataclass
class ByteCounter:
    """Serialized bytes of the ``Connect`` messages, both directions."""

    inbound: int = 0
    outbound: int = 0


def count_stream_bytes(counter: ByteCounter) -> None:
    """Count every ``Connect`` message's and download chunk's size at the coordinator's servicer
    (this process only)."""
    from dpfl.server.grpc.servicer import AgentServicer

    original = AgentServicer._connect

    async def counted(self: Any, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async def inbound() -> AsyncIterator[Any]:
            async for message in request_iterator:
                if hasattr(message, "ByteSize"):  # not a decoding error
                    counter.inbound += message.ByteSize()
                yield message

        async for message in original(self, inbound(), context):
            counter.outbound += message.ByteSize()
            yield message

    download = AgentServicer.Download

    async def counted_download(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
        counter.inbound += request.ByteSize()
        async for chunk in download(self, request, context):
            counter.outbound += chunk.ByteSize()
            yield chunk

    AgentServicer._connect = counted  # type: ignore[method-assign]
    AgentServicer.Download = counted_download  # type: ignore[method-assign]


def process_cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of processes ``pids`` (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MB (Linux ``/proc``)."""
    fields: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return round(fields.get("VmRSS", 0.0), 1), round(fields.get("VmHWM", 0.0), 1)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


async def _points(
    n: int, args: argparse.Namespace, database_url: str, counter: ByteCounter
) -> list[dict[str, Any]]:
    from dpfl.server.agent_protocol import submit
    from dpfl.server.coordinator import Coordinator
    from dpfl.server.settings import Settings, StageDeadlines

    current = {"dim": args.sizes[0]}

    def resolve(name: str) -> Algorithm:
        if name == "dp-fedavg":
            return RawVectorSum(current["dim"], with_model=True)
        return get_algorithm(name)

    tmp = tempfile.TemporaryDirectory(prefix="dpfl-scale-")
    switch = os.path.join(tmp.name, "switch")
    with open(switch, "w", encoding="utf-8") as f:
        f.write(str(args.sizes[0]))
    settings = Settings(
        database_url=database_url,
        grpc_port=0,
        admin_token=secrets.token_urlsafe(32),
        stage_deadlines=StageDeadlines(
            invitation=120,
            advertise_keys=120,
            share_keys=120,
            masked_input=300,
            consistency=120,
            unmask=120,
        ),
    )
    coordinator = Coordinator(settings=settings, serve_api=False, algorithms=resolve)
    await coordinator.start()
    store = coordinator.store
    setup = time.perf_counter()
    agents = [store.create_agent(name=f"scale-{i}") for i in range(n)]
    creds = [(a.id, store.issue_credential(a.id)) for a in agents]
    ctx = mp.get_context("spawn")
    processes = min(args.processes, n)
    groups = [creds[p::processes] for p in range(processes)]
    readies = [ctx.Event() for _ in groups]
    malicious = args.threat_model == "malicious"
    ca, pairs = peer_pems(n) if malicious else (b"", [])
    peers = [(ca, pairs[p::processes]) if malicious else None for p in range(processes)]
    procs = [
        ctx.Process(target=worker, args=(coordinator.grpc_address, g, args.sizes, r, switch, peer))
        for g, r, peer in zip(groups, readies, peers, strict=True)
    ]
    for p in procs:
        p.start()
    out: list[dict[str, Any]] = []
    try:
        ok = await coordinator.registry.wait_connected([a.id for a in agents], timeout=600)
        if not ok:
            raise RuntimeError(f"not all {n} agents connected within 600 s")
        setup_s = time.perf_counter() - setup
        for dim in args.sizes:
            current["dim"] = dim
            with open(switch, "w", encoding="utf-8") as f:
                f.write(str(dim))
            await asyncio.sleep(0.5)  # let every worker pick up the size
            spec = bench_job(dim, name=f"scale-{n}", threat_model=args.threat_model).model_dump(
                mode="json"
            )
            job = submit(store, spec, members=[a.id for a in agents])
            await coordinator.orchestrator.start(job.id)
            total = args.rounds + args.warmup
            cpu_start: float | None = None
            agents_cpu_start = 0.0
            bytes_start = 0
            runner = coordinator.orchestrator.runner(job.id)
            while True:  # the runner's in-memory reports: polling the store would load it
                done = sum(1 for r in runner.reports if r.completed) if runner else 0
                if cpu_start is None and done >= args.warmup:
                    cpu_start = time.process_time()
                    agents_cpu_start = process_cpu_s([p.pid for p in procs if p.pid])
                    bytes_start = counter.inbound + counter.outbound
                if done >= total:
                    cpu = (time.process_time() - (cpu_start or 0.0)) / args.rounds
                    agents_cpu = (
                        process_cpu_s([p.pid for p in procs if p.pid]) - agents_cpu_start
                    ) / args.rounds
                    moved = (counter.inbound + counter.outbound - bytes_start) / args.rounds
                    break
                if runner is None or job.id not in coordinator.orchestrator.running():
                    state = await asyncio.to_thread(store.get_job, job.id)
                    raise RuntimeError(f"benchmark job ended early: {state.status} {state.error}")
                await asyncio.sleep(0.1)
            await coordinator.orchestrator.stop(job.id)
            rounds = [r for r in store.list_rounds(job.id) if r.status.value == "completed"]
            measured = sorted(rounds, key=lambda r: r.number)[args.warmup : total]
            walls = [(r.finished_at - r.started_at).total_seconds() for r in measured]
            per_stage = {s: [r.stage_seconds.get(s, 0.0) for r in measured] for s in STAGES}
            secagg = measured[0].setup.secagg
            rss, peak = rss_mb()
            round_s = statistics.median(walls)
            target = TARGETS.get((n, dim))
            out.append(
                {
                    "benchmark": "scale",
                    "agents": n,
                    "size": dim,
                    "processes": processes,
                    "database": "postgresql",
                    "threat_model": args.threat_model,
                    "rounds": args.rounds,
                    "cpus": os.cpu_count(),
                    "round_s": round(round_s, 3),
                    "round_s_all": [round(w, 3) for w in walls],
                    "stage_p50_s": {s: round(_quantile(v, 0.5), 4) for s, v in per_stage.items()},
                    "stage_p99_s": {s: round(_quantile(v, 0.99), 4) for s, v in per_stage.items()},
                    "survivors": min(len(r.survivors.get("masked_input", ())) for r in measured),
                    "coordinator_cpu_s_per_round": round(cpu, 3),
                    "agents_cpu_s_per_round": round(agents_cpu, 3),
                    "coordinator_rss_mb": rss,
                    "coordinator_peak_rss_mb": peak,
                    "bytes_per_agent_per_round": round(moved / n),
                    "degree": None if secagg is None else secagg.degree,
                    "threshold": None if secagg is None else secagg.threshold,
                    "setup_s": round(setup_s, 2),
                    "target_round_s": target,
                    "meets_target": None
                    if target is None
                    else bool(round_s <= target and (n < 1000 or peak <= RSS_TARGET_MB)),
                }
            )
            print(json.dumps(out[-1]), flush=True)
    finally:
        with open(switch, "w", encoding="utf-8") as f:
            f.write("stop")
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.terminate()
        await coordinator.close()
        tmp.cleanup()
    return out


def plot(points: Sequence[dict[str, Any]], path: str) -> None:
    """Round time against N, one line per vector size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for size in sorted({p["size"] for p in points}):
        line = sorted((p["agents"], p["round_s"]) for p in points if p["size"] == size)
        ax.plot([x for x, _ in line], [y for _, y in line], marker="o", label=f"{size:,} params")
    ax.axhline(10.0, color="grey", linestyle="--", linewidth=0.8, label="target 10 s")
    ax.set_xlabel("agents N")
    ax.set_ylabel("round wall time (s, median)")
    ax.set_title("dpfl round time, PostgreSQL ledger, gRPC agents")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--processes", type=int, default=4, help="worker processes for agents")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per point")
    parser.add_argument(
        "--threat-model",
        choices=("semi-honest", "semi-malicious", "malicious"),
        default="semi-honest",
        help="the jobs' secagg.threat_model (malicious: every agent with a peer certificate)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds per point")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="server to create a DB on")
    parser.add_argument("--plot", default=None, help="write a PNG of round time against N")
    args = parser.parse_args(argv)
    if min(args.agents) < 2:
        parser.error("--agents must all be >= 2 (secure aggregation needs two)")
    from dpfl.learning.device import cpu_threads

    counter = ByteCounter()
    count_stream_bytes(counter)

    async def run_all() -> list[dict[str, Any]]:
        # one event loop for every point: gRPC's asyncio poller stays bound to its first loop
        out: list[dict[str, Any]] = []
        for n in args.agents:
            with fresh_postgres(args.postgres, "scale") as url:
                out.extend(await _points(n, args, url, counter))
        return out

    with cpu_threads(1):
        points = asyncio.run(run_all())
    if args.plot:
        plot(points, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
