"""Test-only: ``deploy/k8s`` folders as ``make image-test`` overlays them, in a temporary folder,
and the scripts that render and play them (``scripts/`` on the import path)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import ModuleType

import yaml

from support.paths import ROOT
from support.scripts import load_script

SCRIPTS = ROOT / "scripts"


def script(name: str) -> ModuleType:
    """The script NAME of scripts/ as a module; its sibling scripts import by bare name."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return load_script(SCRIPTS / f"{name}.py", name, register=True)


def base(part: str, target: Path, files: dict[str, str]) -> Path:
    """A copy of one part of deploy/k8s with ``secrets/`` files written."""
    folder = target / "base"
    folder.mkdir(parents=True)
    for source in (ROOT / "deploy" / "k8s" / part).glob("*.yaml"):
        shutil.copy(source, folder / source.name)
    for relative, text in files.items():
        path = folder / "secrets" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def coordinator(tmp: Path) -> Path:
    folder = tmp / "coordinator"
    base(
        "coordinator",
        folder,
        {
            "admin.env": "ADMIN_TOKEN=admin-secret-value\n",
            "postgres.env": "# the database\nPASSWORD=pg-secret-value\n",
            "tls/coordinator.pem": "COORDINATOR CERT\n",
            "tls/coordinator.key": "COORDINATOR KEY\n",
            "tls/ca.pem": "CA CERT\n",
        },
    )
    overlay = {
        "resources": ["base"],
        "images": [
            {
                "name": "dpfl-coordinator",
                "newName": "localhost/dpfl-coordinator",
                "newTag": "latest",
            },
            {"name": "postgres", "newName": "localhost/dpfl-postgres", "newTag": "15"},
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return folder


def silo(tmp: Path, name: str) -> Path:
    folder = tmp / name
    base(
        "agent",
        folder,
        {
            "ca.pem": "CA CERT\n",
            "agent.pem": f"{name} CERT\n",
            "agent.key": f"{name} KEY\n",
            "enrollment-token": f"token-of-{name}\n",
        },
    )
    overlay = {
        "resources": ["base"],
        "nameSuffix": f"-{name}",
        "images": [{"name": "dpfl-agent", "newName": "localhost/dpfl-agent", "newTag": "latest"}],
        "configMapGenerator": [
            {
                "name": "dpfl-agent",
                "behavior": "merge",
                "literals": [
                    "DPFL_COORDINATOR=dpfl-coordinator.dpfl.svc:50051",
                    f"DPFL_AGENT_NAME={name}",
                ],
            }
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return folder
