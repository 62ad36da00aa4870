"""scripts/kustomize.py: the render of deploy/k8s and of ``make image-test``'s overlays is what
``kubectl kustomize`` gives (compared where kubectl exists), and what it does not implement is
refused by name, never ignored."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube_overlays import coordinator, script, silo

kustomize = script("kustomize")


def _by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_the_coordinator_renders_with_its_secrets_and_local_images(tmp_path: Path) -> None:
    objects = _by_key(kustomize.render(coordinator(tmp_path)))
    assert set(objects) == {
        ("Namespace", "dpfl"),
        ("Service", "dpfl-postgres"),
        ("StatefulSet", "dpfl-postgres"),
        ("Service", "dpfl-coordinator"),
        ("PersistentVolumeClaim", "dpfl-coordinator-state"),
        ("Deployment", "dpfl-coordinator"),
        ("Secret", "dpfl-admin"),
        ("Secret", "dpfl-postgres"),
        ("Secret", "dpfl-coordinator-tls"),
    }
    assert all(
        o["metadata"].get("namespace") == "dpfl" for k, o in objects.items() if k[0] != "Namespace"
    )
    postgres = objects[("Secret", "dpfl-postgres")]["data"]
    assert base64.b64decode(postgres["PASSWORD"]).decode() == "pg-secret-value"  # comment skipped
    tls = objects[("Secret", "dpfl-coordinator-tls")]["data"]
    assert base64.b64decode(tls["ca.pem"]).decode() == "CA CERT\n"
    deployment = objects[("Deployment", "dpfl-coordinator")]["spec"]["template"]["spec"]
    assert deployment["containers"][0]["image"] == "localhost/dpfl-coordinator:latest"
    statefulset = objects[("StatefulSet", "dpfl-postgres")]["spec"]["template"]["spec"]
    assert statefulset["containers"][0]["image"] == "localhost/dpfl-postgres:15"


def test_a_silo_overlay_renames_everything_but_the_namespace(tmp_path: Path) -> None:
    objects = _by_key(kustomize.render(silo(tmp_path, "silo-2")))
    assert ("Namespace", "dpfl-agent") in objects
    assert ("Deployment", "dpfl-agent-silo-2") in objects
    config = objects[("ConfigMap", "dpfl-agent-silo-2")]["data"]
    assert config["DPFL_AGENT_NAME"] == "silo-2"  # merged over the base's literal
    assert config["DPFL_AGENT_DATA"] == "csv:/data/records.csv?label=label"  # kept from the base
    spec = objects[("Deployment", "dpfl-agent-silo-2")]["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == "localhost/dpfl-agent:latest"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "dpfl-agent-tls-silo-2"
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == "dpfl-agent-state-silo-2"
    refs = {
        e["name"]: e["valueFrom"].get("configMapKeyRef", e["valueFrom"].get("secretKeyRef"))["name"]
        for e in spec["containers"][0]["env"]
    }
    assert refs["DPFL_ENROLLMENT_TOKEN"] == "dpfl-agent-enrollment-silo-2"
    assert refs["DPFL_COORDINATOR"] == "dpfl-agent-silo-2"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
@pytest.mark.parametrize("which", ["coordinator", "silo"])
def test_the_render_equals_kubectl_kustomize(tmp_path: Path, which: str) -> None:
    folder = coordinator(tmp_path) if which == "coordinator" else silo(tmp_path, "silo-1")
    done = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True
    )
    theirs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert _by_key(kustomize.render(folder)) == _by_key(theirs)


def _kustomization(folder: Path, spec: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return folder


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"commonLabels": {"a": "b"}}, "fields not implemented here: ['commonLabels']"),
        ({"configMapGenerator": [{"name": "x", "literals": ["A=1"]}]}, "disableNameSuffixHash"),
        (
            {
                "configMapGenerator": [{"name": "x", "behavior": "merge", "literals": ["A=1"]}],
                "generatorOptions": {"disableNameSuffixHash": True},
            },
            "no ConfigMap x to merge",
        ),
        (
            {
                "secretGenerator": [{"name": "x", "files": ["../outside"]}],
                "generatorOptions": {"disableNameSuffixHash": True},
            },
            "outside the kustomization's folder",
        ),
        ({"images": [{"name": "a", "newImage": "b"}]}, "fields not implemented: ['newImage']"),
        ({"resources": ["missing.yaml"]}, "resource missing.yaml does not exist"),
        (
            {
                "configMapGenerator": [{"name": "x", "literals": ["NOEQUALS"]}],
                "generatorOptions": {"disableNameSuffixHash": True},
            },
            "is not KEY=VALUE",
        ),
    ],
)
def test_what_is_not_implemented_is_refused(
    tmp_path: Path, spec: dict[str, Any], message: str
) -> None:
    (tmp_path / "outside").write_text("x")
    folder = _kustomization(tmp_path / "k", spec)
    with pytest.raises(
        kustomize.KustomizeError, match=message.replace("[", r"\[").replace("]", r"\]")
    ):
        kustomize.render(folder)


def test_images_keep_or_replace_tags_and_digests() -> None:
    images = [{"name": "dpfl-agent", "newName": "localhost/dpfl-agent", "newTag": "latest"}]
    assert kustomize._new_image("dpfl-agent:0.1.0", images) == "localhost/dpfl-agent:latest"
    assert kustomize._new_image("other:1", images) == "other:1"
    assert kustomize._new_image("reg:5000/x:1", [{"name": "reg:5000/x", "newTag": "2"}]) == (
        "reg:5000/x:2"
    )
    assert kustomize._new_image("x:1", [{"name": "x", "digest": "sha256:ab"}]) == "x@sha256:ab"
