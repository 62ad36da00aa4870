"""``benchmarks/scale.py`` runs end to end at a tiny size: one JSON line per (N, size) with the
documented fields, the PostgreSQL database it created dropped again, and the plot written
(timings themselves are not asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.databases import (
    postgres_admin_url,
    postgres_unreachable_reason,
    run_counting_leftovers,
)
from support.limits import hang_guard
from support.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_scale_benchmark_prints_one_line_per_point(tmp_path: Path) -> None:
    url = postgres_admin_url()
    reason = postgres_unreachable_reason(url)
    if reason:
        pytest.skip(reason)
    plot = tmp_path / "scale.png"
    done, left = run_counting_leftovers(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scale.py"),
            "--agents",
            "3",
            "4",
            "--sizes",
            "500",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--processes",
            "2",
            "--postgres",
            url,
            "--plot",
            str(plot),
        ],
        url,
        "scale",
        hang_guard(40),  # two populations over PostgreSQL, 2 processes
    )
    assert done.returncode == 0, done.stderr[-3000:]
    points = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [(p["agents"], p["size"]) for p in points] == [(3, 500), (4, 500)]
    for p in points:
        assert p["benchmark"] == "scale"
        assert p["database"] == "postgresql"
        assert p["survivors"] == p["agents"]
        assert set(p["stage_p50_s"]) == set(p["stage_p99_s"]) >= {"masked_input", "unmask"}
        assert p["coordinator_peak_rss_mb"] > 0
        assert p["bytes_per_agent_per_round"] > 4 * 500  # at least the model download
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert left == set()


def test_scale_benchmark_runs_the_malicious_secure_variant() -> None:
    """``--threat-model malicious``: every agent of the worker processes holds a peer
    certificate of one federation CA, and the rounds run the consistency stage."""
    url = postgres_admin_url()
    reason = postgres_unreachable_reason(url)
    if reason:
        pytest.skip(reason)
    done, _ = run_counting_leftovers(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scale.py"),
            "--agents",
            "4",
            "--sizes",
            "500",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--processes",
            "2",
            "--postgres",
            url,
            "--threat-model",
            "malicious",
        ],
        url,
        "scale",
        hang_guard(30),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (point,) = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert point["threat_model"] == "malicious"
    assert point["survivors"] == 4
    assert point["stage_p50_s"]["consistency"] > 0
