"""deploy/docker: the two Dockerfiles are conventional, minimal and complete.

``make image-test`` builds the images with podman and runs them (scripts/image_test.py); it
needs podman and minutes, so what can be checked without them is checked here: a non-root
user; ports, volume and health check consistent with the coordinator's settings; the PyTorch
selection (CPU wheel of the Makefile's TORCH_SPEC by default, a CUDA base image keeps its own
torch); every package folder of pyproject.toml copied, none of them excluded by .dockerignore,
and exactly those copies building a wheel that holds the commands, the migrations, the
dashboard and the proto file.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from support.deploy_files import DOCKERFILES, dockerfile, dockerfile_env, image_command
from support.paths import ROOT

NAMES = sorted(DOCKERFILES)


def _args(name: str) -> dict[str, str]:
    out = {}
    for word, rest in dockerfile(DOCKERFILES[name]):
        if word == "ARG":
            key, _, value = rest.partition("=")
            out[key] = value
    return out


def _copies(name: str) -> list[tuple[str, str]]:
    """(source, destination) of every COPY from the build context."""
    pairs = []
    for word, rest in dockerfile(DOCKERFILES[name]):
        if word == "COPY" and "--from" not in rest:
            *sources, destination = rest.split()
            pairs += [(source, destination) for source in sources]
    return pairs


def _dockerignored(path: str) -> bool:
    """Docker's rule: the last .dockerignore pattern matching the path (or a parent) wins."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.removeprefix("!").rstrip("/")
        for candidate in candidates:
            if fnmatch.fnmatch(candidate, body) or (body == "**"):
                excluded = not negate
    return excluded


@pytest.mark.parametrize("name", NAMES)
def test_the_image_runs_as_a_non_root_user_from_a_slim_base(name: str) -> None:
    instructions = dockerfile(DOCKERFILES[name])
    words = [w for w, _ in instructions]
    (base,) = [rest for w, rest in instructions if w == "FROM"]
    variable = re.fullmatch(r"\$\{(\w+)\}", base)
    assert variable is not None, base
    assert re.fullmatch(r"python:3\.1[1-9]-slim-\w+", _args(name)[variable.group(1)])
    users = [rest for w, rest in instructions if w == "USER"]
    assert users == ["dpfl"]
    assert words.index("USER") < words.index("ENTRYPOINT")
    entrypoint, _ = image_command(name)
    assert entrypoint == [f"dpfl-{name}"]
    assert any(w == "VOLUME" for w in words)


def test_the_coordinator_image_exposes_its_ports_and_checks_its_health() -> None:
    instructions = dockerfile(DOCKERFILES["coordinator"])
    env = dockerfile_env("coordinator")
    (exposed,) = [rest.split() for w, rest in instructions if w == "EXPOSE"]
    assert sorted(exposed) == sorted([env["DPFL_GRPC_PORT"], env["DPFL_API_PORT"]])
    assert env["DPFL_GRPC_HOST"] == env["DPFL_API_HOST"] == "0.0.0.0"
    (volume,) = [rest for w, rest in instructions if w == "VOLUME"]
    state = volume.strip('[]"')
    assert env["DPFL_DATABASE_URL"] == f"sqlite:///{state}/dpfl.db"  # database under the volume
    assert env["DPFL_DATA_DIR"].startswith(state)
    (health,) = [rest for w, rest in instructions if w == "HEALTHCHECK"]
    assert health.endswith('CMD ["dpfl-coordinator", "healthcheck"]')
    _, cmd = image_command("coordinator")
    assert cmd[0] == "serve"
    assert "--require-client-cert" in cmd
    assert "--insecure" not in cmd
    assert any("[postgres]" in rest for w, rest in instructions if w == "RUN")


def test_torch_is_the_makefiles_cpu_wheel_unless_a_cuda_base_brings_its_own() -> None:
    makefile = (ROOT / "Makefile").read_text()
    spec = re.search(r"^TORCH_SPEC\s*\?=\s*(\S+)", makefile, re.M)
    assert spec is not None
    for name in NAMES:
        args = _args(name)
        assert args["TORCH_SPEC"] == spec.group(1)
        assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    runs = [rest for w, rest in dockerfile(DOCKERFILES["agent"]) if w == "RUN"]
    guarded = [r for r in runs if "TORCH_SPEC" in r]
    assert len(guarded) == 1
    assert guarded[0].startswith('python -c "import torch"'), guarded
    assert "BASE_IMAGE" in _args("agent")


@pytest.mark.parametrize("name", NAMES)
def test_every_package_folder_is_copied_and_not_dockerignored(name: str) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = {source.rstrip("/") for source, _ in _copies(name)}
    assert folders <= copied, f"{name} image misses {folders - copied}"
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not _dockerignored(source), f"{source} is excluded by .dockerignore"
        if (ROOT / source).is_dir():
            assert not _dockerignored(f"{source}/__init__.py") or source == "examples"
    for private in (".venv", ".git", "tests", "dpfl.db", "deploy/.env", "server/x/__pycache__"):
        assert _dockerignored(private), private


@pytest.mark.slow
def test_the_copied_sources_alone_build_the_package(tmp_path: Path) -> None:
    context = tmp_path / "src"
    context.mkdir()
    for source, _ in _copies("coordinator"):
        if source.rstrip("/") == "examples":
            continue
        origin = ROOT / source.rstrip("/")
        if origin.is_dir():
            skip = shutil.ignore_patterns("__pycache__")
            shutil.copytree(origin, context / origin.name, ignore=skip)
        else:
            shutil.copy2(origin, context / origin.name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("dpfl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    for script in ("dpfl =", "dpfl-coordinator =", "dpfl-agent ="):
        assert script in scripts
    migrations = {n for n in names if n.startswith("dpfl/server/store/migrations/versions/")}
    shipped = {p.name for p in (ROOT / "server/store/migrations/versions").glob("*.py")}
    assert {Path(n).name for n in migrations} == shipped
    assert "dpfl/server/api/static/index.html" in names
    assert "dpfl/protos/dpfl/v1/agent.proto" in names


def test_both_images_share_their_torch_layer() -> None:
    """Up to the torch RUN the two Dockerfiles are the same instructions, so that podman (or
    Docker) builds the 882 MB layer once for both (scripts/images.py builds them in turn)."""
    prefixes = []
    for name in NAMES:
        instructions = dockerfile(DOCKERFILES[name])
        start = [w for w, _ in instructions].index("FROM") + 1
        end = next(
            i for i, (w, rest) in enumerate(instructions) if "TORCH_SPEC" in rest and w == "RUN"
        )
        prefixes.append(instructions[start : end + 1])
    assert prefixes[0] == prefixes[1]
    assert any("pip install" in rest for _, rest in prefixes[0])
