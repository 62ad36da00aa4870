"""deploy/k8s: every manifest parses, every object is complete, and every reference resolves.

Checked per kustomization (``coordinator``, ``agent``): each object has apiVersion, kind and
metadata.name; workloads select their own pods; containers have an image and an explicit
command, containers that listen have startup/liveness/readiness probes on ports they declare
(the agent listens on nothing: no port, no probe, docs/deploy.md says why); every referenced
Secret, ConfigMap (generated or not), PVC and Service exists in the set; ``$(VAR)`` references
in env values and args refer to variables defined earlier in the container's env (Kubernetes
expands nothing else); the database URL names the PostgreSQL Service; generated Secrets come from
files git ignores. Nothing is applied here: ``make image-test`` plays the manifests with
``podman kube play`` (scripts/kube_test.py), and test_kustomize.py / test_kube_podman.py check
the render and the translation for podman.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
from support.deploy_files import Kustomization, container_env, kustomizations, pod_specs
from support.paths import ROOT

KUSTOMIZATIONS = kustomizations()
IDS = [k.folder.name for k in KUSTOMIZATIONS]
WORKLOADS = ("Deployment", "StatefulSet")
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def test_both_parts_exist() -> None:
    assert IDS == ["agent", "coordinator"]


@pytest.mark.parametrize("kust", KUSTOMIZATIONS, ids=IDS)
def test_every_object_is_complete(kust: Kustomization) -> None:
    assert kust.spec["kind"] == "Kustomization"
    assert kust.spec["namespace"]
    kinds = set()
    for obj in kust.objects:
        assert {"apiVersion", "kind", "metadata"} <= set(obj), obj
        assert obj["metadata"].get("name"), obj
        kinds.add(obj["kind"])
        if obj["kind"] in WORKLOADS:
            selector = obj["spec"]["selector"]["matchLabels"]
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), obj["metadata"]["name"]
            assert obj["spec"]["replicas"] == 1  # one coordinator, one identity per agent
    namespaces = [o for o in kust.objects if o["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == [kust.spec["namespace"]]
    assert {"Deployment", "PersistentVolumeClaim"} <= kinds


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


@pytest.mark.parametrize("kust", KUSTOMIZATIONS, ids=IDS)
def test_containers_have_images_commands_and_probes(kust: Kustomization) -> None:
    for where, spec in pod_specs(kust.objects):
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        for container in spec["containers"]:
            name = f"{where}/{container['name']}"
            assert re.match(r"^[\w./-]+:[\w.-]+$", container["image"]), name
            ports = _ports(container)
            probes = {p for p in PROBES if p in container}
            if container["image"].startswith("dpfl-"):
                assert container["command"][0] in ("dpfl-coordinator", "dpfl-agent"), name
                assert container["securityContext"]["allowPrivilegeEscalation"] is False
            if not ports:
                assert container["image"].startswith("dpfl-agent"), f"{name}: no ports"
                assert not probes  # nothing to probe: see the module docstring
                continue
            assert {"livenessProbe", "readinessProbe"} <= probes, f"{name} lacks probes"
            for probe in probes:
                spec_probe = container[probe]
                if "httpGet" in spec_probe:
                    assert spec_probe["httpGet"]["port"] in ports, f"{name} {probe}"
                    assert spec_probe["httpGet"]["scheme"] == "HTTPS", f"{name} {probe}"
                    assert spec_probe["httpGet"]["path"] in ("/healthz", "/readyz")
                else:
                    assert spec_probe["exec"]["command"], f"{name} {probe}"


@pytest.mark.parametrize("kust", KUSTOMIZATIONS, ids=IDS)
def test_every_reference_resolves(kust: Kustomization) -> None:
    secrets, config_maps = kust.generated("Secret"), kust.generated("ConfigMap")
    pvcs = kust.names("PersistentVolumeClaim")
    services = {o["metadata"]["name"]: o for o in kust.objects if o["kind"] == "Service"}
    for where, spec in pod_specs(kust.objects):
        claims = {
            t["metadata"]["name"]
            for o in kust.objects
            if o["kind"] == "StatefulSet" and f"StatefulSet/{o['metadata']['name']}" == where
            for t in o["spec"].get("volumeClaimTemplates", [])
        }
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for volume in volumes.values():
            if "secret" in volume:
                assert volume["secret"]["secretName"] in kust.names("Secret"), where
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in pvcs, where
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes or mount["name"] in claims, (where, mount)
            defined: set[str] = set()
            for item in container.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", item.get("value", "")):
                    assert ref in defined, f"{where}: $({ref}) used before it is defined"
                source = item.get("valueFrom", {})
                if "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    assert ref["name"] in secrets, f"{where}: no Secret {ref['name']}"
                    keys = secrets[ref["name"]]
                    envs = [k for k in keys if k.startswith("<keys of")]
                    assert ref["key"] in keys or envs, f"{where}: no key {ref['key']}"
                if "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    assert ref["key"] in config_maps[ref["name"]], f"{where}: {ref}"
                defined.add(item["name"])
            for arg in container.get("command", []) + container.get("args", []):
                for ref in re.findall(r"\$\((\w+)\)", arg):
                    assert ref in defined, f"{where}: argument $({ref}) is not in env"
            env = container_env(container, kust)
            url = env.get("DPFL_DATABASE_URL")
            if url is not None:
                host = re.match(r"postgresql://[^@]+@([\w.-]+):5432/\w+$", url)
                assert host is not None, url
                assert host.group(1) in services, url
    for name, service in services.items():
        pods = [
            (w, s)
            for w, s in pod_specs(kust.objects)
            if service["spec"]["selector"].items()
            <= next(
                o["spec"]["template"]["metadata"]["labels"]
                for o in kust.objects
                if f"{o['kind']}/{o['metadata']['name']}" == w
            ).items()
        ]
        assert pods, f"Service {name} selects no pod"
        ports = {p for _, s in pods for c in s["containers"] for p in _ports(c)}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name}: {port}"
    for obj in kust.objects:
        if obj["kind"] == "StatefulSet":
            assert obj["spec"]["serviceName"] in services


@pytest.mark.parametrize("kust", KUSTOMIZATIONS, ids=IDS)
def test_generated_secrets_come_from_files_git_ignores(kust: Kustomization) -> None:
    sources = []
    for generator in kust.spec.get("secretGenerator", []):
        sources += [f.partition("=")[2] or f for f in generator.get("files", [])]
        sources += generator.get("envs", [])
    assert sources
    for source in sources:
        assert source.startswith("secrets/"), source
        path = (kust.folder / source).relative_to(ROOT)
        ignored = subprocess.run(
            ["git", "check-ignore", "--no-index", "-q", str(path)], cwd=ROOT, check=False
        )
        assert ignored.returncode == 0, f"{path} would not be ignored by git"


@pytest.mark.parametrize("kust", KUSTOMIZATIONS, ids=IDS)
def test_files_named_in_arguments_are_in_the_mounted_secrets(kust: Kustomization) -> None:
    """``--tls-cert /etc/dpfl/tls/coordinator.pem`` etc.: the Secret mounted there has that key;
    and both sides run with mutual TLS."""
    secrets = kust.generated("Secret")
    checked = 0
    for _, spec in pod_specs(kust.objects):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            args = container.get("args", [])
            assert "--insecure" not in args
            if args[:1] == ["serve"]:
                assert "--require-client-cert" in args
            if args[:1] == ["run"]:
                assert {"--ca", "--cert", "--key"} <= set(args)
            for mount in container.get("volumeMounts", []):
                secret = volumes.get(mount["name"], {}).get("secret")  # not a claim template
                if secret is None:
                    continue
                prefix = mount["mountPath"].rstrip("/") + "/"
                for arg in args:
                    if arg.startswith(prefix):
                        assert arg.removeprefix(prefix) in secrets[secret["secretName"]], arg
                        checked += 1
    assert checked >= 3


def test_the_agent_takes_its_enrolment_token_from_the_environment() -> None:
    """Never as an argument: any process on the node can list a container's command line."""
    (kust,) = [k for k in KUSTOMIZATIONS if k.folder.name == "agent"]
    for _, spec in pod_specs(kust.objects):
        for container in spec["containers"]:
            args = [str(a) for a in container.get("command", []) + container.get("args", [])]
            assert "--enrollment-token" not in args
            assert not any("ENROLLMENT_TOKEN" in a for a in args)
            env = {e["name"]: e for e in container.get("env", [])}
            assert env["DPFL_ENROLLMENT_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == (
                "enrollment-token"
            )
