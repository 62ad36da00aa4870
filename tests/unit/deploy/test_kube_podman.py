"""scripts/kube_podman.py: what podman 4.3 is given for deploy/k8s, without podman.

Each translation is checked against what Kubernetes would do with the same manifests: the
database played first and on a claim named as a StatefulSet names it, Service names resolving
to the selected pod, ``$(VAR)`` expanded as the kubelet expands it, no port published on the
host, Secrets in the two formats 4.3 reads, a mounted Secret's mode and group kept; and what
cannot be played is refused by name. ``make image-test`` plays the same plan for real.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from support.kube_overlays import coordinator, script, silo

kustomize = script("kustomize")
kube_podman = script("kube_podman")


@pytest.fixture
def plan(tmp_path: Path) -> Any:
    folders = [coordinator(tmp_path), silo(tmp_path, "silo-1"), silo(tmp_path, "silo-2")]
    return kube_podman.plan_folders(folders)


def _pod(plan: Any, name: str) -> Any:
    (pod,) = [p for p in plan.pods if p.name == name]
    return pod


def _spec(pod: Any) -> dict[str, Any]:
    workload = pod.documents[-1]
    assert workload["kind"] == "Deployment"
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def test_the_database_plays_first_on_its_statefulset_claim(plan: Any) -> None:
    assert [p.name for p in plan.pods] == [
        "dpfl-postgres",
        "dpfl-coordinator",
        "dpfl-agent-silo-1",
        "dpfl-agent-silo-2",
    ]
    assert [p.ip for p in plan.pods] == [f"10.231.18.{i}" for i in (10, 11, 12, 13)]
    assert kube_podman.address(kube_podman.SUBNET, 1) == "10.231.18.11"
    postgres = _pod(plan, "dpfl-postgres")
    assert postgres.claims == ("data-dpfl-postgres-0",)
    assert postgres.documents[0]["kind"] == "PersistentVolumeClaim"
    assert postgres.documents[0]["metadata"]["name"] == "data-dpfl-postgres-0"
    assert "volumeClaimTemplates" not in postgres.documents[-1]["spec"]
    assert postgres.readiness["exec"]["command"][0] == "pg_isready"
    coordinator_pod = _pod(plan, "dpfl-coordinator")
    assert coordinator_pod.readiness["httpGet"] == {
        "path": "/readyz",
        "port": 8080,
        "scheme": "HTTPS",
    }


def test_service_names_resolve_to_the_selected_pods(plan: Any) -> None:
    for pod in plan.pods:
        aliases = {h: a["ip"] for a in _spec(pod)["hostAliases"] for h in a["hostnames"]}
        assert aliases["dpfl-postgres"] == "10.231.18.10"
        assert aliases["dpfl-coordinator.dpfl.svc"] == "10.231.18.11"
        assert aliases["dpfl-coordinator.dpfl.svc.cluster.local"] == "10.231.18.11"


def test_no_port_is_published_and_probes_keep_their_port(plan: Any) -> None:
    for pod in plan.pods:
        for container in _spec(pod)["containers"]:
            assert "ports" not in container
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port", 8080)
                assert port == 8080


def test_references_are_expanded_as_the_kubelet_does(plan: Any) -> None:
    env = {e["name"]: e for e in _spec(_pod(plan, "dpfl-coordinator"))["containers"][0]["env"]}
    url = env["DPFL_DATABASE_URL"]["value"]
    assert url == "postgresql://dpfl:pg-secret-value@dpfl-postgres:5432/dpfl"
    agent = _spec(_pod(plan, "dpfl-agent-silo-1"))["containers"][0]
    assert agent["args"][:3] == ["run", "--coordinator", "dpfl-coordinator.dpfl.svc:50051"]
    assert "--name" in agent["args"]
    assert "silo-1" in agent["args"]
    assert not any("$(" in a for a in agent["args"])
    assert "token-of-silo-1" not in json.dumps(agent["args"])  # the token stays in env only
    assert kube_podman.expand("$$(A) $(A) $(B)", {"A": "x"}) == "$(A) x $(B)"


def test_secrets_are_given_in_the_formats_podman_reads(plan: Any) -> None:
    secrets = {s.name: s for s in plan.secrets}
    admin = secrets["dpfl-admin"]
    assert not admin.mounted
    assert json.loads(admin.payload) == {
        "ADMIN_TOKEN": base64.b64encode(b"admin-secret-value").decode()
    }
    tls = secrets["dpfl-agent-tls-silo-1"]
    assert tls.mounted
    document = json.loads(tls.payload)
    assert document["data"]["agent.key"] == "silo-1 KEY\n"  # text: 4.3 writes it undecoded
    assert dict(tls.files)["agent.key"] == "silo-1 KEY\n"
    assert (tls.mode, tls.group) == (0o440, 10001)
    for pod in plan.pods:
        for volume in _spec(pod).get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["optional"] is False
    assert set(_pod(plan, "dpfl-agent-silo-2").secrets) == {
        "dpfl-agent-enrollment-silo-2",
        "dpfl-agent-tls-silo-2",
    }


def test_config_maps_and_claims_travel_with_their_pod(plan: Any) -> None:
    kinds = [(d["kind"], d["metadata"]["name"]) for d in _pod(plan, "dpfl-agent-silo-1").documents]
    assert kinds == [
        ("PersistentVolumeClaim", "dpfl-agent-state-silo-1"),
        ("PersistentVolumeClaim", "dpfl-agent-data-silo-1"),
        ("ConfigMap", "dpfl-agent-silo-1"),
        ("Deployment", "dpfl-agent-silo-1"),
    ]


def _objects(tmp_path: Path) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = kustomize.render(coordinator(tmp_path))
    return objects


def _workload(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [
        o for o in objects if o["metadata"]["name"] == name and "template" in o.get("spec", {})
    ]
    return found


def test_a_secret_both_mounted_and_in_env_is_refused(tmp_path: Path) -> None:
    objects = _objects(tmp_path)
    spec = _workload(objects, "dpfl-coordinator")["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "admin", "secret": {"secretName": "dpfl-admin"}})
    with pytest.raises(kube_podman.KubePlayError, match="both as a volume and in env"):
        kube_podman.plan([objects])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o: _workload(o, "dpfl-coordinator")["spec"].update(replicas=2), "one replica"),
        (lambda o: _workload(o, "dpfl-postgres")["spec"].update(replicas=3), "one replica"),
        (
            lambda o: o.append({"apiVersion": "v1", "kind": "Ingress", "metadata": {"name": "x"}}),
            "Ingress x: not played here",
        ),
        (
            lambda o: o.append(
                {
                    **_workload(o, "dpfl-coordinator"),
                    "metadata": {"name": "dpfl-coordinator", "namespace": "other"},
                }
            ),
            "twice",
        ),
        (
            lambda o: next(s for s in o if s["kind"] == "Service")["spec"].update(
                selector={"x": "y"}
            ),
            "selects 0 workloads",
        ),
    ],
)
def test_what_cannot_be_played_is_refused(tmp_path: Path, change: Any, message: str) -> None:
    objects = _objects(tmp_path)
    change(objects)
    with pytest.raises(kube_podman.KubePlayError, match=message):
        kube_podman.plan([objects])
