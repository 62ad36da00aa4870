"""``benchmarks/ledger.py`` runs end to end at a tiny size: one JSON line per (database, N) with
every store call's median, on SQLite and (when reachable) on a PostgreSQL database it drops again
(timings themselves are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url
from support.databases import (
    postgres_admin_url,
    postgres_databases,
    postgres_unreachable_reason,
    run_counting_leftovers,
)
from support.limits import hang_guard
from support.paths import ROOT
from support.scripts import load_script

pytestmark = pytest.mark.slow

FIELDS = {"population", "check", "start", "stages", "commit", "round", "job_epsilons"}


ARGV = [sys.executable, str(ROOT / "benchmarks" / "ledger.py"), "--agents", "3", "5"]


def _points(done: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.strip().splitlines()]


def _run(*args: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [*ARGV, *args], capture_output=True, text=True, timeout=hang_guard(20), check=False
    )
    return _points(done)


def test_ledger_benchmark_on_sqlite() -> None:
    points = _run("--rounds", "2", "--no-postgres")
    assert [(p["database"], p["agents"]) for p in points] == [("sqlite", 3), ("sqlite", 5)]
    for p in points:
        assert p["benchmark"] == "ledger"
        assert p["rounds"] == 2
        assert set(p) >= FIELDS
        assert all(isinstance(p[k], float) and p[k] >= 0 for k in FIELDS)


def test_the_commit_over_long_histories_at_a_tiny_size() -> None:
    """``--prior-events``: the commit of clients with prior histories, one JSON line each."""
    points = _run("--rounds", "2", "--prior-events", "50", "--cohorts", "2", "--no-postgres")
    assert [(p["database"], p["agents"]) for p in points] == [("sqlite", 3), ("sqlite", 5)]
    for p in points:
        assert p["benchmark"] == "ledger_history"
        assert p["prior_events"] == 50
        assert p["method"] == "pld"
        assert 0 < p["commit_median_s"] <= p["commit_max_s"]
        assert 0 < p["max_rss_mb"] < 4096
        assert 0 < p["epsilon"] < 10


@pytest.mark.postgres
def test_ledger_benchmark_on_postgresql_drops_its_database() -> None:
    url = postgres_admin_url()
    reason = postgres_unreachable_reason(url)
    if reason:
        pytest.skip(reason)
    history = [*ARGV, "--rounds", "1", "--postgres", url, "--prior-events", "20"]
    done, left = run_counting_leftovers(history, url, "ledger", hang_guard(20))
    assert [(p["benchmark"], p["database"]) for p in _points(done)][2:] == [
        ("ledger_history", "postgresql"),
        ("ledger_history", "postgresql"),
    ]
    assert left == set()
    done, left = run_counting_leftovers(
        [*ARGV, "--rounds", "1", "--postgres", url], url, "ledger", hang_guard(20)
    )
    points = _points(done)
    assert [(p["database"], p["agents"]) for p in points] == [
        ("sqlite", 3),
        ("sqlite", 5),
        ("postgresql", 3),
        ("postgresql", 5),
    ]
    assert left == set()


@pytest.mark.postgres
def test_benchmark_databases_carry_the_pid_the_leftover_check_looks_for() -> None:
    """What makes ``run_counting_leftovers`` see a benchmark's leftovers at all: the name."""
    url = postgres_admin_url()
    reason = postgres_unreachable_reason(url)
    if reason:
        pytest.skip(reason)
    harness = load_script(ROOT / "benchmarks" / "harness" / "postgres.py", "bench_postgres")
    with harness.fresh_postgres(url, "ledger") as made:
        name = make_url(made).database
        assert name is not None
        assert name.startswith(f"dpfl_ledger_{os.getpid()}_")
        assert postgres_databases(url, f"dpfl_ledger_{os.getpid()}_") == {name}
    assert postgres_databases(url, f"dpfl_ledger_{os.getpid()}_") == set()
