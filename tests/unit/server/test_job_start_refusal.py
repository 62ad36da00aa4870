"""A job that cannot run on the members it would start with is refused at its start (issue 36,
item 2): ``job start`` and ``job submit --start`` answer with one line naming the population,
the problem and what to do (exit 2), nothing but the reason is written, and ``job list`` (text
and JSON) shows the reason. The README's walk-through hit this: 3 agents and the demo job's
shards partition, which needs at least 4."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from support.paths import ROOT

from dpfl.server.cli.main import main
from dpfl.server.store import JobStatus, open_store

DEMO = ROOT / "examples" / "demo-dpfedavg.yaml"


def _cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    """The command's own output: what was written before it is dropped, and INFO records (the
    store's migration notes) are held back while it runs, because handlers that earlier tests of
    the process left on the root logger write them to whatever stderr is now (warnings, errors and
    logged tracebacks still show)."""
    capsys.readouterr()
    logging.disable(logging.INFO)
    try:
        code = main([*args, "--database-url", url])
    finally:
        logging.disable(logging.NOTSET)
    out, err = capsys.readouterr()
    return code, out, err


def _agents(url: str, count: int) -> None:
    with open_store(url) as store:
        for i in range(count):
            store.create_agent(name=f"silo-{i}")


def test_job_start_refuses_a_job_too_large_for_its_agents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code, out, err = _cli(capsys, url, "job", "submit", str(DEMO), "--json")
    assert code == 0, err  # no agent yet: planned for a nominal population
    job_id = json.loads(out)["id"]

    code, _, err = _cli(capsys, url, "job", "start", job_id)
    assert code == 2
    assert "no agent is active" in err
    assert "dpfl-agent run" in err

    _agents(url, 3)
    code, _, err = _cli(capsys, url, "job", "start", job_id)
    assert code == 2
    line = err.strip()
    assert "\n" not in line
    assert "Traceback" not in line
    assert f"job {job_id!r} cannot start on 3 agents (the agents active now)" in line
    assert "cannot cover all 10 classes: it needs at least 4 agents" in line
    assert "enrol more agents" in line
    with open_store(url) as store:
        job = store.get_job(job_id)
        assert job.status == JobStatus.PENDING
        assert store.job_members(job_id) == []  # nothing half-written

    code, out, _ = _cli(capsys, url, "job", "list")
    assert code == 0
    assert out.split("\t")[3] == "pending"
    assert "needs at least 4 agents" in out.split("\t")[4]
    listed = json.loads(_cli(capsys, url, "job", "list", "--json")[1])
    assert "needs at least 4 agents" in listed[0]["error"]

    _agents(url, 1)
    code, out, err = _cli(capsys, url, "job", "start", job_id, "--json")
    assert code == 0, err
    started = json.loads(out)
    assert started["status"] == "running"
    assert started["error"] is None  # the refusal's reason is gone once it runs
    with open_store(url) as store:
        assert len(store.job_members(job_id)) == 4


def test_submit_start_refuses_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code, _, err = _cli(capsys, url, "job", "submit", str(DEMO), "--start")
    assert code == 2
    assert "no agent is active" in err
    _agents(url, 3)
    code, out, err = _cli(capsys, url, "job", "submit", str(DEMO), "--start")
    assert code == 2
    assert out == ""
    assert "cannot start on 3 agents" in err
    assert "needs at least 4 agents" in err
    with open_store(url) as store:
        assert store.list_jobs() == []

    _agents(url, 1)
    code, out, err = _cli(capsys, url, "job", "submit", str(DEMO), "--start")
    assert code == 0, err
    assert out.strip().endswith("running\t4 members")
    with open_store(url) as store:
        (job,) = store.list_jobs()
        assert job.status == JobStatus.RUNNING
        assert job.started_at is not None
