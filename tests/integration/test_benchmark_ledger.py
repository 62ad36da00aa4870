"""``benchmarks/ledger.py`` runs end to end at a tiny size: one JSON line per (database, N) with
every store call's median, on SQLite and (when reachable) on a PostgreSQL database it drops again
(timings themselves are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.databases import (
    postgres_admin_url,
    postgres_databases,
    postgres_unreachable_reason,
)
from support.paths import ROOT

pytestmark = pytest.mark.slow

FIELDS = {"population", "check", "start", "stages", "commit", "round", "job_epsilons"}


def _run(*args: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ledger.py"), "--agents", "3", "5", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.strip().splitlines()]


def test_ledger_benchmark_on_sqlite() -> None:
    points = _run("--rounds", "2", "--no-postgres")
    assert [(p["database"], p["agents"]) for p in points] == [("sqlite", 3), ("sqlite", 5)]
    for p in points:
        assert p["benchmark"] == "ledger"
        assert p["rounds"] == 2
        assert set(p) >= FIELDS
        assert all(isinstance(p[k], float) and p[k] >= 0 for k in FIELDS)


@pytest.mark.postgres
def test_ledger_benchmark_on_postgresql_drops_its_database() -> None:
    url = postgres_admin_url()
    reason = postgres_unreachable_reason(url)
    if reason:
        pytest.skip(reason)
    before = postgres_databases(url, "dpfl_ledger_")
    points = _run("--rounds", "1", "--postgres", url)
    assert [(p["database"], p["agents"]) for p in points] == [
        ("sqlite", 3),
        ("sqlite", 5),
        ("postgresql", 3),
        ("postgresql", 5),
    ]
    assert postgres_databases(url, "dpfl_ledger_") == before
