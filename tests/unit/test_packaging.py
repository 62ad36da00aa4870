"""Packaging: every code folder is mapped into the dpfl namespace and nothing else is installed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from support.paths import CODE_PACKAGES, ROOT


def _config() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]  # type: ignore[no-any-return]


def test_every_python_package_folder_is_listed() -> None:
    listed = set(_config()["packages"])  # type: ignore[arg-type]
    found = set()
    for folder, package in CODE_PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "listed packages without an __init__.py"


def test_package_dir_maps_each_folder() -> None:
    mapping = _config()["package-dir"]
    assert mapping == {pkg: folder for folder, pkg in CODE_PACKAGES.items()}


@pytest.mark.slow
def test_wheel_installs_only_the_dpfl_namespace(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("dpfl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"dpfl"}
    assert "dpfl/server/__init__.py" in names
    assert "dpfl/protos/dpfl/v1/agent.proto" in names
    # install the wheel alone into a target folder and import from it, away from the source tree
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import dpfl.server, dpfl.protos; assert dpfl.server.__file__.startswith(sys.argv[1]);"
        "import importlib.util as u; assert u.find_spec('server') is None; "
        "assert u.find_spec('client') is None; "
        # the researchers' API is dpfl itself, a regular package in the wheel
        "import dpfl; assert dpfl.__file__.startswith(sys.argv[1]); "
        "assert dpfl.simulate.__module__ == 'dpfl.simulation.run'; "
        "assert dpfl.privacy.__file__.startswith(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-I", "-c", code, str(target)], check=True, cwd=tmp_path)
