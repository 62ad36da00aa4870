"""The import rules of the table of docs/architecture.md#packages, checked on the source (AST) and
at run time.

- ``server`` and ``client`` never import each other;
- ``accounting`` and ``secagg`` import no torch, gRPC, protobuf, SQL or web framework;
- ``learning`` imports neither transport nor the server and client shells;
- ``protos`` imports only grpc/protobuf/numpy and the pure ``secagg`` (to convert its messages).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

HEAVY = (
    "torch",
    "opacus",
    "grpc",
    "google.protobuf",
    "sqlalchemy",
    "alembic",
    "fastapi",
    "uvicorn",
    "psycopg",
    "httpx",
)

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "accounting": (
        *HEAVY,
        "dpfl.secagg",
        "dpfl.learning",
        "dpfl.protos",
        "dpfl.server",
        "dpfl.client",
        "dpfl.cli",
    ),
    "secagg": (*HEAVY, "dpfl.learning", "dpfl.protos", "dpfl.server", "dpfl.client", "dpfl.cli"),
    "learning": (
        "grpc",
        "google.protobuf",
        "sqlalchemy",
        "fastapi",
        "dpfl.protos",
        "dpfl.server",
        "dpfl.client",
        "dpfl.cli",
    ),
    "protos": (
        "torch",
        "sqlalchemy",
        "fastapi",
        "dpfl.accounting",
        "dpfl.learning",
        "dpfl.server",
        "dpfl.client",
        "dpfl.cli",
    ),
    "server": ("dpfl.client",),
    "client": ("dpfl.server",),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _violations(folder: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for name in _imports(path):
            for prefix in FORBIDDEN[folder]:
                if name == prefix or name.startswith(prefix + "."):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_folder_respects_its_import_rules(folder: str) -> None:
    assert _violations(folder) == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import torch\nfrom dpfl.server.store import Store\n")
    assert _imports(sample) == {"torch", "dpfl.server.store"}


@pytest.mark.parametrize("package", ["dpfl.accounting", "dpfl.secagg"])
def test_pure_packages_do_not_load_heavy_modules(package: str) -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        f"m = importlib.import_module('{package}')\n"
        f"for i in pkgutil.walk_packages(m.__path__, '{package}.'):\n"
        "    importlib.import_module(i.name)\n"
        f"print(sorted(k for k in sys.modules if k.split('.')[0] in {HEAVY!r} or k in {HEAVY!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == "[]", out.stdout
