"""Ledger speed per round: prints ONE JSON line per (database, N) with medians in seconds.

What the coordinator asks of its store in every round of a job whose N members are all charged
(DP-FedAvg under Poisson client sampling: every member could have been sampled, so every member
pays the amplified cost): the pre-round budget check of the whole population, the round's start,
the stages it records, and the commit of N ledger entries. Afterwards the job's per-client ε is
read once, as ``dpfl simulate`` does. The store is the production ``SqlStore`` on a SQLite file
and, when reachable, on a fresh PostgreSQL database (dropped afterwards).

    python benchmarks/ledger.py --agents 100 1000 --rounds 10

With ``--prior-events N`` it measures instead the commit of a round whose every client already
has N prior events (issue 31's target: 1000 clients, 10⁴ events each, ≤ 1 s, RSS ≤ 1 GB): the
budget check then composes each client's whole history (``accounting/history.py``). The prior
events are written as the store's history groups of an earlier job (what the commit reads; 10⁷
ledger rows would take hours to insert and are never read by a commit), split over ``--cohorts``
distinct histories of two events each, as a population charged by a few jobs has. One JSON line:
the median commit seconds over the rounds and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.postgres import DEFAULT_POSTGRES, fresh_postgres, unreachable

from dpfl.accounting import GaussianEvent, PoissonSampledEvent
from dpfl.accounting.history import canonical_event, clear_history_cache
from dpfl.learning.jobs import parse_job
from dpfl.server.store import Budget, Charge, JobStatus, ProtectedUnit
from dpfl.server.store.ledger import HistoryGroup
from dpfl.server.store.sql import SqlStore

JOB = parse_job(
    {"name": "ledger-bench", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 1000}}
)
#: one round of DP-Fed-LS's MNIST row: Poisson rate 0.05, noise multiplier about 1
EVENT = PoissonSampledEvent(0.05, GaussianEvent.from_multiplier(1.0))


def measure(url: str, agents: int, rounds: int) -> dict[str, float]:
    """Median seconds per round of each store call, over ``rounds`` rounds of one job."""
    store = SqlStore(url)
    try:
        ids = [store.create_agent(name=f"a{i}", budget=Budget(1e6, 1e-5)).id for i in range(agents)]
        job = store.create_job(JOB, members=ids)
        store.set_job_status(job.id, JobStatus.RUNNING)
        times: dict[str, list[float]] = {
            k: [] for k in ("population", "check", "start", "stages", "commit", "round")
        }
        sample = ids[: max(1, agents // 20)]
        for number in range(1, rounds + 1):
            t0 = time.perf_counter()
            active = {a.id for a in store.list_agents()}
            members = [a for a in store.job_members(job.id) if a in active]
            t1 = time.perf_counter()
            checks = store.check_budgets(dict.fromkeys(members, EVENT))
            assert all(c.allowed for c in checks.values())
            t2 = time.perf_counter()
            rnd = store.start_round(job.id, number, invited=sample)
            t3 = time.perf_counter()
            for stage in ("advertise_keys", "share_keys", "masked_input"):
                store.record_stage(rnd.id, stage, survivors=sample, seconds=0.1)
            t4 = time.perf_counter()
            store.commit_round(rnd.id, [Charge(a, EVENT, ProtectedUnit.AGENT) for a in members])
            store.record_stage(rnd.id, "unmask", survivors=sample, seconds=0.1)
            store.complete_round(rnd.id)
            t5 = time.perf_counter()
            for key, value in zip(
                times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0), strict=True
            ):
                times[key].append(value)
        t6 = time.perf_counter()
        epsilons = store.job_epsilons(job.id)
        read = time.perf_counter() - t6
        assert len(epsilons) == agents
        out = {k: round(statistics.median(v), 4) for k, v in times.items()}
        out["job_epsilons"] = round(read, 4)
        return out
    finally:
        store.close()


#: The prior histories: two DP-SGD-like events per client, in cohort-dependent proportions.
PRIOR = (
    PoissonSampledEvent(1e-3, GaussianEvent.from_multiplier(1.0)),
    PoissonSampledEvent(1e-2, GaussianEvent.from_multiplier(3.0)),
)
NEW_EVENT = PoissonSampledEvent(1e-3, GaussianEvent.from_multiplier(1.0))


def measure_history(url: str, agents: int, prior: int, rounds: int, cohorts: int) -> dict[str, Any]:
    """Median seconds of ``commit_round`` charging ``agents`` clients with ``prior`` events
    each, and the peak RSS."""
    store = SqlStore(url)
    try:
        ids = [store.create_agent(name=f"a{i}", budget=Budget(1e6, 1e-5)).id for i in range(agents)]
        before = store.create_job(JOB, members=ids)
        job = store.create_job(JOB, members=ids)
        store.set_job_status(job.id, JobStatus.RUNNING)
        groups = []
        for i, a in enumerate(ids):
            first = prior - (i % cohorts + 1) * max(1, prior // (4 * cohorts))
            for event, n in zip(PRIOR, (first, prior - first), strict=True):
                text = canonical_event(event)
                groups.append(HistoryGroup(a, before.id, "agent/add_remove", text, n))
        with store._transaction(write=True) as tx:  # seeding: see the module docstring
            tx.add_history(groups)
        clear_history_cache()  # every database starts cold
        times = []
        for number in range(1, rounds + 1):
            rnd = store.start_round(job.id, number, invited=ids[:1])
            t0 = time.perf_counter()
            store.commit_round(rnd.id, [Charge(a, NEW_EVENT, ProtectedUnit.AGENT) for a in ids])
            times.append(time.perf_counter() - t0)
            store.complete_round(rnd.id)
        figure = store.client_budget(ids[0], include_events=False)
        return {
            "commit_median_s": round(statistics.median(times), 4),
            "commit_max_s": round(max(times), 4),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "epsilon": round(figure.epsilon, 4),
            "method": figure.method,
        }
    finally:
        store.close()


@contextlib.contextmanager
def _database(backend: str, server: str) -> Iterator[str]:
    """A fresh, empty database of ``backend``, removed afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'ledger.db'}"
    else:
        with fresh_postgres(server, "ledger") as url:
            yield url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="server to create a DB on")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--prior-events", type=int, default=0, help="events per client before")
    parser.add_argument("--cohorts", type=int, default=4, help="distinct prior histories")
    args = parser.parse_args(argv)
    backends = ["sqlite"]
    if not args.no_postgres:
        reason = unreachable(args.postgres)
        if reason is None:
            backends.append("postgresql")
        else:  # the server is optional: say why, measure SQLite
            print(f"postgresql skipped: {reason}", file=sys.stderr)
    for backend in backends:
        for n in args.agents:
            with _database(backend, args.postgres) as url:
                if args.prior_events > 0:
                    line: dict[str, Any] = {
                        "benchmark": "ledger_history",
                        "database": backend,
                        "agents": n,
                        "prior_events": args.prior_events,
                        "cohorts": args.cohorts,
                        "rounds": args.rounds,
                        **measure_history(url, n, args.prior_events, args.rounds, args.cohorts),
                    }
                else:
                    line = {
                        "benchmark": "ledger",
                        "database": backend,
                        "agents": n,
                        "rounds": args.rounds,
                        **measure(url, n, args.rounds),
                    }
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
