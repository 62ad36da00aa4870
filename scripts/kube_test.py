"""``make image-test``'s second federation: ``deploy/k8s`` as written, played with podman.

The Kubernetes manifests are what a user applies with ``kubectl apply -k``; here they run with
``podman kube play`` (``scripts/kube_podman.py``) after a render (``scripts/kustomize.py``), the
way a user of this machine would, with overlays that change only what a user changes:

- ``coordinator``: ``deploy/k8s/coordinator`` with ``secrets/`` made here (admin token, database
  password, the coordinator's certificate for ``dpfl-coordinator``, ``dpfl-coordinator.dpfl.svc``
  and its address) and ``images`` naming the locally built images;
- ``silo-1`` to ``silo-3``: ``deploy/k8s/agent`` with ``nameSuffix: -silo-N``, ``images``, and the
  ConfigMap's coordinator address (the Service's cluster name), silo name and data share merged
  in; ``secrets/`` holds the silo's key (made in the agent image by ``dpfl-agent keygen``), its
  certificate (``certs sign`` of the CSR), the CA and a one-time enrolment token.

PostgreSQL must answer before the coordinator is played (its readiness probe), the coordinator
before the agents (HTTPS readiness, then the tokens, issued in its container). Then a job is
submitted and started through the REST API (HTTPS verified with the federation's CA, the admin
token), and must complete; every client's ε from ``GET /api/v1/clients/{id}/budget`` must equal
the ε recomputed from its ledger entries and lie within the job's target; every agent must be
bound to its certificate's CN; no secret may be on a command line; each agent's key must have
its Secret volume's mode (0440, group 10001). Last, ``podman kube down``
and nothing of it left.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import kube_podman
import podman_env
import yaml
from podman_env import ROOT, WORK

from dpfl.accounting.history import EventMultiset, canonical_event, history_figure
from dpfl.client.data import data_spec_for_job
from dpfl.learning.jobs import parse_job
from dpfl.server.store import LedgerEntry, open_store
from dpfl.server.store.ledger import relation_of

KUBE = WORK / "kube"
SILOS = ("silo-1", "silo-2", "silo-3")
UID = 10001
#: what the coordinator's Service is called inside the cluster (the agents dial it)
SERVICE_HOST = "dpfl-coordinator.dpfl.svc"
LOCAL_IMAGES = {
    "dpfl-coordinator": "localhost/dpfl-coordinator:latest",
    "dpfl-agent": "localhost/dpfl-agent:latest",
    "postgres": "localhost/dpfl-postgres:15",
}
T = TypeVar("T")


class KubeTestError(RuntimeError):
    """A check of the played manifests failed."""


@dataclass
class KubeReport:
    """The figures of the ``podman kube play`` federation."""

    ready_seconds: dict[str, float] = field(default_factory=dict)
    job_seconds: float = 0.0
    rounds: int = 0
    epsilon: dict[str, float] = field(default_factory=dict)
    down_seconds: float = 0.0
    total_seconds: float = 0.0


def podman(*args: str, timeout: float = 300) -> str:
    return podman_env.run(list(args), timeout=timeout)


def _wait(what: str, check: Callable[[], T | None], timeout: float, every: float = 2.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise KubeTestError(f"timed out after {timeout:.0f} s waiting for {what}")


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _image_folder(path: Path) -> Path:
    """A host folder the images' user may write (bind-mounted for certs and keygen)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, UID, UID)
    return path


def make_pki(coordinator_image: str, agent_image: str, address: str) -> Path:
    """The CA and coordinator certificate; each silo's key made in its image, its CSR signed."""
    ca = _image_folder(KUBE / "pki")
    podman(
        "run", "--rm", "--volume", f"{ca}:/pki", coordinator_image, "certs", "init",
        "--out", "/pki", "--hostname", "dpfl-coordinator", "--hostname", SERVICE_HOST,
        "--hostname", address,
    )  # fmt: skip
    for silo in SILOS:
        keys = _image_folder(KUBE / "keys" / silo)
        podman(
            "run", "--rm", "--volume", f"{keys}:/tls", agent_image, "keygen", silo, "--out", "/tls"
        )
        podman(
            "run", "--rm", "--volume", f"{ca}:/pki", "--volume", f"{keys}:/req",
            coordinator_image, "certs", "sign", f"/req/{silo}.csr", "--ca-dir", "/pki",
            "--out", "/req",
        )  # fmt: skip
    return ca


def _base_copy(part: str, target: Path) -> Path:
    """The committed manifests of one part of deploy/k8s, unchanged, as an overlay's base."""
    base = target / "base"
    base.mkdir(parents=True)
    for source in (ROOT / "deploy" / "k8s" / part).glob("*.yaml"):
        shutil.copy(source, base / source.name)
    return base


def coordinator_folder(images: dict[str, str], credentials: dict[str, str], ca: Path) -> Path:
    folder = KUBE / "coordinator"
    base = _base_copy("coordinator", folder)
    _write(base / "secrets" / "admin.env", f"ADMIN_TOKEN={credentials['admin']}\n")
    _write(base / "secrets" / "postgres.env", f"PASSWORD={credentials['postgres']}\n")
    for name in ("coordinator.pem", "coordinator.key", "ca.pem"):
        _write(base / "secrets" / "tls" / name, (ca / name).read_text())
    overlay = {"resources": ["base"], "images": _image_overrides(images)}
    _write(folder / "kustomization.yaml", yaml.safe_dump(overlay), 0o644)
    return folder


def silo_folder(silo: str, index: int, images: dict[str, str], token: str, job_text: str) -> Path:
    folder = KUBE / silo
    base = _base_copy("agent", folder)
    keys = KUBE / "keys" / silo
    _write(base / "secrets" / "ca.pem", (keys / "ca.pem").read_text())
    _write(base / "secrets" / "agent.pem", (keys / f"{silo}.pem").read_text())
    _write(base / "secrets" / "agent.key", (keys / f"{silo}.key").read_text())
    _write(base / "secrets" / "enrollment-token", token + "\n")
    job = parse_job(yaml.safe_load(job_text))
    data = data_spec_for_job(job.data, index=index, agents=len(SILOS))
    literals = [
        f"DPFL_COORDINATOR={SERVICE_HOST}:50051",
        f"DPFL_AGENT_NAME={silo}",
        f"DPFL_AGENT_DATA={data}",
    ]
    overlay = {
        "resources": ["base"],
        "nameSuffix": f"-{silo}",
        "images": _image_overrides(images),
        "configMapGenerator": [{"name": "dpfl-agent", "behavior": "merge", "literals": literals}],
    }
    _write(folder / "kustomization.yaml", yaml.safe_dump(overlay), 0o644)
    return folder


def _image_overrides(images: dict[str, str]) -> list[dict[str, str]]:
    """kustomize ``images`` entries: the manifests' names to the locally built references."""
    out = []
    for name, ref in sorted(images.items()):
        new_name, _, tag = ref.rpartition(":")
        out.append({"name": name, "newName": new_name, "newTag": tag})
    return out


class Rest:
    """The coordinator's REST API at its pod address, verified with the federation's CA."""

    def __init__(self, address: str, ca: Path, token: str) -> None:
        self.client = httpx.Client(
            base_url=f"https://{address}:8080",
            verify=ssl.create_default_context(cafile=str(ca)),
            headers={"Authorization": f"Bearer {token}"},
            timeout=15,
        )

    def get(self, path: str) -> object:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: str = "", content_type: str = "application/json") -> object:
        response = self.client.post(path, content=body, headers={"Content-Type": content_type})
        if response.status_code >= 400:
            raise KubeTestError(f"POST {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def connected(self) -> int:
        text = self.client.get("/metrics").text
        for line in text.splitlines():
            if line.startswith("dpfl_agents_connected "):
                return int(float(line.split()[1]))
        return 0


def run_job(rest: Rest, job_text: str, report: KubeReport) -> str:
    job = rest.post("/api/v1/jobs", job_text, "application/yaml")
    job_id = str(job["id"]) if isinstance(job, dict) else ""
    rest.post(f"/api/v1/jobs/{job_id}/start")
    start = time.monotonic()

    def finished() -> str | None:
        state = rest.get(f"/api/v1/jobs/{job_id}")
        status = str(state["status"]) if isinstance(state, dict) else ""
        return status if status in ("completed", "failed", "stopped") else None

    status = _wait("the job to finish", finished, 900)
    report.job_seconds = round(time.monotonic() - start, 1)
    if status != "completed":
        raise KubeTestError(f"the job ended {status}: {rest.get(f'/api/v1/jobs/{job_id}')}")
    return job_id


def ledger_figure(entries: Sequence[LedgerEntry], delta: float) -> float:
    """A client's ε recomputed from its ledger rows alone: every entry's event under its
    neighbouring relation, composed as the store composes them (accounting/history.py), so
    REST and ``dpfl budget`` are checked against the rows, not against themselves."""
    history = EventMultiset.of(
        ((relation_of(canonical_event(e.event), e.algorithm, e.unit), canonical_event(e.event)), 1)
        for e in entries
    )
    figure = history_figure(history, delta)
    if not figure.epsilon <= figure.rdp_epsilon * (1 + 1e-9):
        raise KubeTestError(f"tight ε {figure.epsilon} above the RDP bound {figure.rdp_epsilon}")
    return figure.epsilon


def check_budgets(
    rest: Rest, database_url: str, job_text: str, job_id: str, report: KubeReport
) -> None:
    """REST ε per client equals the ledger's; every agent bound to its silo's certificate."""
    job = parse_job(yaml.safe_load(job_text))
    delta, target = job.privacy.delta, job.privacy.target_epsilon
    if target is None:
        raise KubeTestError("the job names no target ε")
    with open_store(database_url) as store:
        names = {a.id: a.certificate_cn or "" for a in store.list_agents()}
        rounds = store.list_rounds(job_id)
        ledger = {}
        for agent_id in names:
            ledger[agent_id] = ledger_figure(store.ledger_entries(agent_id=agent_id), delta)
        mismatches = store.verify_ledger().mismatches
    if sorted(names.values()) != sorted(SILOS):
        raise KubeTestError(f"agents bound to {sorted(names.values())}, expected {SILOS}")
    if mismatches:
        raise KubeTestError(f"verify_ledger: {mismatches[:3]}")
    completed = sorted(r.number for r in rounds if r.status == "completed")
    if completed != list(range(1, job.rounds + 1)):
        raise KubeTestError(f"completed rounds {completed}, expected 1..{job.rounds}")
    report.rounds = len(completed)
    for agent_id, name in names.items():
        budget = rest.get(f"/api/v1/clients/{agent_id}/budget?delta={delta}")
        epsilon = float(budget["epsilon"]) if isinstance(budget, dict) else float("nan")
        if not abs(epsilon - ledger[agent_id]) <= 1e-9 * max(1.0, ledger[agent_id]):
            raise KubeTestError(f"{name}: REST says ε={epsilon}, the ledger {ledger[agent_id]}")
        if not 0 < epsilon <= target * (1 + 1e-9):
            raise KubeTestError(f"{name}: ε={epsilon} outside (0, {target}]")
        report.epsilon[name] = round(epsilon, 6)


def check_command_lines(plan: kube_podman.Plan, secret_values: list[str]) -> None:
    """No secret in any played container's command line or process list."""
    for pod in plan.pods:
        found = kube_podman.pod_name(pod)
        listed = podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"pod={found}")
        for name in listed.split():
            if name.endswith("-infra"):
                continue
            args = podman("inspect", "--format", "{{.Path}} {{.Args}}", name)
            processes = podman_env.run(["top", name, "args"], check=False)
            for value in secret_values:
                if value in args or value in processes:
                    raise KubeTestError(f"{name}: a secret is on a command line")


def check_key_modes(plan: kube_podman.Plan) -> None:
    """Each agent's key as its Secret volume's ``defaultMode`` (0440) and ``fsGroup`` say."""
    for pod in plan.pods:
        if pod.name.startswith("dpfl-agent"):
            argv = ["exec", kube_podman.container_name(pod), "stat", "-c", "%a %g"]
            mode = podman(*argv, "/etc/dpfl/tls/agent.key").split()
            if mode != ["440", str(UID)]:
                raise KubeTestError(
                    f"{pod.name}: agent.key has mode and group {mode}, not 440 {UID}"
                )


def clean() -> None:
    """Take down what an earlier run left (its folders say what it played)."""
    folders = [KUBE / part for part in ("coordinator", *SILOS)]
    folders = [f for f in folders if (f / "kustomization.yaml").exists()]
    if folders:
        try:
            kube_podman.down(kube_podman.plan_folders(folders), volumes=True)
        except (kube_podman.KubePlayError, ValueError) as exc:
            print(f"kube-test: could not take the last run down: {exc}")
    if KUBE.exists():
        subprocess.run(["rm", "-rf", str(KUBE)], check=True)


def run(job_text: str, images: dict[str, str], keep: bool = False) -> KubeReport:
    """Play the manifests, run the job, check the budgets, take it all down; the figures.

    ``images`` maps the manifests' image names (``dpfl-coordinator``, ``dpfl-agent``,
    ``postgres``) to the local references."""
    report = KubeReport()
    start = time.monotonic()
    clean()
    KUBE.mkdir(parents=True)
    credentials = {"admin": secrets.token_urlsafe(32), "postgres": secrets.token_hex(16)}
    # the pods' addresses follow the play order: PostgreSQL (a StatefulSet) first
    address = kube_podman.address(kube_podman.SUBNET, 1)
    ca = make_pki(images["dpfl-coordinator"], images["dpfl-agent"], address)
    coordinator = coordinator_folder(images, credentials, ca)
    plan = kube_podman.plan_folders([coordinator])
    report.ready_seconds.update(kube_podman.up(plan))
    (coordinator_pod,) = [p for p in plan.pods if p.name == "dpfl-coordinator"]
    if coordinator_pod.ip != address:
        raise KubeTestError(f"the coordinator plays at {coordinator_pod.ip}, not {address}")
    tokens = []
    in_pod = kube_podman.container_name(coordinator_pod)
    for silo in SILOS:
        tokens.append(
            podman(
                "exec", in_pod, "dpfl-coordinator", "enroll-token", "--budget-epsilon", "8",
                "--label", f"silo={silo}",
            ).strip()
        )  # fmt: skip
    silos = [silo_folder(s, i, images, tokens[i], job_text) for i, s in enumerate(SILOS)]
    plan = kube_podman.plan_folders([coordinator, *silos])
    try:
        report.ready_seconds.update(kube_podman.up(plan))
        rest = Rest(address, ca / "ca.pem", credentials["admin"])
        _wait("three connected agents", lambda: rest.connected() == len(SILOS), 300)
        check_command_lines(plan, [*credentials.values(), *tokens])
        check_key_modes(plan)
        job_id = run_job(rest, job_text, report)
        (postgres,) = [p for p in plan.pods if p.name == "dpfl-postgres"]
        database_url = f"postgresql://dpfl:{credentials['postgres']}@{postgres.ip}:5432/dpfl"
        check_budgets(rest, database_url, job_text, job_id, report)
    finally:
        if not keep:
            down_start = time.monotonic()
            kube_podman.down(plan, volumes=True)
            report.down_seconds = round(time.monotonic() - down_start, 1)
    if not keep:
        left = podman("pod", "ps", "--format", "{{.Name}}").split()
        if any(name.startswith("dpfl-") for name in left):
            raise KubeTestError(f"podman kube down left pods: {left}")
    report.total_seconds = round(time.monotonic() - start, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("job", type=Path, help="the job document to run")
    parser.add_argument("--keep", action="store_true", help="leave the pods running")
    args = parser.parse_args(argv)
    try:
        report = run(args.job.read_text(), LOCAL_IMAGES, keep=args.keep)
    except (
        KubeTestError,
        kube_podman.KubePlayError,
        podman_env.PodmanError,
        httpx.HTTPError,
    ) as exc:
        print(f"kube-test: FAILED: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(report), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
