"""Run ``mypy --strict`` on every ``dpfl`` package from the source tree.

Why a link tree: setuptools maps each code folder into the ``dpfl`` namespace (``server/`` is
``dpfl.server``, see ``[tool.setuptools.package-dir]``), and the editable install resolves that
with an import hook mypy does not follow. ``build/mypy/dpfl/<name>`` links to each folder (and
``build/mypy/dpfl/<module>.py`` and ``build/mypy/dpfl/<subpackage>`` link to the modules and
subpackages of ``api/``, which is ``dpfl`` itself) make
``dpfl.*`` importable for mypy without copying anything. The tree is rebuilt from pyproject.toml
on each run, so a new package is checked as soon as it is mapped there.

Usage: ``python scripts/typecheck.py [mypy options]``; the exit status is mypy's. Paths in mypy's
report are rewritten from the link tree back to the source folders.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "mypy"


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """``dpfl.<name>`` → source folder, as pyproject.toml maps them."""
    with (root / "pyproject.toml").open("rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    ):
        raise SystemExit("pyproject.toml: [tool.setuptools.package-dir] must map names to folders")
    return {str(k): str(v) for k, v in mapping.items()}


def top_subpackages(root: Path = ROOT) -> list[Path]:
    """The subpackages of the folder mapped to ``dpfl`` itself (``api/simulation``: the
    ``dpfl.simulation`` package)."""
    top = root / package_dirs(root)["dpfl"]
    return sorted(p.parent for p in top.glob("*/__init__.py"))


def build_tree(tree: Path = TREE, root: Path = ROOT) -> list[str]:
    """Make ``tree/dpfl/<name>`` a relative link to each mapped folder, and ``tree/dpfl/<file>``
    a link to each module of the folder mapped to ``dpfl`` itself; return the packages.

    Idempotent: existing correct links are kept, stale ones (a package no longer mapped, a link
    pointing elsewhere) are replaced or removed.
    """
    namespace = tree / "dpfl"
    namespace.mkdir(parents=True, exist_ok=True)
    packages: list[str] = []
    wanted: dict[str, tuple[str, bool]] = {}  # name in tree/dpfl -> (link target, is a folder)
    for package, folder in package_dirs(root).items():
        top, _, name = package.partition(".")
        if top != "dpfl" or "." in name:
            raise SystemExit(f"pyproject.toml: package-dir key {package!r} is not dpfl[.<name>]")
        packages.append(package)
        if not name:
            for module in sorted((root / folder).glob("*.py")):
                wanted[module.name] = (os.path.relpath(module, namespace), False)
            for sub in top_subpackages(root):
                wanted[sub.name] = (os.path.relpath(sub, namespace), True)
            continue
        wanted[name] = (os.path.relpath(root / folder, namespace), True)
    for entry in namespace.iterdir():
        if entry.name not in wanted or not entry.is_symlink():
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
            elif entry.name == "__pycache__":
                continue
            else:
                raise SystemExit(f"{entry} is not a link; remove {tree} and run again")
    for name, (target, is_dir) in wanted.items():
        link = namespace / name
        if link.is_symlink() and os.readlink(link) == target:
            continue
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target, target_is_directory=is_dir)
    return packages


def main(argv: list[str] | None = None) -> int:
    packages = build_tree()
    args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    for package in packages:
        # ``-p dpfl`` would walk every subpackage again: the top package's own modules alone
        if package == "dpfl":
            args += ["-m", "dpfl"]
            args += [
                x
                for m in sorted((ROOT / package_dirs()["dpfl"]).glob("*.py"))
                if m.stem != "__init__"
                for x in ("-m", f"dpfl.{m.stem}")
            ]
            args += [x for sub in top_subpackages() for x in ("-p", f"dpfl.{sub.name}")]
        else:
            args += ["-p", package]
    args += sys.argv[1:] if argv is None else argv
    env = {**os.environ, "MYPYPATH": str(TREE)}
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    mapped = {
        f"{TREE.relative_to(ROOT)}/dpfl/{p.partition('.')[2]}/".replace("//", "/"): f"{folder}/"
        for p, folder in package_dirs().items()
    }
    # longest first: ``build/mypy/dpfl/`` (api/) must not catch ``build/mypy/dpfl/server/``
    prefixes = dict(sorted(mapped.items(), key=lambda kv: -len(kv[0])))
    for stream, text in ((sys.stdout, proc.stdout), (sys.stderr, proc.stderr)):
        for line in text.splitlines(keepends=True):
            for link, folder in prefixes.items():
                if line.startswith(link):
                    line = folder + line[len(link) :]
                    break
            stream.write(line)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
