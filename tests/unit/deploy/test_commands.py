"""Every ``dpfl`` command in the deployment files is a real invocation of the installed package.

The commands come from the images' ENTRYPOINT/CMD/HEALTHCHECK, every compose service (image
entrypoints, shell wrappers, the mounted init script, health checks), every Kubernetes container
and exec probe, every command shown in docs/deploy.md and README.md, and the walk-through script
the README quotes, examples/walkthrough.sh (``support.deploy_files``). For each: the installed
console script answers ``--help`` for its subcommand, every flag used appears in that help, and
the command's parser accepts the whole line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.deploy_files import (
    PROGRAMS,
    Invocation,
    cli_parsers,
    deploy_invocations,
    subcommand_path,
)

INVOCATIONS = deploy_invocations()
BIN = Path(sys.executable).parent


def _options(help_text: str) -> set[str]:
    """The option strings an argparse help lists (``-h, --help``, ``--out OUT`` ...)."""
    found: set[str] = set()
    for line in help_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-"):
            head = re.split(r"\s{2,}", stripped)[0]
            found |= set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", head))
    return found


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return cli_parsers()


@pytest.fixture(scope="module")
def helps(parsers: dict[str, argparse.ArgumentParser]) -> dict[tuple[str, ...], str]:
    """``PROGRAM SUBCOMMAND... --help`` of the installed console scripts, once per command."""
    keys = {
        (Path(i.program).name, *subcommand_path(parsers[Path(i.program).name], i.argv[1:]))
        for i in INVOCATIONS
    }

    def run(key: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
        done = subprocess.run(
            [str(BIN / key[0]), *key[1:], "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{' '.join(key)} --help failed: {done.stderr}"
        return key, done.stdout

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(run, sorted(keys)))


def test_the_deployment_files_are_all_searched() -> None:
    sources = " ".join(i.source for i in INVOCATIONS)
    for expected in (
        "coordinator.Dockerfile ENTRYPOINT+CMD",
        "coordinator.Dockerfile HEALTHCHECK",
        "agent.Dockerfile ENTRYPOINT+CMD",
        "compose.yaml services.coordinator",
        "compose.yaml services.coordinator.healthcheck",
        "compose.yaml services.silo-1",
        "compose.yaml services.silo-3",
        "init.sh",
        "k8s/coordinator Deployment/dpfl-coordinator",
        "k8s/agent Deployment/dpfl-agent",
        "deploy.md",
        "README.md",
        "walkthrough.sh",
    ):
        assert expected in sources, f"no dpfl command found in {expected}"
    assert {Path(i.program).name for i in INVOCATIONS} == set(PROGRAMS)


@pytest.mark.slow
@pytest.mark.parametrize("invocation", INVOCATIONS, ids=lambda i: i.source)
def test_each_command_is_a_real_cli_invocation(
    invocation: Invocation,
    parsers: dict[str, argparse.ArgumentParser],
    helps: dict[tuple[str, ...], str],
) -> None:
    program = Path(invocation.program).name
    parser = parsers[program]
    path = subcommand_path(parser, invocation.argv[1:])
    assert path, f"{invocation.source}: {' '.join(invocation.argv)} names no subcommand"
    declared = _options(helps[(program, *path)])
    missing = [flag for flag in invocation.flags() if flag not in declared]
    assert not missing, (
        f"{invocation.source}: {program} {' '.join(path)} has no option {missing} "
        f"(its --help lists {sorted(declared)})"
    )
    errors = io.StringIO()
    exit_code: object = None
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        try:
            namespace = parser.parse_args(list(invocation.argv[1:]))
        except SystemExit as exc:
            exit_code = exc.code
    if exit_code is not None:  # only a --help line may exit, and with 0
        assert exit_code == 0, f"{invocation.source}: refused: {errors.getvalue()}"
        assert "--help" in invocation.argv
        return
    assert callable(getattr(namespace, "func", None)), invocation.source


@pytest.mark.slow
def test_a_wrong_flag_would_be_caught(
    parsers: dict[str, argparse.ArgumentParser], helps: dict[tuple[str, ...], str]
) -> None:
    """The check above can fail: a flag of another command, or a misspelt one, is not found."""
    for argv in (
        ("dpfl-coordinator", "healthcheck", "--insecure"),
        ("dpfl-agent", "run", "--tls-cert", "x"),
        ("dpfl-coordinator", "serve", "--require-client-certs"),
    ):
        program, sub = argv[0], argv[1]
        declared = _options(helps.get((program, sub)) or _help(program, sub))
        assert not set(Invocation("test", argv).flags()) <= declared, argv


def _help(program: str, sub: str) -> str:
    done = subprocess.run(
        [str(BIN / program), sub, "--help"], capture_output=True, text=True, check=True
    )
    return done.stdout


def _coordinator_serves(invocation: Invocation) -> bool:
    return Path(invocation.program).name == "dpfl-coordinator" and "serve" in invocation.argv[1:2]


def test_containerised_coordinators_listen_on_every_interface() -> None:
    """``serve`` binds 127.0.0.1 unless told otherwise, which a container's port mapping or a
    Kubernetes Service cannot reach: the image, compose and Kubernetes commands say
    ``--host 0.0.0.0``."""
    served = [
        i
        for i in INVOCATIONS
        if _coordinator_serves(i)
        and not i.source.startswith(("deploy.md", "README", "walkthrough.sh"))
    ]
    sources = {i.source.split(":")[0] for i in served}
    assert any("Dockerfile" in s for s in sources), sources
    assert any("compose" in s for s in sources), sources
    assert any("k8s" in s for s in sources), sources
    for invocation in served:
        argv = list(invocation.argv)
        assert "--host" in argv, invocation
        assert argv[argv.index("--host") + 1] == "0.0.0.0", invocation
