"""A job may make the coordinator read a file of its host only under a data root (issue 29,
item 7): ``npz:/etc/passwd`` and ``csv:/proc/self/environ?label=x`` were accepted at submit, and
the error at start told whether the file existed and its shape.

Refused at submit (REST 422, ``dpfl-coordinator job submit`` exit 2) with one and the same line
whether the path names a file, a folder or nothing, after ``~``, ``..`` and symlinks are
resolved; accepted under ``--data-root`` or the data dir; checked again before the coordinator
loads a job's data (a job stored before the roots changed). On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from support.api import admin_settings, bearer, make_app, snapshot

from dpfl.learning.jobs import parse_job
from dpfl.server.data_access import DataAccess
from dpfl.server.errors import ConfigurationError
from dpfl.server.orchestrator.data import load_job_data
from dpfl.server.settings import Settings
from dpfl.server.store import Store, open_store

BASE = "http://testserver"


def job(dataset: str, **data: Any) -> dict[str, Any]:
    return {
        "name": "roots",
        "algorithm": "dp-fedavg",
        "rounds": 1,
        "privacy": {"noise_multiplier": 1.0},
        "data": {"dataset": dataset, **data},
    }


def write_npz(path: Path, records: int = 300) -> Path:
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=rng.normal(size=(records, 8)), y=rng.integers(0, 2, size=records))
    return path


@pytest.fixture(autouse=True)
def _no_data_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPFL_DATA_DIR", raising=False)
    monkeypatch.delenv("DPFL_DATA_ROOTS", raising=False)


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    """A data root holding a data set, a symlink out of it, and a secret file beside it."""
    root = tmp_path / "root"
    inside = write_npz(root / "silo.npz")
    secret = write_npz(tmp_path / "outside" / "secret.npz")
    (root / "link.npz").symlink_to(secret)
    (root / "sub").mkdir()
    return {"root": root, "inside": inside, "secret": secret}


def outside_paths(folders: dict[str, Path]) -> list[str]:
    """Specs of files outside the root: existing or not, plain, through ``..``, a symlink, a
    folder, relative to the working folder."""
    root, secret = folders["root"], folders["secret"]
    return [
        "npz:/etc/passwd",
        "csv:/proc/self/environ?label=x",
        "npz:/nonexistent/nothing.npz",
        f"npz:{secret}",
        f"npz:{root}/sub/../../outside/secret.npz",
        f"npz:{root}/link.npz",
        f"npz:{root}/../outside",
        f"npz:{os.path.relpath(secret)}",
        "csv:~/.ssh/id_rsa?label=x",
    ]


def refusal_shape(problem: str, spec: str) -> str:
    return problem.replace(repr(spec), "SPEC")


@pytest.fixture
def backend_store(backend_url: str) -> Iterator[Store]:
    with open_store(backend_url) as store:
        yield store


@pytest.fixture
async def rooted(
    backend_store: Store, folders: dict[str, Path]
) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client of an app whose coordinator has ``folders['root']`` as its data root."""
    settings = admin_settings(data_roots=(folders["root"],))
    app = make_app(backend_store, settings=settings)
    token = settings.admin_token.get_secret_value()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE, headers=bearer(token)) as c:
        yield c


@pytest.mark.anyio
async def test_files_outside_the_data_roots_are_refused_alike_and_write_nothing(
    rooted: httpx.AsyncClient, backend_url: str, folders: dict[str, Path]
) -> None:
    before = snapshot(backend_url)
    shapes = set()
    for spec in outside_paths(folders):
        for doc in (job(spec), job("digits", public={"source": spec, "count": 10})):
            r = await rooted.post("/api/v1/jobs", content=json.dumps(doc))
            assert r.status_code == 422, (spec, r.text)
            (problem,) = r.json()["problems"]
            field = "data.dataset" if doc["data"]["dataset"] == spec else "data.public.source"
            assert problem.startswith(f"{field}: {spec!r} is outside the coordinator's data roots")
            shapes.add(refusal_shape(problem, spec).removeprefix(field))
    assert len(shapes) == 1, shapes  # one answer, whatever the path names
    assert snapshot(backend_url) == before


@pytest.mark.anyio
async def test_files_under_a_data_root_are_accepted(
    rooted: httpx.AsyncClient, folders: dict[str, Path]
) -> None:
    for spec in (f"npz:{folders['inside']}", f"npz:{folders['root']}/sub/../silo.npz"):
        r = await rooted.post("/api/v1/jobs", content=json.dumps(job(spec)))
        assert r.status_code == 201, (spec, r.text)
        assert r.json()["spec"]["data"]["dataset"] == spec


@pytest.mark.anyio
async def test_without_a_data_root_no_file_is_read(
    backend_store: Store, backend_url: str, folders: dict[str, Path]
) -> None:
    settings = admin_settings()
    assert settings.data_roots == ()
    app = make_app(backend_store, settings=settings)
    token = settings.admin_token.get_secret_value()
    before = snapshot(backend_url)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE, headers=bearer(token)) as c:
        for spec in [*outside_paths(folders), f"npz:{folders['inside']}"]:
            r = await c.post("/api/v1/jobs", content=json.dumps(job(spec)))
            assert r.status_code == 422, (spec, r.text)
            (problem,) = r.json()["problems"]
            assert "no data root is configured" in problem
        r = await c.post("/api/v1/jobs", content=json.dumps(job("digits")))
        assert r.status_code == 201, r.text
    assert len(snapshot(backend_url)["jobs"]) == len(before["jobs"]) + 1


def test_the_data_dir_is_a_root(folders: dict[str, Path]) -> None:
    spec = parse_job(job(f"npz:{folders['inside']}"))
    assert DataAccess(data_dir=folders["root"]).problems(spec) == []
    assert DataAccess(data_dir=folders["root"] / "sub").problems(spec) != []


def test_loading_a_stored_job_checks_the_roots_first(folders: dict[str, Path]) -> None:
    """A job stored before the roots changed: the coordinator refuses to read its file, with
    the same message whether it exists or not, and reads it under a root."""
    messages = set()
    for spec in outside_paths(folders):
        with pytest.raises(ConfigurationError) as refused:
            load_job_data(parse_job(job(spec)), population=2)
        messages.add(refusal_shape(str(refused.value), spec))
    assert len(messages) == 1, messages
    (message,) = messages
    assert "no data root is configured" in message
    inside = parse_job(job(f"npz:{folders['inside']}"))
    data = load_job_data(inside, population=2, access=DataAccess(roots=(folders["root"],)))
    assert data.data.input_shape == (8,)


def test_the_data_roots_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token = admin_settings().admin_token
    monkeypatch.setenv("DPFL_DATA_ROOTS", f"/srv/a{os.pathsep}/srv/b")
    assert Settings(admin_token=token).data_roots == (Path("/srv/a"), Path("/srv/b"))
    monkeypatch.setenv("DPFL_DATA_ROOTS", '["/srv/c"]')
    assert Settings(admin_token=token).data_roots == (Path("/srv/c"),)
    assert DataAccess.from_environment().roots == (Path("/srv/c"),)
    monkeypatch.delenv("DPFL_DATA_ROOTS")
    assert Settings(admin_token=token).data_roots == ()


@pytest.mark.slow
def test_job_submit_holds_a_document_to_the_same_roots(
    tmp_path: Path, folders: dict[str, Path]
) -> None:
    database = f"sqlite:///{tmp_path / 'c.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPFL_")}

    def submit(spec: str, *flags: str) -> subprocess.CompletedProcess[str]:
        doc = tmp_path / "job.json"
        doc.write_text(json.dumps(job(spec)))
        command = ["job", "submit", str(doc), "--database-url", database, *flags]
        return subprocess.run(
            [sys.executable, "-m", "dpfl.server.cli.main", *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    refused = submit("npz:/etc/passwd")
    assert refused.returncode == 2, refused.stderr
    assert "data.dataset: 'npz:/etc/passwd' names a file of the coordinator's host" in (
        refused.stderr
    )
    assert "no data root is configured" in refused.stderr
    inside = f"npz:{folders['inside']}"
    assert submit(inside).returncode == 2
    done = submit(inside, "--data-root", str(folders["root"]))
    assert done.returncode == 0, done.stderr
    outside = submit(f"npz:{folders['secret']}", "--data-root", str(folders["root"]))
    assert outside.returncode == 2
    assert "is outside the coordinator's data roots and its data dir" in outside.stderr
