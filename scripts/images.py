"""``make image``: build the coordinator and agent images with podman, with or without a registry.

The base is ``python:3.11-slim-bookworm`` from the registry when podman can pull it. Where no
registry answers, it is made here: a Debian bookworm root file system from the apt mirror
(mmdebstrap), imported with ``podman import``, then ``deploy/docker/base.Dockerfile`` (python
and pip first on PATH, as in the official image). The coordinator and agent Dockerfiles are the
same in both cases; build arguments select the base and the torch wheel.

pip inside the build sees this machine's pip configuration (``pip config list``: index, extra
indexes, find-links, CA bundle, constraints): a folder of the host is mounted as the build's
HOME (/root, which every base has) with that configuration in ``.config/pip/pip.conf``, and
every local folder or file it names is mounted read-only below it. Bind mounts are not part of
any layer, and none is made on a path the image lacks (podman would leave the empty mount point
in the layer), so nothing of it stays in the images.
When ``TORCH_INDEX_URL`` is not reachable the index of that configuration serves torch (a wheel
from a find-links folder, or PyPI).

``--format docker`` keeps the images' HEALTHCHECK (the OCI format has none). Prints one JSON
line: the base used, build seconds per image, image sizes in bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import podman_env
from podman_env import ROOT, WORK

REGISTRY_BASE = "docker.io/library/python:3.11-slim-bookworm"
DEBIAN_IMAGE = "localhost/dpfl-debian:bookworm"
LOCAL_BASE = "localhost/dpfl-python:3.11-bookworm"
COORDINATOR = "localhost/dpfl-coordinator:latest"
AGENT = "localhost/dpfl-agent:latest"
#: the last build's JSON report, which ``make image-test`` repeats in its own
REPORT = WORK / "images.json"
MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
#: documentation, manual pages and translations are left out of the Debian base
_DPKG_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/locale/*",
    "/usr/share/info/*",
)
#: pip settings carried from this machine's configuration into the build
_PIP_KEYS = ("index-url", "extra-index-url", "find-links", "cert", "constraint", "trusted-host")


@dataclass
class BuildReport:
    base: str
    base_source: str  # "registry" or "local"
    torch_spec: str
    torch_index_url: str
    seconds: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


#: the build's HOME (root's, present in every base): pip reads HOME/.config/pip/pip.conf, and the
#: host paths that configuration names are mounted below it, so that no mount point is created
#: in the image (a mount on a missing path leaves an empty file or folder in the layer)
BUILD_HOME = "/root"


@dataclass(frozen=True)
class PipSetup:
    """The build's pip home (a host folder mounted at ``BUILD_HOME``) and what is mounted in it."""

    home: Path
    #: host path -> its path in the build container, mounted read-only
    mounts: tuple[tuple[Path, str], ...]

    def volume_args(self) -> list[str]:
        args = ["--volume", f"{self.home}:{BUILD_HOME}"]
        for host, inside in self.mounts:
            args += ["--volume", f"{host}:{inside}:ro"]
        return args


def pip_settings() -> dict[str, str]:
    """This machine's pip configuration (environment over files), for the keys we carry."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    found: dict[str, tuple[int, str]] = {}
    for line in done.stdout.splitlines():
        match = re.fullmatch(r"(:env:|global|install)\.([\w-]+)='(.*)'", line.strip())
        if match is None or match.group(2) not in _PIP_KEYS:
            continue
        rank = {"global": 0, "install": 1, ":env:": 2}[match.group(1)]
        key = match.group(2)
        if key not in found or found[key][0] <= rank:
            found[key] = (rank, match.group(3))
    return {key: value for key, (_, value) in found.items()}


def _local_path(value: str) -> Path | None:
    """The host path behind a pip setting's value (a path or a file:// URL), when it exists."""
    path = Path(urlsplit(value).path) if value.startswith("file://") else Path(value)
    if not path.is_absolute() or not path.exists():
        return None
    return path


def pip_setup(settings: dict[str, str]) -> PipSetup:
    """Rewrite the settings' local paths to mounts under the build's HOME."""
    home = WORK / "pip-home"
    if home.exists():
        shutil.rmtree(home)
    (home / ".config" / "pip").mkdir(parents=True)
    lines = ["[global]"]
    mounts: dict[Path, str] = {}
    for key, value in sorted(settings.items()):
        words = []
        for word in value.split():
            path = _local_path(word)
            if path is None:
                words.append(word)
                continue
            # an index's "simple" folder links to the files beside it: mount its parent
            root = path.parent if path.name == "simple" and word.startswith("file:") else path
            inside = mounts.setdefault(root, f"{BUILD_HOME}/.dpfl-build/{len(mounts)}-{root.name}")
            moved = inside + str(path)[len(str(root)) :]
            words.append(f"file://{moved}" if word.startswith("file:") else moved)
        lines.append(f"{key} = {' '.join(words)}")
    (home / ".config" / "pip" / "pip.conf").write_text("\n".join(lines) + "\n")
    return PipSetup(home=home, mounts=tuple(sorted(mounts.items())))


def reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether the URL's host resolves and accepts a TCP connection."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return Path(parts.path).exists()
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def make_debian_image() -> None:
    """mmdebstrap a minimal bookworm with python3 into a tarball and ``podman import`` it."""
    if shutil.which("mmdebstrap") is None:
        raise SystemExit(
            "no registry and no mmdebstrap: apt-get install mmdebstrap (docs/deploy.md)"
        )
    tarball = WORK / "debian-bookworm.tar"
    argv = [
        "nice",
        "-n",
        "15",
        "mmdebstrap",
        "--variant=minbase",
        "--include=python3,python3-venv,ca-certificates",
        "--aptopt=Acquire::Retries 3",
        *[f"--dpkgopt=path-exclude={pattern}" for pattern in _DPKG_EXCLUDES],
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "bookworm",
        str(tarball),
        f"deb {MIRROR} bookworm main",
        f"deb {MIRROR} bookworm-updates main",
        f"deb {SECURITY} bookworm-security main",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"mmdebstrap failed:\n{done.stderr[-3000:]}")
    podman_env.run(["import", "--change", 'CMD ["python3"]', str(tarball), DEBIAN_IMAGE], nice=True)
    tarball.unlink()


def build(dockerfile: str, tag: str, build_args: dict[str, str], pip: PipSetup | None) -> float:
    """``podman build`` one image; its wall-clock seconds."""
    argv = ["build", "--format", "docker", "--file", dockerfile, "--tag", tag]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    argv += [*(pip.volume_args() if pip is not None else []), str(ROOT)]
    start = time.monotonic()
    podman_env.run(argv, timeout=3600, nice=True)
    return round(time.monotonic() - start, 1)


def choose_base(mode: str) -> tuple[str, str]:
    """(base image, "registry" or "local"): the registry's when it can be pulled (mode auto)."""
    if mode in ("auto", "registry"):
        try:
            podman_env.run(["pull", "--quiet", REGISTRY_BASE], timeout=900, nice=True)
            return REGISTRY_BASE, "registry"
        except podman_env.PodmanError as exc:
            if mode == "registry":
                raise SystemExit(str(exc)) from exc
            reason = str(exc).splitlines()[-1][:160]
            print(f"images: no registry, a local base ({reason})", file=sys.stderr)
    return LOCAL_BASE, "local"


def build_all(args: argparse.Namespace) -> BuildReport:
    podman_env.containers_conf()
    base, source = choose_base(args.base)
    settings = pip_settings()
    index_url, torch_spec = args.torch_index_url, args.torch_spec
    if not reachable(index_url):
        if not index_url.rstrip("/").endswith("/cpu"):
            raise SystemExit(f"images: the torch index {index_url} is unreachable")
        # the CPU wheel from this machine's pip configuration (a find-links folder, or PyPI):
        # PyPI's plain torch wheel is the CUDA build, so ask for the CPU one by its local label
        index_url = settings.get("index-url", "https://pypi.org/simple")
        if re.fullmatch(r"torch==[\w.]+", torch_spec):
            torch_spec += "+cpu"
        note = f"{args.torch_index_url} unreachable: {torch_spec} from {index_url}"
        print(f"images: {note}", file=sys.stderr)
    report = BuildReport(base, source, torch_spec, index_url)
    pip = pip_setup(settings)
    if source == "local":
        start = time.monotonic()
        if args.rebuild_base or not podman_env.image_exists(DEBIAN_IMAGE):
            make_debian_image()
        build_args = {"DEBIAN_IMAGE": DEBIAN_IMAGE}
        build("deploy/docker/base.Dockerfile", LOCAL_BASE, build_args, None)
        report.seconds["base"] = round(time.monotonic() - start, 1)
        report.sizes["base"] = podman_env.image_size(LOCAL_BASE)
    torch = {"TORCH_SPEC": torch_spec, "TORCH_INDEX_URL": index_url}
    for name, tag, dockerfile, base_arg in (
        ("agent", AGENT, "deploy/docker/agent.Dockerfile", "BASE_IMAGE"),
        ("coordinator", COORDINATOR, "deploy/docker/coordinator.Dockerfile", "PYTHON_IMAGE"),
    ):
        report.seconds[name] = build(dockerfile, tag, {base_arg: base, **torch}, pip)
        report.sizes[name] = podman_env.image_size(tag)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base", choices=("auto", "registry", "local"), default="auto")
    parser.add_argument("--rebuild-base", action="store_true", help="mmdebstrap the base again")
    parser.add_argument("--torch-spec", default="torch==2.13.0")
    parser.add_argument("--torch-index-url", default="https://download.pytorch.org/whl/cpu")
    args = parser.parse_args(argv)
    try:
        report = build_all(args)
    except podman_env.PodmanError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    line = json.dumps(asdict(report), sort_keys=True)
    REPORT.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
