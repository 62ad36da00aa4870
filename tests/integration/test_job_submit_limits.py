"""``dpfl-coordinator job submit`` holds a document to the REST API's limits: 1 MiB, 32 levels of
nesting, and a short error report, each refusal one clear message and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpfl.server.documents import MAX_JOB_BYTES
from dpfl.server.store import open_store


def _submit(path: Path, db: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "DPFL_DATABASE_URL": f"sqlite:///{db}"}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "dpfl.server.cli.main", "job", "submit", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    return done, time.monotonic() - start


@pytest.mark.parametrize("style", ["yaml", "json"])
def test_deep_nesting_is_a_one_line_error(tmp_path: Path, style: str) -> None:
    """500 levels used to crash with a 3,000-line RecursionError traceback and exit code 1."""
    depth = 500
    doc = tmp_path / f"deep.{style}"
    if style == "json":
        doc.write_text('{"name": "x", "extra": ' + "[" * depth + "]" * depth + "}")
    else:
        doc.write_text("name: x\nextra: " + "[" * depth + "]" * depth + "\n")
    done, _ = _submit(doc, tmp_path / "c.db")
    assert done.returncode == 2, done.stderr[-500:]
    assert done.stderr.strip().splitlines() == [
        "dpfl-coordinator job: invalid job: job document nested too deeply: more than 32 levels "
        "of mappings and lists"
    ]
    with open_store(f"sqlite:///{tmp_path / 'c.db'}") as store:
        assert store.list_jobs() == []


def test_a_document_over_one_mebibyte_is_refused_at_once(tmp_path: Path) -> None:
    """16 MB used to take 47.7 s and 2 GB, and print 30 MB of errors."""
    doc = tmp_path / "big.json"
    fields = {f"f{i}": "v" * 64 for i in range(16 * MAX_JOB_BYTES // 80)}
    doc.write_text(json.dumps({"name": "x", "algorithm": "dp-fedavg", **fields}))
    assert doc.stat().st_size > 16 * MAX_JOB_BYTES * 0.9
    done, seconds = _submit(doc, tmp_path / "c.db")
    assert done.returncode == 2
    assert len(done.stderr) < 500
    assert f"job document too large: over {MAX_JOB_BYTES} bytes" in done.stderr
    assert seconds < 20


def test_error_output_is_bounded(tmp_path: Path) -> None:
    doc = tmp_path / "many.json"
    fields = {f"f{i}": "v" * 100 for i in range(8000)}
    doc.write_text(json.dumps({"name": "x", "algorithm": "dp-fedavg", **fields}))
    assert doc.stat().st_size < MAX_JOB_BYTES
    done, _ = _submit(doc, tmp_path / "c.db")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "dpfl-coordinator job: invalid job:"
    assert len(lines) == 22
    assert lines[-1].strip().startswith("… and ")
    assert len(done.stderr) < 10_000
