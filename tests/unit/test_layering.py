"""The import rules of the table of docs/architecture.md#packages, checked on the source (AST)
and at run time.

- each folder imports only the dpfl packages of its "may import" column (``MAY_IMPORT``): so
  ``server`` and ``client`` never import each other, nothing but ``cli`` imports ``dpfl.cli``,
  and ``cli`` imports of ``dpfl`` only the library API ``dpfl.simulation`` (``api/simulation``),
  which imports neither ``dpfl.cli`` nor the rest of ``dpfl``;
- ``accounting``, ``secagg``, ``mechanisms`` and ``cmdline`` import no torch, gRPC, protobuf, SQL
  or web framework;
- ``secagg`` holds the protocol alone: it never imports ``mechanisms`` (the DP encoding and noise,
  which stand on its ring and randomness);
- ``learning`` imports no transport;
- ``protos`` imports only grpc/protobuf/numpy and the pure ``secagg`` (to convert its messages).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import CODE_PACKAGES, ROOT

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

#: The dpfl packages each code folder may import besides its own (the package table).
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "accounting": (),
    "secagg": (),
    "mechanisms": ("secagg",),
    "cmdline": (),
    "learning": ("accounting", "secagg", "mechanisms"),
    "protos": ("secagg",),
    "server": ("accounting", "secagg", "mechanisms", "learning", "protos", "cmdline"),
    "client": ("accounting", "secagg", "mechanisms", "learning", "protos", "cmdline"),
    # the ``dpfl`` command is a thin shell over the library API ``dpfl.simulation``
    "cli": (
        "accounting",
        "secagg",
        "mechanisms",
        "learning",
        "protos",
        "server",
        "client",
        "cmdline",
        "api/simulation",
    ),
    # ``dpfl`` itself (the researchers' API) is the base: it never needs the command
    "api": (
        "accounting",
        "secagg",
        "mechanisms",
        "learning",
        "protos",
        "server",
        "client",
        "cmdline",
        "api/simulation",
    ),
    # the simulation library, below both ``dpfl`` and ``dpfl.cli``
    "api/simulation": (
        "accounting",
        "secagg",
        "mechanisms",
        "learning",
        "protos",
        "server",
        "client",
        "cmdline",
    ),
}

#: Subpackages of ``api/`` with rules of their own (a row of the package table each).
SUBPACKAGES = {"dpfl.simulation": "api/simulation"}

#: The folder of each dpfl package; any other ``dpfl.<name>`` is a module of ``api/`` (``dpfl``).
_FOLDER_OF = {package: folder for folder, package in CODE_PACKAGES.items()} | SUBPACKAGES

#: Third-party modules a folder must not import.
FORBIDDEN_LIBRARIES: dict[str, tuple[str, ...]] = {
    "accounting": HEAVY,
    "secagg": HEAVY,
    "mechanisms": HEAVY,
    "cmdline": HEAVY,
    "learning": ("grpc", "google.protobuf", "sqlalchemy", "fastapi"),
    "protos": ("torch", "sqlalchemy", "fastapi"),
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


def _forbidden(folder: str, name: str) -> bool:
    top = name.split(".")
    if top[0] == "dpfl":
        package = _FOLDER_OF.get(".".join(top[:2]), "api")
        return package != folder and package not in MAY_IMPORT[folder]
    return any(
        name == prefix or name.startswith(prefix + ".")
        for prefix in FORBIDDEN_LIBRARIES.get(folder, ())
    )


def _violations(folder: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        bad += [
            f"{path.relative_to(ROOT)} imports {name}"
            for name in sorted(_imports(path))
            if _forbidden(folder, name)
        ]
    return bad


def test_every_code_folder_has_rules() -> None:
    assert set(MAY_IMPORT) == set(CODE_PACKAGES) | set(SUBPACKAGES.values())


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_folder_respects_its_import_rules(folder: str) -> None:
    assert _violations(folder) == []


def test_the_command_is_a_shell_over_the_library() -> None:
    """``dpfl.cli`` is the top: nothing imports it, not even the researchers' API; the command
    stands on the library API ``dpfl.simulation`` and on nothing else of ``dpfl``."""
    assert [f for f, allowed in MAY_IMPORT.items() if "cli" in allowed] == []
    assert [f for f, allowed in MAY_IMPORT.items() if "api" in allowed] == []
    assert sorted(f for f, allowed in MAY_IMPORT.items() if "api/simulation" in allowed) == [
        "api",
        "cli",
    ]
    assert _forbidden("server", "dpfl.cli.base")
    assert _forbidden("client", "dpfl.cli")
    assert _forbidden("api", "dpfl.cli.simulate")
    assert _forbidden("api/simulation", "dpfl.cli.sim_report")
    assert _forbidden("api/simulation", "dpfl.privacy")
    assert _forbidden("cli", "dpfl")
    assert _forbidden("cli", "dpfl.privacy")
    assert not _forbidden("cli", "dpfl.simulation")
    assert not _forbidden("cli", "dpfl.simulation.ray_backend")
    assert not _forbidden("api", "dpfl.simulation.run")
    assert not _forbidden("api/simulation", "dpfl.simulation.result")
    assert not _forbidden("cli", "dpfl.server.coordinator")


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import torch\nfrom dpfl.server.store import Store\n")
    assert _imports(sample) == {"torch", "dpfl.server.store"}
    assert _forbidden("client", "dpfl.server.store")
    assert _forbidden("secagg", "torch.nn")
    assert not _forbidden("client", "dpfl.client.gate")


def test_secagg_holds_the_protocol_alone() -> None:
    """The protocol sums ring vectors and never learns how they were made: ``secagg`` may not
    import the mechanisms (encoding, noise), while the mechanisms stand on its ring."""
    assert _forbidden("secagg", "dpfl.mechanisms")
    assert _forbidden("secagg", "dpfl.mechanisms.encoding")
    assert not _forbidden("mechanisms", "dpfl.secagg.randomness")
    assert _forbidden("mechanisms", "torch")
    assert _forbidden("mechanisms", "grpc")
    assert _forbidden("mechanisms", "sqlalchemy.orm")
    assert _forbidden("mechanisms", "dpfl.learning")
    assert _violations("secagg") == []


@pytest.mark.parametrize(
    "package", ["dpfl.accounting", "dpfl.secagg", "dpfl.mechanisms", "dpfl.cmdline"]
)
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


def test_importing_dpfl_is_light() -> None:
    """``import dpfl`` loads nothing of its subpackages; its API names load no torch or gRPC
    until a simulation or a plan runs (a notebook imports it for free)."""
    code = (
        "import sys, dpfl\n"
        "print(sorted(k for k in sys.modules if k.startswith('dpfl.')))\n"
        "dpfl.simulate, dpfl.privacy.epsilon, dpfl.SimulationResult\n"
        f"print(sorted(k for k in sys.modules if k.split('.')[0] in {HEAVY!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.splitlines() == ["[]", "[]"], out.stdout
