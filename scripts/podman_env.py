"""What podman needs on the project's machines, shared by ``scripts/images.py`` and
``scripts/image_test.py``.

These machines are VMs with hybrid cgroups (v1 controllers) and no systemd: Debian's podman 4.3
works there with runc (crun refuses hybrid cgroups), the cgroupfs manager and default ulimits
no higher than this process's own (podman's defaults ask for more than the VM grants, and the
container then fails to start). All of it goes in a ``CONTAINERS_CONF`` file of our own under
``build/podman``; nothing in /etc is changed. ``run`` and ``output`` call podman with it.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "podman"


class PodmanError(RuntimeError):
    """A podman command failed; the message holds its command line and the end of its output."""


def _limit(kind: int, ceiling: int | None = None) -> int:
    _, hard = resource.getrlimit(kind)
    value = hard if hard != resource.RLIM_INFINITY else 1 << 20
    return min(value, ceiling) if ceiling is not None else value


def containers_conf() -> Path:
    """Write ``build/podman/containers.conf`` for this machine and return its path."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text().strip())
    nofile = _limit(resource.RLIMIT_NOFILE)
    nproc = _limit(resource.RLIMIT_NPROC, pid_max)
    runtime = "runc" if shutil.which("runc") else "crun"
    text = (
        "# written by scripts/podman_env.py for this machine (see its docstring)\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        f'runtime = "{runtime}"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / "containers.conf"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def environment() -> dict[str, str]:
    """This process's environment with ``CONTAINERS_CONF`` pointing at our file."""
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(containers_conf())
    return env


def run(
    args: Sequence[str], *, timeout: float = 600, check: bool = True, nice: bool = False
) -> str:
    """Run ``podman ARGS`` and return its stdout; raise :class:`PodmanError` when it fails."""
    argv = [*(["nice", "-n", "15"] if nice else []), "podman", *args]
    try:
        done = subprocess.run(
            argv,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PodmanError(f"{' '.join(argv)}: no answer in {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise PodmanError(f"{' '.join(argv)} exited {done.returncode}:\n{tail}")
    return done.stdout


def image_exists(name: str) -> bool:
    argv = ["podman", "image", "exists", name]
    return subprocess.run(argv, env=environment(), check=False, timeout=60).returncode == 0


def image_size(name: str) -> int:
    """The image's size in bytes, as ``podman image inspect`` reports it."""
    return int(run(["image", "inspect", "--format", "{{.Size}}", name]).strip())
