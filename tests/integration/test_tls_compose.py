"""The compose federation, run for real without Docker: deploy/compose.yaml's own commands.

There is no container engine on these machines, so this test plays the engine's part for the
things it can: each service's command line is taken from deploy/compose.yaml (and the image's
ENTRYPOINT/ENV from its Dockerfile), container paths are mapped to one temporary folder per
volume, ``coordinator:50051`` resolves to the local port, and every process runs from the
installed package. In order, as ``docker compose up`` would:

1. ``init`` runs deploy/compose/init.sh (CA, coordinator certificate, per-silo certificates and
   enrolment tokens) against the database, twice: the second run must change nothing;
2. ``coordinator`` serves with the compose command (mutual TLS) until its compose health check
   passes;
3. ``silo-1..3`` run their compose shell commands (the token read from the file init wrote);
4. the job is submitted with the documented command, runs to completion, and ``dpfl budget``
   (the documented budget check, over HTTPS with the CA) reports every silo's ε within the job's
   target; every agent is bound to its certificate's CN.

The database is the test PostgreSQL when reachable (as in compose), else a SQLite file.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.databases import fresh_postgres_url, postgres_admin_url, postgres_unreachable_reason
from support.deploy_files import COMPOSE, compose, dockerfile_env, image_command
from support.limits import hang_guard
from support.paths import ROOT

from dpfl.learning.jobs import load_job
from dpfl.server.store import open_store

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
AGENTS = ("silo-1", "silo-2", "silo-3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Emulator:
    """Maps one compose service's view of the world onto this machine."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.doc = compose()
        self.root = root
        self.database_url = database_url
        self.grpc_port, self.api_port = _free_port(), _free_port()
        self.admin_token = secrets.token_urlsafe(32)
        self.volumes: dict[str, Path] = {}
        # init mounts the TLS volumes under /pki: give them the folders PKI=<root>/pki uses
        for entry in self.doc["services"]["init"]["volumes"]:
            source, target, *_ = entry.split(":")
            if target.startswith("/pki/"):
                self.volumes[source] = root / "pki" / target.removeprefix("/pki/")

    def mounts(self, service: str) -> dict[str, Path]:
        """Container path → host path of a service's volumes (longest paths first)."""
        out = {}
        for entry in self.doc["services"][service].get("volumes", []):
            source, target, *_ = entry.split(":")
            if source.startswith("."):
                out[target] = (COMPOSE.parent / source).resolve()
            else:
                out[target] = self.volumes.setdefault(source, self.root / "volumes" / source)
                out[target].mkdir(parents=True, exist_ok=True)
        return dict(sorted(out.items(), key=lambda kv: -len(kv[0])))

    def translate(self, text: str, service: str) -> str:
        for target, host in self.mounts(service).items():
            text = re.sub(rf"{re.escape(target)}(?=/|\s|\"|'|$)", str(host), text)
        text = text.replace("coordinator:50051", f"localhost:{self.grpc_port}")
        text = text.replace("localhost:8080", f"localhost:{self.api_port}")
        text = text.replace("/opt/dpfl/examples/", f"{ROOT / 'examples'}/")
        return text.replace("$$", "$")

    def env(self, service: str, image: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPFL_")}
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        env["HOME"] = str(self.root / "home" / service)
        if image is not None:
            env.update(dockerfile_env(image))
        for key, value in (self.doc["services"][service].get("environment") or {}).items():
            env[key] = self.translate(str(value), service)
        env.update(
            DPFL_DATABASE_URL=self.database_url,
            DPFL_ADMIN_TOKEN=self.admin_token,
            DPFL_TOKEN=self.admin_token,
            DPFL_GRPC_HOST="127.0.0.1",
            DPFL_API_HOST="127.0.0.1",
            DPFL_GRPC_PORT=str(self.grpc_port),
            DPFL_API_PORT=str(self.api_port),
            DPFL_DATA_DIR=str(self.root / "data"),
        )
        return env

    def argv(self, service: str, image: str) -> list[str]:
        spec = self.doc["services"][service]
        entrypoint, cmd = image_command(image)
        if "entrypoint" in spec:
            entrypoint, cmd = list(spec["entrypoint"]), []
        if "command" in spec:
            cmd = list(spec["command"])
        return [self.translate(a, service) for a in entrypoint + cmd]


def _database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if postgres_unreachable_reason(postgres_admin_url()) is None:
        return fresh_postgres_url(request)
    return f"sqlite:///{tmp_path / 'coordinator.db'}"


@pytest.fixture
def emulator(request: pytest.FixtureRequest, tmp_path: Path) -> Emulator:
    return Emulator(tmp_path, _database_url(request, tmp_path))


def _run(argv: list[str], env: Mapping[str, str], timeout: float = hang_guard(15)) -> str:
    done = subprocess.run(
        argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _init(emulator: Emulator) -> None:
    argv = emulator.argv("init", "coordinator")
    assert argv[0] == "/bin/sh"
    env = emulator.env("init", "coordinator")
    env["PKI"] = str(emulator.root / "pki")
    _run(["/bin/sh", *argv[1:]], env)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class Processes:
    """The long-running services, stopped with SIGTERM (what ``docker compose down`` sends)."""

    def __init__(self) -> None:
        self.running: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        self.running[name] = subprocess.Popen(
            argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def check_alive(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                out, err = process.communicate()
                raise AssertionError(f"{name} exited with {process.returncode}: {out}\n{err}")

    def stop(self) -> dict[str, tuple[int, str]]:
        for process in self.running.values():
            if process.poll() is None:
                process.terminate()
        results = {}
        for name, process in self.running.items():
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            results[name] = (process.returncode, out + err)
        return results


@pytest.fixture
def processes() -> Iterator[Processes]:
    running = Processes()
    try:
        yield running
    finally:
        running.stop()


def _wait(what: str, check: Any, processes: Processes, timeout: float) -> Any:
    """Poll ``check`` until it is true; each poll waits at least as long as the last one took,
    so that checks which start a command (Python and its imports) take at most half a core
    from the federation they watch."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        processes.check_alive()
        started = time.monotonic()
        value = check()
        if value:
            return value
        time.sleep(max(0.25, time.monotonic() - started))
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_the_compose_federation_runs_the_documented_job(
    emulator: Emulator, processes: Processes
) -> None:
    # 1. init, idempotent
    _init(emulator)
    before = _snapshot(emulator.root / "pki")
    _init(emulator)
    assert _snapshot(emulator.root / "pki") == before
    with open_store(emulator.database_url) as store:
        tokens = store.list_enrollment_tokens()
    assert len(tokens) == len(AGENTS)
    assert sorted(t.labels["silo"] for t in tokens) == sorted(AGENTS)
    for silo in AGENTS:
        assert (emulator.volumes[f"{silo}-tls"] / f"{silo}.key").stat().st_mode & 0o077 == 0

    # 2. the coordinator, until its compose health check passes
    coordinator_env = emulator.env("coordinator", "coordinator")
    processes.start("coordinator", emulator.argv("coordinator", "coordinator"), coordinator_env)
    health = emulator.doc["services"]["coordinator"]["healthcheck"]["test"]
    assert health[0] == "CMD"

    def healthy() -> bool:
        done = subprocess.run(
            [str(BIN / health[1]), *health[2:]],
            env=coordinator_env,
            capture_output=True,
            text=True,
            check=False,
        )
        return done.returncode == 0

    _wait("the coordinator's health check", healthy, processes, timeout=hang_guard(10))

    # 3. the agents, as compose starts them (a shell reading the token file)
    for silo in AGENTS:
        processes.start(silo, emulator.argv(silo, "agent"), emulator.env(silo, "agent"))

    def budgets() -> list[dict[str, Any]]:
        done = subprocess.run(
            [str(BIN / "dpfl"), "budget", "--json"],
            env=coordinator_env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        clients: list[dict[str, Any]] = json.loads(done.stdout)
        return clients

    _wait("three enrolled agents", lambda: len(budgets()) == len(AGENTS), processes, hang_guard(20))
    ca = coordinator_env["SSL_CERT_FILE"]

    def connected() -> bool:
        metrics = httpx.get(
            f"https://localhost:{emulator.api_port}/metrics",
            headers={"Authorization": f"Bearer {emulator.admin_token}"},
            verify=ssl.create_default_context(cafile=ca),
            timeout=5,
        )
        metrics.raise_for_status()
        return f"dpfl_agents_connected {float(len(AGENTS))}" in metrics.text

    _wait("three connected agents", connected, processes, hang_guard(5))

    # 4. the documented job submission, to completion
    submit = emulator.translate(
        "dpfl-coordinator job submit /opt/dpfl/examples/dp-fedsgd.yaml --start", "coordinator"
    )
    _run([str(BIN / "dpfl-coordinator"), *submit.split()[1:], "--json"], coordinator_env)

    def finished() -> dict[str, Any] | None:
        listed = json.loads(
            _run([str(BIN / "dpfl-coordinator"), "job", "list", "--json"], coordinator_env)
        )
        (job,) = listed
        return job if job["status"] in ("completed", "failed", "stopped") else None

    job = _wait("the job to finish", finished, processes, timeout=hang_guard(60))
    assert job["status"] == "completed", job
    target = load_job(ROOT / "examples" / "dp-fedsgd.yaml").privacy.target_epsilon
    clients = budgets()
    assert len(clients) == len(AGENTS)
    for client in clients:
        assert 0 < client["epsilon"] <= target * (1 + 1e-6), client
    with open_store(emulator.database_url) as store:
        bound = sorted(a.certificate_cn or "" for a in store.list_agents())
    assert bound == sorted(AGENTS)

    results = processes.stop()
    for name, (code, output) in results.items():
        assert code == 0, f"{name} ended with {code}: {output[-2000:]}"
