"""deploy/compose.yaml: it parses, its services fit together, and its federation is consistent.

``docker compose config`` validates it where the docker client has the compose plugin; these
machines have the docker client without the plugin (and no engine), so that test says so and
is skipped, and the structural checks below stand in for it: references between services,
volumes and bind mounts; health checks where a dependency waits for health; the coordinator on
PostgreSQL with mutual TLS; three agents with distinct certificates, volumes and shares that
match the documented job (``data_spec_for_job``); the CA's key mounted by the init step only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.deploy_files import (
    COMPOSE,
    DEPLOY_DOC,
    compose,
    compose_invocations,
    doc_invocations,
    dockerfile_env,
)
from support.paths import ROOT

from dpfl.client.data import data_spec_for_job
from dpfl.learning.jobs import load_job

SERVICE_KEYS = {
    "image",
    "build",
    "depends_on",
    "environment",
    "entrypoint",
    "command",
    "ports",
    "volumes",
    "healthcheck",
    "restart",
    "user",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
AGENTS = ("silo-1", "silo-2", "silo-3")


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return compose()


def _volumes(service: dict[str, Any]) -> dict[str, str]:
    """Container path → source (a named volume or a ./bind path)."""
    out = {}
    for entry in service.get("volumes", []):
        source, target, *_ = entry.split(":")
        out[target] = source
    return out


def _docker_compose_available() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker client on this machine"
    done = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        return f"the docker client has no compose plugin ({first[0] if first else 'no output'})"
    return None


def test_docker_compose_config_accepts_it() -> None:
    reason = _docker_compose_available()
    if reason is not None:
        pytest.skip(f"docker compose config not run: {reason}; structural checks only")
    env = {**os.environ, "DPFL_ADMIN_TOKEN": "x" * 43, "POSTGRES_PASSWORD": "p" * 32}
    done = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    missing = {k: v for k, v in env.items() if k != "DPFL_ADMIN_TOKEN"}
    refused = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        env=missing,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0
    assert "DPFL_ADMIN_TOKEN" in refused.stderr


def test_services_volumes_and_references_fit_together(doc: dict[str, Any]) -> None:
    assert set(doc) <= {"name", "services", "volumes", "secrets", "networks"} | {
        k for k in doc if k.startswith("x-")
    }
    services = doc["services"]
    assert set(services) == {"postgres", "init", "coordinator", *AGENTS}
    declared = set(doc["volumes"])
    used: set[str] = set()
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, f"{name}: unknown keys {set(service) - SERVICE_KEYS}"
        assert isinstance(service.get("image"), str), f"{name} has no image"
        build = service.get("build")
        if build is not None:
            assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file(), name
        for target, source in _volumes(service).items():
            assert target.startswith("/"), f"{name}: {target}"
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: no bind source {source}"
            else:
                assert source in declared, f"{name}: volume {source!r} is not declared"
                used.add(source)
        for dependency, spec in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert spec["condition"] in CONDITIONS
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
    assert used == declared, f"declared but unused volumes: {declared - used}"


def test_required_secrets_fail_loudly_when_unset() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    variables = set(re.findall(r"(?<!\$)\$\{(\w+)", text))
    assert variables == {"DPFL_ADMIN_TOKEN", "POSTGRES_PASSWORD"}
    for variable in variables:
        assert re.search(rf"\$\{{{variable}:\?[^}}]+\}}", text), f"{variable} has no :? error"
    assert (ROOT / "deploy" / ".gitignore").read_text().splitlines().count(".env") == 1


def test_the_coordinator_runs_on_postgres_with_mutual_tls(doc: dict[str, Any]) -> None:
    services = doc["services"]
    postgres, coordinator = services["postgres"]["environment"], services["coordinator"]
    url = coordinator["environment"]["DPFL_DATABASE_URL"]
    expected = f"postgresql://{postgres['POSTGRES_USER']}:${{POSTGRES_PASSWORD}}@postgres:5432/"
    assert url == expected + postgres["POSTGRES_DB"]
    assert services["init"]["environment"]["DPFL_DATABASE_URL"] == url
    image_env = dockerfile_env("coordinator")
    assert set(coordinator["ports"]) == {
        f"{image_env['DPFL_GRPC_PORT']}:{image_env['DPFL_GRPC_PORT']}",
        f"{image_env['DPFL_API_PORT']}:{image_env['DPFL_API_PORT']}",
    }
    command = coordinator["command"]
    assert "--insecure" not in command
    assert "--require-client-cert" in command
    tls = _volumes(coordinator)
    assert tls["/etc/dpfl/tls"] == "coordinator-tls"
    assert _volumes(services["init"])["/pki/coordinator"] == "coordinator-tls"
    for flag in ("--tls-cert", "--tls-key", "--client-ca"):
        assert command[command.index(flag) + 1].startswith("/etc/dpfl/tls/")
    assert coordinator["healthcheck"]["test"] == ["CMD", "dpfl-coordinator", "healthcheck"]


def test_only_the_init_step_sees_the_ca_key(doc: dict[str, Any]) -> None:
    mounting = [n for n, s in doc["services"].items() if "ca" in _volumes(s).values()]
    assert mounting == ["init"]
    assert _volumes(doc["services"]["init"])["/pki/ca"] == "ca"


def _documented_job() -> Path:
    """The job the compose header and docs/deploy.md submit (image path → repository path)."""
    submits = [
        i
        for i in [*compose_invocations(), *doc_invocations(DEPLOY_DOC)]
        if i.argv[1:3] == ("job", "submit") and i.argv[3].startswith("/opt/dpfl/examples/")
    ]
    header = COMPOSE.read_text(encoding="utf-8")
    paths = {i.argv[3] for i in submits} | set(
        re.findall(r"job submit (/opt/dpfl/examples/\S+)", header)
    )
    assert len(paths) == 1, paths
    return ROOT / "examples" / Path(paths.pop()).name


def test_three_agents_with_their_own_identity_state_and_share(doc: dict[str, Any]) -> None:
    job = load_job(_documented_job())
    init = _volumes(doc["services"]["init"])
    init_script = (COMPOSE.parent / "compose" / "init.sh").read_text(encoding="utf-8")
    silos = re.search(r'SILOS="\$\{SILOS:-([^}]*)\}"', init_script)
    assert silos is not None
    assert tuple(silos.group(1).split()) == AGENTS
    states, tls_volumes = set(), set()
    by_silo = {i.source.split()[-1].split(".")[1].split(":")[0]: i for i in compose_invocations()}
    for index, name in enumerate(AGENTS):
        service = doc["services"][name]
        volumes = _volumes(service)
        argv = by_silo[name].argv
        options = dict(zip(argv[2::2], argv[3::2], strict=False))
        assert argv[:2] == ("dpfl-agent", "run")
        assert options["--data"] == data_spec_for_job(job.data, index=index, agents=len(AGENTS))
        assert options["--coordinator"] == "coordinator:50051"
        assert options["--state-dir"] == "/var/lib/dpfl-agent"
        assert options["--name"] == name
        assert options["--cert"] == f"/etc/dpfl/tls/{name}.pem"
        assert options["--key"] == f"/etc/dpfl/tls/{name}.key"
        assert options["--ca"] == "/etc/dpfl/tls/ca.pem"
        # the token is read from the file, never put on the command line (ps shows it)
        assert options["--enrollment-token-file"] == "/etc/dpfl/tls/enrollment-token"
        assert "--enrollment-token" not in argv
        assert init[f"/pki/{name}"] == volumes["/etc/dpfl/tls"]  # what init wrote for it
        states.add(volumes["/var/lib/dpfl-agent"])
        tls_volumes.add(volumes["/etc/dpfl/tls"])
        assert service["depends_on"]["coordinator"]["condition"] == "service_healthy"
    assert len(states) == len(tls_volumes) == len(AGENTS)
    assert not states & tls_volumes
