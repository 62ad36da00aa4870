"""``make image-test``: a federation in containers, from the images ``make image`` built.

On one podman network: PostgreSQL (Debian's package, ``deploy/docker/postgres.Dockerfile``, when
the images were built on the local base; the registry's ``postgres:16-bookworm`` otherwise), the
coordinator image with its default command (TLS and mutual TLS), and three agent containers.
Each silo makes its own key with ``dpfl-agent keygen`` in the agent image; only the CSR goes to
the CA (a coordinator-image container that alone mounts the CA key), which signs it. Secrets
reach containers through the environment or files, never a command line.

Then: a DP-FedAvg job with secure aggregation for three agents on the embedded digits data is
submitted with the documented command; after its first completed round the coordinator
container is killed (SIGKILL) and started again, and the job must resume and complete with
every round before the kill and every ledger entry intact. Every client's ε is read through
``dpfl budget --ca`` and the REST API, and both must equal the ε recomputed from the ledger's
entries, whose cached curves ``verify_ledger`` recomputes from the stored events. Last, the
HEALTHCHECK is run against this coordinator (HTTPS) and a plaintext one, and neither may log a
bad request. Then the same job runs on the Kubernetes manifests, played with podman
(``scripts/kube_test.py``).

Prints one JSON line (build seconds and image sizes from ``make image``, job seconds, ε per
client, the restart's figures, the podman kube play run's figures); exits 1 on any failure,
naming it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import kube_podman
import kube_test
import podman_env
import yaml
from images import AGENT, COORDINATOR, DEBIAN_IMAGE, REPORT
from kube_test import ledger_figure
from podman_env import ROOT, WORK, PodmanError

from dpfl.client.data import data_spec_for_job
from dpfl.learning.jobs import parse_job
from dpfl.server.store import LedgerEntry, RoundStatus, open_store

PREFIX = "dpfl-it"
NETWORK = f"{PREFIX}-net"
#: fixed addresses, written into every container's /etc/hosts: podman's DNS (aardvark-dns)
#: reloads whenever a container joins the network, and a lookup at that moment can fail
SUBNET = "10.231.17.0/24"
ADDRESSES = {"postgres": "10.231.17.10", "coordinator": "10.231.17.11"}
HOSTS = [f"--add-host={name}:{address}" for name, address in ADDRESSES.items()]
SILOS = ("silo-1", "silo-2", "silo-3")
LOCAL_POSTGRES = "localhost/dpfl-postgres:15"
REGISTRY_POSTGRES = "docker.io/library/postgres:16-bookworm"
UID = 10001  # the images' user
#: DP-FedAvg with secure aggregation, sized for three agents and a few minutes on two cores
JOB = """\
name: image-test-dpfedavg
algorithm: dp-fedavg
data: {dataset: digits, partition: {scheme: iid}, public_fraction: 0.0}
model: logreg
rounds: 10
privacy: {unit: agent, delta: 1.0e-5, target_epsilon: 4.0, honest_fraction: 1.0, noise: skellam}
secagg: {enabled: true, corrupt_fraction: 0.05, dropout_fraction: 0.05}
params: {clip: 1.0, sampling_rate: 1.0, local_steps: 5, learning_rate: 0.5}
"""
BAD_REQUEST = "Invalid HTTP request"
#: what a build could leave in an image by mistake: pip's configuration, mount points, sources
BUILD_LEFTOVERS = "/etc/pip.conf /root/.config/pip /root/.dpfl-build /opt/wheels /opt/dpfl/src"
T = TypeVar("T")


class FederationError(RuntimeError):
    """A check of the federation failed."""


@dataclass
class Report:
    build_seconds: dict[str, float] = field(default_factory=dict)
    image_bytes: dict[str, int] = field(default_factory=dict)
    base: str = ""
    job_seconds: float = 0.0
    rounds: int = 0
    attempts: int = 0
    epsilon: dict[str, float] = field(default_factory=dict)
    #: per silo, charges beyond one per round: committed attempts redone after the kill
    recharged: dict[str, int] = field(default_factory=dict)
    target_epsilon: float = 0.0
    accuracy: float | None = None
    restart: dict[str, float] = field(default_factory=dict)
    #: whether the coordinator's process had loaded libtorch by the end of the job
    coordinator_loads_torch: bool = False
    #: the same job on deploy/k8s played with podman (scripts/kube_test.py)
    kube: dict[str, object] = field(default_factory=dict)


def wait_for(what: str, check: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value is not None and value is not False:
            return value
        time.sleep(every)
    raise FederationError(f"timed out after {timeout:.0f} s waiting for {what}")


def podman(
    *args: str, timeout: float = 300, check: bool = True, env: dict[str, str] | None = None
) -> str:
    """``podman ARGS``; ``env`` adds variables that ``--env NAME`` passes on by name."""
    if env is None:
        return podman_env.run(list(args), timeout=timeout, check=check)
    full = {**podman_env.environment(), **env}
    done = subprocess.run(
        ["podman", *args], env=full, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise PodmanError(
            f"podman {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
        )
    return done.stdout


def clean() -> None:
    """Remove every container, volume and the network of an earlier run."""
    names = podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"name=^{PREFIX}-")
    for name in names.split():
        podman("rm", "--force", "--volumes", "--time", "2", name, check=False)
    volumes = podman("volume", "ls", "--format", "{{.Name}}", "--filter", f"name={PREFIX}-")
    for volume in volumes.split():
        podman("volume", "rm", "--force", volume, check=False)
    podman("network", "rm", "--force", NETWORK, check=False)


class Federation:
    """The containers of one run and the host folders mounted into them."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.secrets = {
            "DPFL_ADMIN_TOKEN": secrets.token_urlsafe(32),
            "POSTGRES_PASSWORD": secrets.token_hex(16),
        }
        self.api_port = 0
        self.pg_port = 0

    @property
    def database_url(self) -> str:
        return f"postgresql://dpfl:{self.secrets['POSTGRES_PASSWORD']}@postgres:5432/dpfl"

    def host_database_url(self) -> str:
        password = self.secrets["POSTGRES_PASSWORD"]
        return f"postgresql://dpfl:{password}@127.0.0.1:{self.pg_port}/dpfl"

    def folder(self, *parts: str) -> Path:
        """A host folder for a bind mount, owned by the images' user."""
        path = self.work.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, UID, UID)
        path.chmod(0o700)
        return path

    def published(self, container: str, port: int) -> int:
        out = podman("port", container, f"{port}/tcp").strip().splitlines()[0]
        return int(out.rsplit(":", 1)[1])


def start_postgres(fed: Federation, image: str) -> None:
    podman(
        "run", "--detach", "--name", f"{PREFIX}-postgres", "--network", NETWORK,
        "--ip", ADDRESSES["postgres"], *HOSTS,
        "--network-alias", "postgres", "--publish", "127.0.0.1::5432",
        "--env", "POSTGRES_USER=dpfl", "--env", "POSTGRES_DB=dpfl", "--env", "POSTGRES_PASSWORD",
        "--volume", f"{PREFIX}-postgres:/var/lib/postgresql/data", image,
        env=fed.secrets,
    )  # fmt: skip
    fed.pg_port = fed.published(f"{PREFIX}-postgres", 5432)
    ready = [
        "exec",
        f"{PREFIX}-postgres",
        "pg_isready",
        "--host",
        "127.0.0.1",
        "--username",
        "dpfl",
    ]
    wait_for("PostgreSQL", lambda: "accepting" in podman(*ready, check=False), 120)


def make_pki(fed: Federation) -> None:
    """The CA and the coordinator's certificate; each silo's key made on the silo, signed."""
    ca = fed.folder("ca")
    podman(
        "run", "--rm", "--volume", f"{ca}:/pki/ca", COORDINATOR, "certs", "init",
        "--out", "/pki/ca",
        "--hostname", "coordinator", "--hostname", "localhost", "--hostname", "127.0.0.1",
    )  # fmt: skip
    tls = fed.folder("coordinator-tls")
    for name in ("ca.pem", "coordinator.pem", "coordinator.key"):
        copy_for_images(ca / name, tls / name)
    for silo in SILOS:
        silo_tls = fed.folder(silo, "tls")
        podman(
            "run", "--rm", "--volume", f"{silo_tls}:/tls", AGENT, "keygen", silo, "--out", "/tls"
        )
        if not (silo_tls / f"{silo}.key").exists():
            raise FederationError(f"dpfl-agent keygen wrote no key for {silo}")
        if (silo_tls / f"{silo}.key").stat().st_mode & 0o077:
            raise FederationError(f"{silo}'s key is readable by others")
        request = fed.folder("requests", silo)
        copy_for_images(silo_tls / f"{silo}.csr", request / f"{silo}.csr")
        podman(
            "run", "--rm", "--volume", f"{ca}:/pki/ca", "--volume", f"{request}:/req",
            COORDINATOR, "certs", "sign", f"/req/{silo}.csr",
            "--ca-dir", "/pki/ca", "--out", "/req",
        )  # fmt: skip
        for name in (f"{silo}.pem", "ca.pem"):
            copy_for_images(request / name, silo_tls / name)


def copy_for_images(source: Path, target: Path) -> None:
    target.write_bytes(source.read_bytes())
    os.chown(target, UID, UID)
    target.chmod(0o600 if target.suffix == ".key" else 0o644)


def start_coordinator(fed: Federation) -> None:
    jobs = fed.work / "jobs"
    jobs.mkdir(exist_ok=True)
    (jobs / "job.yaml").write_text(JOB)
    podman(
        "run", "--detach", "--name", f"{PREFIX}-coordinator", "--network", NETWORK,
        "--ip", ADDRESSES["coordinator"], *HOSTS,
        "--network-alias", "coordinator", "--publish", "127.0.0.1::8080",
        "--env", "DPFL_ADMIN_TOKEN", "--env", "DPFL_DATABASE_URL",
        "--volume", f"{fed.work / 'coordinator-tls'}:/etc/dpfl/tls:ro",
        "--volume", f"{jobs}:/srv/jobs:ro",
        "--volume", f"{PREFIX}-coordinator-state:/var/lib/dpfl", COORDINATOR,
        env={**fed.secrets, "DPFL_DATABASE_URL": fed.database_url},
    )  # fmt: skip
    fed.api_port = fed.published(f"{PREFIX}-coordinator", 8080)
    wait_healthy(f"{PREFIX}-coordinator")


def wait_healthy(container: str, timeout: float = 180) -> None:
    """Until the image's HEALTHCHECK passes (podman runs it on demand: no systemd timers here)."""

    def healthy() -> bool:
        state = podman("inspect", "--format", "{{.State.Status}}", container).strip()
        if state != "running":
            logs = podman("logs", "--tail", "40", container, check=False)
            raise FederationError(f"{container} is {state}:\n{logs}")
        return healthcheck(container)

    wait_for(f"{container}'s HEALTHCHECK", healthy, timeout, every=2)


def healthcheck(container: str) -> bool:
    """``podman healthcheck run``: the image's HEALTHCHECK, once; whether it passed."""
    try:
        podman("healthcheck", "run", container, timeout=60)
    except PodmanError:
        return False
    return True


def enroll_agents(fed: Federation) -> None:
    """A one-time token per silo, from the coordinator container, to a file the agent reads;
    then the agents (all tokens first, so that no agent start races an ``enroll-token``)."""
    for silo in SILOS:
        token = podman(
            "exec", f"{PREFIX}-coordinator", "dpfl-coordinator", "enroll-token",
            "--budget-epsilon", "8", "--label", f"silo={silo}",
        ).strip()  # fmt: skip
        path = fed.work / silo / "tls" / "enrollment-token"
        path.write_text(token + "\n")
        os.chown(path, UID, UID)
        path.chmod(0o600)
    job = parse_job(yaml.safe_load(JOB))
    for index, silo in enumerate(SILOS):
        data = data_spec_for_job(job.data, index=index, agents=len(SILOS))
        podman(
            "run", "--detach", "--name", f"{PREFIX}-{silo}", "--network", NETWORK, *HOSTS,
            "--volume", f"{fed.work / silo / 'tls'}:/etc/dpfl/tls:ro",
            "--volume", f"{PREFIX}-{silo}-state:/var/lib/dpfl-agent", AGENT,
            "run", "--coordinator", "coordinator:50051",
            "--enrollment-token-file", "/etc/dpfl/tls/enrollment-token", "--data", data,
            "--state-dir", "/var/lib/dpfl-agent", "--name", silo, "--ca", "/etc/dpfl/tls/ca.pem",
            "--cert", f"/etc/dpfl/tls/{silo}.pem", "--key", f"/etc/dpfl/tls/{silo}.key",
        )  # fmt: skip


class Api:
    """The coordinator's REST API from the host, over HTTPS verified with the federation's CA."""

    def __init__(self, fed: Federation) -> None:
        self.base = f"https://localhost:{fed.api_port}"
        self.ca = fed.work / "ca" / "ca.pem"
        self.client = httpx.Client(
            base_url=self.base,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            headers={"Authorization": f"Bearer {fed.secrets['DPFL_ADMIN_TOKEN']}"},
            timeout=10,
        )

    def get(self, path: str) -> object:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json()

    def text(self, path: str) -> str:
        response = self.client.get(path)
        response.raise_for_status()
        return response.text


def connected_agents(api: Api) -> int:
    try:
        metrics = api.text("/metrics")
    except httpx.HTTPError:
        return 0
    for line in metrics.splitlines():
        if line.startswith("dpfl_agents_connected "):
            return int(float(line.split()[1]))
    return 0


def job_rounds(api: Api, job_id: str) -> list[dict[str, object]]:
    rounds = api.get(f"/api/v1/jobs/{job_id}/rounds")
    if not isinstance(rounds, list):
        raise FederationError(f"/api/v1/jobs/{job_id}/rounds is not a list: {rounds!r}")
    return [r for r in rounds if isinstance(r, dict)]


def job_status(api: Api, job_id: str) -> str:
    job = api.get(f"/api/v1/jobs/{job_id}")
    return str(job["status"]) if isinstance(job, dict) else ""


@contextmanager
def federation(keep: bool) -> Iterator[Federation]:
    clean()
    work = WORK / "federation"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    podman("network", "create", "--subnet", SUBNET, NETWORK)
    try:
        yield Federation(work)
    finally:
        if not keep:
            clean()


def run_job(fed: Federation, api: Api, report: Report) -> str:
    """Submit the job, kill the coordinator after its first completed round, and let it resume."""
    submitted = podman(
        "exec", f"{PREFIX}-coordinator", "dpfl-coordinator", "job", "submit",
        "/srv/jobs/job.yaml", "--start", "--json",
    )  # fmt: skip
    job_id = str(json.loads(submitted)["id"])
    start = time.monotonic()

    def completed_round() -> list[dict[str, object]] | None:
        rounds = job_rounds(api, job_id)
        if job_status(api, job_id) != "running":
            raise FederationError(f"the job ended before the restart: {job_status(api, job_id)}")
        return rounds if any(r["status"] == "completed" for r in rounds) else None

    wait_for("the job's first completed round", completed_round, 600, every=0.5)
    with open_store(fed.host_database_url()) as store:
        entries_before = {e.id: e for e in store.ledger_entries(job_id=job_id)}
        rounds_before = {
            r.id: r.status
            for r in store.list_rounds(job_id)
            if r.status in ("committed", "completed")
        }
    podman("kill", "--signal", "KILL", f"{PREFIX}-coordinator")
    killed = time.monotonic()
    if job_status_in_db(fed, job_id) != "running":
        raise FederationError("the killed coordinator's job is no longer 'running' in the database")
    podman("start", f"{PREFIX}-coordinator")
    wait_healthy(f"{PREFIX}-coordinator")
    report.restart["healthy_after_seconds"] = round(time.monotonic() - killed, 1)
    report.restart["rounds_done_before_kill"] = float(
        sum(status == "completed" for status in rounds_before.values())
    )
    report.restart["ledger_entries_before_kill"] = float(len(entries_before))

    def finished() -> str | None:
        status = job_status(api, job_id)
        return status if status in ("completed", "failed", "stopped") else None

    status = wait_for("the resumed job to finish", finished, 900, every=1)
    report.job_seconds = round(time.monotonic() - start, 1)
    if status != "completed":
        raise FederationError(f"the job ended {status}: {api.get(f'/api/v1/jobs/{job_id}')}")
    check_nothing_lost(fed, job_id, entries_before, rounds_before, report)
    maps = podman("exec", f"{PREFIX}-coordinator", "cat", "/proc/1/maps")
    report.coordinator_loads_torch = "libtorch" in maps
    return job_id


def job_status_in_db(fed: Federation, job_id: str) -> str:
    with open_store(fed.host_database_url()) as store:
        return str(store.get_job(job_id).status)


def check_nothing_lost(
    fed: Federation,
    job_id: str,
    entries_before: Mapping[int, LedgerEntry],
    rounds_before: Mapping[int, RoundStatus],
    report: Report,
) -> None:
    """Every round and charge from before the kill is still there; every round number completed."""
    job = parse_job(yaml.safe_load(JOB))
    with open_store(fed.host_database_url()) as store:
        rounds = store.list_rounds(job_id)
        entries = {e.id: e for e in store.ledger_entries(job_id=job_id)}
        mismatches = store.verify_ledger().mismatches
    after = {r.id: r for r in rounds}
    for round_id, status in rounds_before.items():
        if round_id not in after or (status == "completed" and after[round_id].status != status):
            raise FederationError(
                f"round record {round_id} ({status} before the kill) was lost or changed"
            )
    for entry_id, entry in entries_before.items():
        if entries.get(entry_id) != entry:
            raise FederationError(f"ledger entry {entry_id} was lost or changed by the restart")
    completed = sorted(r.number for r in rounds if r.status == "completed")
    if completed != list(range(1, job.rounds + 1)):
        raise FederationError(f"completed round numbers {completed}, expected 1..{job.rounds}")
    if mismatches:
        raise FederationError(f"verify_ledger: {mismatches[:3]}")
    report.rounds = len(completed)
    report.attempts = len(rounds)
    accuracies = [r.accuracy for r in rounds if r.status == "completed" and r.accuracy is not None]
    report.accuracy = accuracies[-1] if accuracies else None


def charges_beyond_rounds(entries: Sequence[LedgerEntry], rounds: int) -> int:
    """How many charges exceed one per round, after checking that every round 1..``rounds`` was
    charged (the ledger never under-counts) and that each charge is a distinct attempt."""
    charged = sorted({e.round_number for e in entries})
    if charged != list(range(1, rounds + 1)):
        raise FederationError(f"charged rounds {charged}, expected 1..{rounds}")
    attempts = {(e.round_number, e.attempt) for e in entries}
    if len(attempts) != len(entries):
        raise FederationError("an attempt was charged twice")
    return len(entries) - rounds


def check_budgets(fed: Federation, api: Api, report: Report) -> None:
    """``dpfl budget --ca`` and REST against ε recomputed from the ledger's entries."""
    job = parse_job(yaml.safe_load(JOB))
    delta = job.privacy.delta
    target = job.privacy.target_epsilon
    if target is None:
        raise FederationError("the job names no target ε")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DPFL_")},
        "DPFL_TOKEN": fed.secrets["DPFL_ADMIN_TOKEN"],
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "dpfl"), "budget", "--coordinator", api.base,
            "--ca", str(api.ca), "--delta", str(delta), "--json",
        ],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise FederationError(f"dpfl budget --ca exited {done.returncode}: {done.stderr[-1000:]}")
    cli = {str(c["id"]): float(c["epsilon"]) for c in json.loads(done.stdout)}
    with open_store(fed.host_database_url()) as store:
        names = {a.id: a.certificate_cn or "" for a in store.list_agents()}
        ledger = {}
        recharged = {}
        for agent_id in names:
            entries = store.ledger_entries(agent_id=agent_id)
            recharged[agent_id] = charges_beyond_rounds(entries, job.rounds)
            ledger[agent_id] = ledger_figure(entries, delta)
    if sorted(names.values()) != sorted(SILOS):
        raise FederationError(f"agents bound to {sorted(names.values())}, expected {SILOS}")
    for agent_id, name in names.items():
        rest = api.get(f"/api/v1/clients/{agent_id}/budget?delta={delta}")
        rest_epsilon = float(rest["epsilon"]) if isinstance(rest, dict) else float("nan")
        figures = {"dpfl budget": cli.get(agent_id, float("nan")), "REST": rest_epsilon}
        for source, value in figures.items():
            if not abs(value - ledger[agent_id]) <= 1e-9 * max(1.0, ledger[agent_id]):
                raise FederationError(
                    f"{name}: {source} says ε={value}, the ledger {ledger[agent_id]}"
                )
        # The target holds for one charge per round. A kill between an attempt's ledger commit
        # and its completion makes the redo a second, independent release, charged again
        # (docs/accounting.md, "retries keep the sample"), so the total may then exceed it.
        limit = target * (1 + 1e-9) if recharged[agent_id] == 0 else math.inf
        if not 0 < ledger[agent_id] <= limit:
            raise FederationError(
                f"{name}: ε={ledger[agent_id]} outside (0, {job.privacy.target_epsilon}] "
                "with one charge per round"
            )
        report.epsilon[name] = round(ledger[agent_id], 6)
        report.recharged[name] = recharged[agent_id]
    report.target_epsilon = target


def check_healthchecks(fed: Federation) -> None:
    """The HEALTHCHECK passes against HTTPS (this coordinator) and plain HTTP (a second one
    started with ``--insecure``), and neither coordinator logs a bad request for it."""
    plain = f"{PREFIX}-plaintext"
    podman(
        "run", "--detach", "--name", plain, "--env", "DPFL_ADMIN_TOKEN", COORDINATOR,
        "serve", "--host", "0.0.0.0", "--insecure",
        env=fed.secrets,
    )  # fmt: skip
    wait_healthy(plain)
    for container in (f"{PREFIX}-coordinator", plain):
        for _ in range(3):
            if not healthcheck(container):
                raise FederationError(f"{container}: the HEALTHCHECK failed")
        logs = podman("logs", container)
        if BAD_REQUEST in logs:
            raise FederationError(f"{container} logged a bad request for its HEALTHCHECK")
    podman("rm", "--force", "--volumes", "--time", "2", plain)


def check_images(fed: Federation) -> None:
    """Non-root users, the build's pip configuration in no layer, no secret on a command line."""
    for image in (COORDINATOR, AGENT):
        user = podman("image", "inspect", "--format", "{{.Config.User}}", image).strip()
        if user != "dpfl":
            raise FederationError(f"{image} runs as {user!r}, not dpfl")
        health = podman("image", "inspect", "--format", "{{.Config.Healthcheck}}", image).strip()
        if image == COORDINATOR and "healthcheck" not in health:
            raise FederationError(
                f"{image} has no HEALTHCHECK ({health}): built without --format docker?"
            )
        uid = podman("run", "--rm", "--entrypoint", "id", image, "-u").strip()
        if uid != str(UID):
            raise FederationError(f"{image} runs as uid {uid}, not {UID}")
        leftover = podman(
            "run", "--rm", "--user", "0", "--entrypoint", "/bin/sh", image, "-c",
            f"ls -d {BUILD_LEFTOVERS} 2>/dev/null || true",
        ).split()  # fmt: skip
        if leftover:
            raise FederationError(f"{image} holds what its build left: {leftover}")
        history = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", image)
        for name, value in fed.secrets.items():
            if value in history:
                raise FederationError(f"{image}'s history holds {name}")
    names = podman("ps", "--format", "{{.Names}}", "--filter", f"name=^{PREFIX}-").split()
    for name in names:
        args = podman("inspect", "--format", "{{.Path}} {{.Args}}", name)
        processes = podman("top", name, "args", check=False)
        for secret_name, value in fed.secrets.items():
            if value in args or value in processes:
                raise FederationError(f"{name}: {secret_name} is on a command line")


def run(keep: bool) -> Report:
    report = Report()
    built = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    report.build_seconds = {str(k): float(v) for k, v in built.get("seconds", {}).items()}
    report.base = str(built.get("base", ""))
    local = built.get("base_source") == "local" or podman_env.image_exists(DEBIAN_IMAGE)
    postgres = LOCAL_POSTGRES if local else REGISTRY_POSTGRES
    start = time.monotonic()
    if local:
        podman(
            "build", "--format", "docker", "--file", "deploy/docker/postgres.Dockerfile",
            "--build-arg", f"DEBIAN_IMAGE={DEBIAN_IMAGE}", "--tag", LOCAL_POSTGRES, str(ROOT),
            timeout=1800,
        )  # fmt: skip
    else:
        podman("pull", "--quiet", REGISTRY_POSTGRES, timeout=900)
    report.build_seconds["postgres"] = round(time.monotonic() - start, 1)
    for name, image in (("coordinator", COORDINATOR), ("agent", AGENT), ("postgres", postgres)):
        report.image_bytes[name] = podman_env.image_size(image)
    with federation(keep) as fed:
        start_postgres(fed, postgres)
        make_pki(fed)
        start_coordinator(fed)
        enroll_agents(fed)
        api = Api(fed)
        wait_for("three connected agents", lambda: connected_agents(api) == len(SILOS), 300, 2)
        check_images(fed)
        run_job(fed, api, report)
        check_budgets(fed, api, report)
        for silo in SILOS:
            state = podman("inspect", "--format", "{{.State.Status}}", f"{PREFIX}-{silo}").strip()
            if state != "running":
                raise FederationError(
                    f"{silo} is {state} after the job: {podman('logs', f'{PREFIX}-{silo}')}"
                )
        check_healthchecks(fed)
    images = {"dpfl-coordinator": COORDINATOR, "dpfl-agent": AGENT, "postgres": postgres}
    report.kube = asdict(kube_test.run(JOB, images, keep))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", action="store_true", help="leave the containers running")
    args = parser.parse_args(argv)
    try:
        report = run(args.keep)
    except (
        FederationError,
        PodmanError,
        httpx.HTTPError,
        kube_test.KubeTestError,
        kube_podman.KubePlayError,
    ) as exc:
        print(f"image-test: FAILED: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(report), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
