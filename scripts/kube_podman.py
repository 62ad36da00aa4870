"""Run rendered Kubernetes manifests (``deploy/k8s``) with ``podman kube play``, on podman 4.3.

``python scripts/kube_podman.py up DIR...`` renders each kustomization folder
(``scripts/kustomize.py``) and plays it on one podman network; ``down DIR...`` removes it.
``make image-test`` runs a federation this way (``scripts/kube_test.py``).

podman 4.3 (Debian bookworm's) plays Pods, Deployments, PersistentVolumeClaims and ConfigMaps,
and reads Secrets from podman's own secret store. What the manifests hold beyond that is
translated here, each time to what Kubernetes would do, and anything else is refused by name:

- **Secret** objects become podman secrets, in the two formats 4.3 reads: a Secret read through
  ``secretKeyRef`` is a JSON map of key to base64 value; one mounted as a volume is a Secret
  document whose ``data`` holds the files' text (4.3 writes those values without decoding
  them), mounted with ``optional: false`` written out (4.3 dereferences the field unchecked).
  4.3 has no way to serve one Secret both ways, so that is refused. A mounted Secret becomes a
  named volume of the same name, which 4.3 fills only when it makes it, with mode 0644 whatever
  ``defaultMode`` says: it is made here first, its files with the volume's ``defaultMode`` and
  the pod's ``fsGroup`` as the kubelet writes them (an agent's key is then not readable by
  others); ``down`` removes it.
- **StatefulSet** (one replica): a Deployment of the same pod, with a claim per
  ``volumeClaimTemplates`` entry, named ``TEMPLATE-NAME-0`` as Kubernetes names it.
- **Service**: each pod gets a fixed address on the network (in play order, from ``.10``) and
  every pod an ``/etc/hosts`` entry (``hostAliases``) for each Service name
  (``NAME``, ``NAME.NAMESPACE.svc``, ``NAME.NAMESPACE.svc.cluster.local``) to the address of the
  one workload it selects. Fixed entries, not podman's DNS: aardvark-dns reloads as each
  container joins, and a lookup at that moment can fail.
- **Container ports**: informational in Kubernetes (a Service or a probe names them), but 4.3
  publishes every ``containerPort`` on the host's same port (where the host's own PostgreSQL or
  another coordinator may listen): they are removed, and probes' named ports resolved to numbers.
  Pods are reached at their addresses.
- **``$(VAR)`` references** in env values, command and args: 4.3 leaves them as written, so
  they are expanded here as the kubelet does (from the container's earlier env entries: values,
  ConfigMap and Secret keys; ``$$`` is a literal ``$``). A Secret's value expanded into an env
  value is then in the played file (written readable by root only) and in the container's
  environment, where a ``secretKeyRef`` puts it too; never on a command line unless an argument
  names it.
- **Namespace**: podman has one; two objects of the same kind and name are refused.
- **Order and readiness**: StatefulSets are played first, then Deployments in their order, and
  each pod's readiness probe (an ``exec`` command, or an HTTP(S) GET from the host to the pod's
  address, unverified as the kubelet's) must pass before the next is played, so the coordinator
  starts on a database that answers.

Played pods are left alone by a later ``up`` (give the folders in the same order each time and
the first ones keep their addresses), so agents can be added once their tokens exist.
"""

from __future__ import annotations

import argparse
import base64
import copy
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kustomize
import podman_env
import yaml
from podman_env import WORK, PodmanError

Obj = dict[str, Any]
NETWORK = "dpfl-kube"
SUBNET = "10.231.18.0/24"
PLAYED = WORK / "kube-play"
#: kinds that podman has no use for once translated
DROPPED = {"Namespace", "Service", "Secret", "ConfigMap", "PersistentVolumeClaim"}
SUPPORTED = DROPPED | {"Deployment", "StatefulSet"}


class KubePlayError(RuntimeError):
    """The manifests cannot be played as written, or a pod did not come up."""


@dataclass(frozen=True)
class PodmanSecret:
    name: str
    #: what ``podman secret create`` stores, in the format podman 4.3 reads for its use
    payload: bytes
    mounted: bool
    #: a mounted Secret's files: name -> text, and their mode and group
    files: tuple[tuple[str, str], ...] = ()
    mode: int = 0o644
    group: int = 0


@dataclass(frozen=True)
class Pod:
    """One workload, as the documents of one ``podman kube play``."""

    name: str
    ip: str
    documents: tuple[Obj, ...]
    readiness: Obj | None
    #: the first container's name in the pod spec, for probes and ``exec``
    container: str
    secrets: tuple[str, ...]
    claims: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    pods: tuple[Pod, ...]
    secrets: tuple[PodmanSecret, ...]


def _pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def statefulset_as_deployment(obj: Obj) -> tuple[Obj, list[Obj]]:
    """A one-replica StatefulSet as a Deployment and the claims of its volume templates."""
    name = obj["metadata"]["name"]
    if obj["spec"].get("replicas", 1) != 1:
        raise KubePlayError(f"StatefulSet {name}: only one replica can be played")
    deployment = copy.deepcopy(obj)
    deployment["kind"] = "Deployment"
    spec = deployment["spec"]
    templates = spec.pop("volumeClaimTemplates", [])
    spec.pop("serviceName", None)
    spec.pop("podManagementPolicy", None)
    claims = []
    volumes = spec["template"]["spec"].setdefault("volumes", [])
    for template in templates:
        claim_name = f"{template['metadata']['name']}-{name}-0"
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {**template["metadata"], "name": claim_name},
            "spec": template["spec"],
        }
        claims.append(claim)
        volumes.append(
            {
                "name": template["metadata"]["name"],
                "persistentVolumeClaim": {"claimName": claim_name},
            }
        )
    return deployment, claims


def _volume_modes(spec: Obj) -> dict[str, tuple[int, int]]:
    """Mounted Secret name -> (file mode, group) as the kubelet writes them."""
    group = int(spec.get("securityContext", {}).get("fsGroup", 0))
    return {
        v["secret"]["secretName"]: (int(v["secret"].get("defaultMode", 0o644)), group)
        for v in spec.get("volumes", [])
        if "secret" in v
    }


def _secret_uses(spec: Obj) -> Iterator[tuple[str, bool]]:
    """(Secret name, mounted) for each use in a pod spec."""
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            yield volume["secret"]["secretName"], True
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                yield ref["name"], False
        if any("secretRef" in item for item in container.get("envFrom", [])):
            raise KubePlayError(f"container {container['name']}: envFrom a Secret is not played")


def podman_secret(secret: Obj, mounted: bool, mode: int = 0o644, group: int = 0) -> PodmanSecret:
    """The Secret in the format podman 4.3 reads for that use (see the module docstring)."""
    name = secret["metadata"]["name"]
    data = dict(secret.get("data", {}))
    for key, text in secret.get("stringData", {}).items():
        data[key] = base64.b64encode(str(text).encode()).decode()
    if mounted:
        files = {key: base64.b64decode(value).decode() for key, value in data.items()}
        document = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}
        payload = json.dumps({**document, "data": files}, sort_keys=True)
        return PodmanSecret(name, payload.encode(), True, tuple(sorted(files.items())), mode, group)
    return PodmanSecret(name, json.dumps(data, sort_keys=True).encode(), False)


def _selects(service: Obj, workload: Obj) -> bool:
    selector = service["spec"].get("selector") or {}
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    same_namespace = service["metadata"].get("namespace") == workload["metadata"].get("namespace")
    return bool(selector) and same_namespace and selector.items() <= labels.items()


def service_aliases(services: list[Obj], workloads: list[Obj], ips: dict[str, str]) -> list[Obj]:
    """``hostAliases`` entries: each Service's names to its one workload's address."""
    aliases = []
    for service in services:
        name = service["metadata"]["name"]
        chosen = [w["metadata"]["name"] for w in workloads if _selects(service, w)]
        if len(chosen) != 1:
            raise KubePlayError(f"Service {name} selects {len(chosen)} workloads, not one")
        names = [name]
        namespace = service["metadata"].get("namespace")
        if namespace:
            names += [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
        aliases.append({"ip": ips[chosen[0]], "hostnames": names})
    return aliases


def address(subnet: str, index: int) -> str:
    """The address of the INDEX-th pod played (from 0): the subnet's .10 onwards."""
    return str(list(ipaddress.ip_network(subnet).hosts())[9 + index])


def plan(parts: Sequence[list[Obj]], subnet: str = SUBNET) -> Plan:
    """The pods and podman secrets that play these rendered kustomizations, in order."""
    objects = [copy.deepcopy(o) for part in parts for o in part]
    seen: set[tuple[str, str]] = set()
    for obj in objects:
        if obj["kind"] not in SUPPORTED:
            raise KubePlayError(f"{obj['kind']} {obj['metadata']['name']}: not played here")
        if _key(obj) in seen and obj["kind"] != "Namespace":
            raise KubePlayError(f"{obj['kind']} {obj['metadata']['name']}: twice (one namespace)")
        seen.add(_key(obj))
    claims = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    workloads = []
    for obj in [o for o in objects if o["kind"] == "StatefulSet"]:
        deployment, made = statefulset_as_deployment(obj)
        workloads.append(deployment)
        claims.update({c["metadata"]["name"]: c for c in made})
    for obj in [o for o in objects if o["kind"] == "Deployment"]:
        if obj["spec"].get("replicas", 1) != 1:
            raise KubePlayError(f"Deployment {obj['metadata']['name']}: only one replica")
        workloads.append(obj)
    ips = {w["metadata"]["name"]: address(subnet, i) for i, w in enumerate(workloads)}
    services = [o for o in objects if o["kind"] == "Service"]
    aliases = service_aliases(services, workloads, ips)
    secret_objects = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    uses: dict[str, bool] = {}
    modes: dict[str, tuple[int, int]] = {}
    pods = []
    for workload in workloads:
        spec = _pod_spec(workload)
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            unpublish(container)
            expand_references(container, config_maps, secret_objects)
        spec["hostAliases"] = [*spec.get("hostAliases", []), *aliases]
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                volume["secret"]["optional"] = False
        modes.update(_volume_modes(spec))
        for secret_name, mounted in _secret_uses(spec):
            if secret_name not in secret_objects:
                raise KubePlayError(f"{workload['metadata']['name']}: no Secret {secret_name}")
            if uses.setdefault(secret_name, mounted) != mounted:
                raise KubePlayError(
                    f"Secret {secret_name} is used both as a volume and in env: podman 4.3 "
                    "cannot serve both from one secret"
                )
        pod_claims = tuple(
            v["persistentVolumeClaim"]["claimName"]
            for v in spec.get("volumes", [])
            if "persistentVolumeClaim" in v
        )
        missing = [c for c in pod_claims if c not in claims]
        if missing:
            raise KubePlayError(f"{workload['metadata']['name']}: no claim {missing}")
        wanted = _config_map_names(spec)
        if wanted - set(config_maps):
            raise KubePlayError(f"{workload['metadata']['name']}: no ConfigMap {wanted}")
        documents = (
            *(claims[c] for c in pod_claims),
            *(config_maps[n] for n in sorted(wanted)),
            workload,
        )
        first = spec["containers"][0]
        pods.append(
            Pod(
                name=workload["metadata"]["name"],
                ip=ips[workload["metadata"]["name"]],
                documents=documents,
                readiness=first.get("readinessProbe"),
                container=first["name"],
                secrets=tuple(sorted({n for n, _ in _secret_uses(spec)})),
                claims=pod_claims,
            )
        )
    made_secrets = tuple(
        podman_secret(secret_objects[name], mounted, *modes.get(name, (0o644, 0)))
        for name, mounted in sorted(uses.items())
    )
    return Plan(tuple(pods), made_secrets)


_REFERENCE = re.compile(r"\$\$|\$\((\w+)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names replaced, ``$$`` a ``$``, others kept."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(one, text)


def expand_references(container: Obj, config_maps: dict[str, Obj], secrets: dict[str, Obj]) -> None:
    """Expand ``$(VAR)`` in env values, command and args (see the module docstring)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            item["value"] = expand(str(item["value"]), env)
            env[item["name"]] = item["value"]
            continue
        source = item.get("valueFrom", {})
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[item["name"]] = str(config_maps.get(ref["name"], {}).get("data", {})[ref["key"]])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            data = secrets.get(ref["name"], {}).get("data", {})
            env[item["name"]] = base64.b64decode(data[ref["key"]]).decode()
    for key in ("command", "args"):
        if key in container:
            container[key] = [expand(str(word), env) for word in container[key]]


def unpublish(container: Obj) -> None:
    """Drop the container's ports (see the module docstring), resolving probes' named ports."""
    ports = {p["name"]: p["containerPort"] for p in container.pop("ports", []) if "name" in p}
    for probe_kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container.get(probe_kind, {})
        for action in ("httpGet", "tcpSocket"):
            port = probe.get(action, {}).get("port")
            if isinstance(port, str):
                if port not in ports:
                    raise KubePlayError(f"{container['name']} {probe_kind}: no port {port!r}")
                probe[action]["port"] = ports[port]


def _config_map_names(spec: Obj) -> set[str]:
    names = {v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("configMapKeyRef")
            if ref is not None:
                names.add(ref["name"])
        names |= {
            i["configMapRef"]["name"] for i in container.get("envFrom", []) if "configMapRef" in i
        }
    return names


# -- podman ----------------------------------------------------------------------------------------


def podman(*args: str, timeout: float = 300, check: bool = True) -> str:
    return podman_env.run(list(args), timeout=timeout, check=check)


def pod_name(pod: Pod) -> str | None:
    """podman's name for the pod of a workload (4.3: NAME-pod-0; later: NAME-pod), if it exists."""
    names = podman("pod", "ps", "--format", "{{.Name}}").split()
    for candidate in (f"{pod.name}-pod-0", f"{pod.name}-pod"):
        if candidate in names:
            return candidate
    return None


def container_name(pod: Pod) -> str:
    found = pod_name(pod)
    if found is None:
        raise KubePlayError(f"{pod.name} has no pod")
    return f"{found}-{pod.container}"


def running(pod: Pod) -> bool:
    found = pod_name(pod)
    if found is None:
        return False
    state = podman("pod", "inspect", "--format", "{{.State}}", found, check=False).strip()
    return state == "Running"


def ready(pod: Pod) -> bool:
    """The pod's readiness probe passed once (exec in the container, or HTTP(S) GET)."""
    probe = pod.readiness
    if probe is None:
        return running(pod)
    if "exec" in probe:
        return _exit_ok(pod, probe["exec"]["command"])
    get = probe["httpGet"]
    url = f"{get.get('scheme', 'HTTP').lower()}://{pod.ip}:{get['port']}{get.get('path', '/')}"
    try:
        return httpx.get(url, verify=False, timeout=5).status_code < 400
    except httpx.HTTPError:
        return False


def _exit_ok(pod: Pod, command: list[str]) -> bool:
    argv = ["podman", "exec", container_name(pod), *command]
    done = subprocess.run(
        argv, env=podman_env.environment(), capture_output=True, timeout=60, check=False
    )
    return done.returncode == 0


def wait_ready(pod: Pod, timeout: float = 300) -> float:
    """Seconds until the pod's readiness probe passes; raise with its logs when it does not."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if running(pod) and ready(pod):
            return round(time.monotonic() - start, 1)
        time.sleep(2)
    logs = podman("logs", "--tail", "30", container_name(pod), check=False)
    raise KubePlayError(f"{pod.name} was not ready after {timeout:.0f} s:\n{logs}")


def create_secret(secret: PodmanSecret) -> None:
    """``podman secret create`` from a file readable by root only, removed at once."""
    podman("secret", "rm", secret.name, check=False)
    PLAYED.mkdir(parents=True, exist_ok=True)
    path = PLAYED / f".{secret.name}.json"
    _write_private(path, secret.payload.decode())
    try:
        podman("secret", "create", secret.name, str(path))
    finally:
        path.unlink()


def secret_volume(secret: PodmanSecret) -> None:
    """The mounted Secret's volume, made before podman 4.3 would make it (module docstring)."""
    podman("volume", "create", secret.name)
    mountpoint = Path(
        podman("volume", "inspect", "--format", "{{.Mountpoint}}", secret.name).strip()
    )
    for name, text in secret.files:
        path = mountpoint / name
        _write_private(path, text)
        os.chown(path, 0, secret.group)
        path.chmod(secret.mode)


def _write_private(path: Path, text: str) -> None:
    """A file readable by root only (it may hold a secret), replaced whole."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def ensure_network(network: str, subnet: str) -> None:
    if network in podman("network", "ls", "--format", "{{.Name}}").split():
        return
    podman("network", "create", "--subnet", subnet, network)


def pod_file(pod: Pod) -> Path:
    return PLAYED / f"{pod.name}.yaml"


def up(the_plan: Plan, network: str = NETWORK, subnet: str = SUBNET) -> dict[str, float]:
    """Play every pod not running yet, in order, each ready before the next; seconds to ready."""
    ensure_network(network, subnet)
    PLAYED.mkdir(parents=True, exist_ok=True)
    to_play = [p for p in the_plan.pods if not running(p)]
    needed = {name for p in to_play for name in p.secrets}
    for secret in the_plan.secrets:
        if secret.name in needed:
            create_secret(secret)
            if secret.mounted:
                podman("volume", "rm", "--force", secret.name, check=False)
                secret_volume(secret)
    seconds = {}
    volumes = set(podman("volume", "ls", "--format", "{{.Name}}").split())
    for pod in to_play:
        # a claim outlives its pods, as in Kubernetes: an existing one is used, not made again
        documents = [
            d
            for d in pod.documents
            if d["kind"] != "PersistentVolumeClaim" or d["metadata"]["name"] not in volumes
        ]
        _write_private(pod_file(pod), yaml.safe_dump_all(documents, sort_keys=False))
        podman("kube", "play", "--network", network, "--ip", pod.ip, str(pod_file(pod)))
        seconds[pod.name] = wait_ready(pod)
    return seconds


def down(the_plan: Plan, volumes: bool, network: str = NETWORK) -> None:
    """``podman kube down`` each pod, then its secrets; its claims too with ``volumes``."""
    for pod in reversed(the_plan.pods):
        path = pod_file(pod)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_private(path, yaml.safe_dump_all(pod.documents, sort_keys=False))
        podman("kube", "down", str(path), check=False)
        path.unlink()
    for secret in the_plan.secrets:
        podman("secret", "rm", secret.name, check=False)
        if secret.mounted:
            podman("volume", "rm", "--force", secret.name, check=False)
    if volumes:
        for claim in sorted({c for pod in the_plan.pods for c in pod.claims}):
            podman("volume", "rm", "--force", claim, check=False)
    podman("network", "rm", network, check=False)


def plan_folders(folders: Sequence[Path], subnet: str = SUBNET) -> Plan:
    return plan([kustomize.render(folder) for folder in folders], subnet)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("folders", nargs="+", type=Path, help="kustomization folders, in order")
    parser.add_argument("--network", default=NETWORK)
    parser.add_argument("--subnet", default=SUBNET)
    parser.add_argument("--volumes", action="store_true", help="down: remove the claims' volumes")
    args = parser.parse_args(argv)
    try:
        the_plan = plan_folders(args.folders, args.subnet)
        if args.command == "up":
            for name, seconds in up(the_plan, args.network, args.subnet).items():
                print(f"{name}: ready after {seconds} s")
        else:
            down(the_plan, args.volumes, args.network)
    except (kustomize.KustomizeError, KubePlayError, PodmanError) as exc:
        print(f"kube_podman: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
