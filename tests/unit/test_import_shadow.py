"""``import dpfl`` from the folder that holds a clone named ``dpfl`` (issue 36, item 6): the
working folder comes first on ``sys.path``, so Python finds the clone before the installed
package; the repository root's ``__init__.py`` hands the import over to the installed package,
and says how to install it when there is none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.paths import ROOT

CHECK = (
    "import dpfl, dpfl.server; "
    "print(dpfl.privacy.__name__, dpfl.simulate.__name__, dpfl.__file__, dpfl.server.__file__)"
)


def test_a_clone_named_dpfl_in_the_working_folder_does_not_shadow_the_package(
    tmp_path: Path,
) -> None:
    (tmp_path / "dpfl").symlink_to(ROOT, target_is_directory=True)  # "git clone ... dpfl"
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    privacy, simulate, package, server = done.stdout.split()
    assert (privacy, simulate) == ("dpfl.privacy", "simulate")
    assert Path(package).name == "__init__.py"
    assert Path(package).parent.name == "api"  # the package, not the clone's root
    assert Path(server).parent.name == "server"


def test_without_an_installed_dpfl_the_clone_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "dpfl").symlink_to(ROOT, target_is_directory=True)
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import dpfl"],  # -S: no site-packages, nothing installed
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "no installed dpfl behind it" in done.stderr
    assert "make install" in done.stderr
    assert "has no attribute" not in done.stderr
