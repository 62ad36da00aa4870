"""The three console scripts are installed and answer --help."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = ["dpfl", "dpfl-coordinator", "dpfl-agent"]


def _script(name: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"console script {name} is not installed"
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name: str) -> None:
    out = subprocess.run([_script(name), "--help"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith(f"usage: {name}")


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_no_subcommand_prints_help_and_fails(name: str) -> None:
    out = subprocess.run([_script(name)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "usage:" in out.stdout
