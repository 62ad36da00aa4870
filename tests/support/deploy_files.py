"""Test-only: read ``deploy/`` the way Docker, compose and Kubernetes would, and find every ``dpfl``
command in it.

- :func:`dockerfile` parses a Dockerfile into instructions (continuations joined, exec-form JSON
  decoded) and :func:`image_command` gives an image's ENTRYPOINT + CMD;
- :func:`shell_invocations` finds the ``dpfl``/``dpfl-coordinator``/``dpfl-agent`` commands in a
  shell script or ``sh -c`` string (``;``, ``&&``, ``||``, ``|``, redirections and keywords end
  a command; ``NAME="${NAME:-default}"`` assignments are expanded);
- :func:`deploy_invocations` collects them all, each with where it came from: the images'
  entrypoints, commands and health checks, every compose service (its image's entrypoint unless
  overridden, shell wrappers and mounted scripts included, health checks), every Kubernetes
  container and exec probe (``$(VAR)`` resolved from the container's env and the kustomization's
  ConfigMap literals), and every command shown in ``docs/deploy.md``;
- :func:`cli_parsers` / :func:`subcommand_path` walk the installed commands' argparse trees.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.paths import ROOT

DEPLOY = ROOT / "deploy"
DOCKERFILES = {
    "coordinator": DEPLOY / "docker" / "coordinator.Dockerfile",
    "agent": DEPLOY / "docker" / "agent.Dockerfile",
}
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
#: documents whose shell examples must be real commands
DOCS = (DEPLOY_DOC, ROOT / "README.md")
#: the README's deployment walk-through, a script the e2e tests run; the README quotes it after
#: this marker (checked byte for byte by tests/unit/test_walkthrough_readme.py), so its commands
#: are taken from the script, with the script's own variable defaults
WALKTHROUGH = ROOT / "examples" / "walkthrough.sh"
WALKTHROUGH_MARKER = "<!-- examples/walkthrough.sh -->"
PROGRAMS = ("dpfl", "dpfl-coordinator", "dpfl-agent")
_SEPARATORS = {";", "&&", "||", "|", "&", ">", ">>", "<", "then", "do", "fi", "done", "else", "!"}
#: words after which the next word is still in command position
_PREFIXES = {"exec", "env", "time", "if", "while", "until"}
_ASSIGNMENT = re.compile(r"^\w+=")


@dataclass(frozen=True)
class Invocation:
    """One command line of a ``dpfl`` program found in a deployment file."""

    source: str
    argv: tuple[str, ...]

    @property
    def program(self) -> str:
        return self.argv[0]

    def flags(self) -> list[str]:
        """The options used (``--out``, ``-v``; ``--x=1`` gives ``--x``)."""
        return [a.split("=", 1)[0] for a in self.argv[1:] if re.match(r"^--?[A-Za-z]", a)]


# -- Dockerfiles -----------------------------------------------------------------------------------


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    return instructions


def exec_form(text: str) -> list[str]:
    """A JSON exec form (``["a", "b"]``); raises ValueError for the shell form."""
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not an exec form: {text}")
    return value


def image_command(name: str) -> tuple[list[str], list[str]]:
    """The image's (ENTRYPOINT, CMD), both exec form."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    for word, rest in dockerfile(DOCKERFILES[name]):
        if word == "ENTRYPOINT":
            entrypoint = exec_form(rest)
        elif word == "CMD":
            cmd = exec_form(rest)
    return entrypoint, cmd


def healthcheck_command(name: str) -> list[str] | None:
    for word, rest in dockerfile(DOCKERFILES[name]):
        if word == "HEALTHCHECK":
            _, _, command = rest.partition("CMD ")
            return exec_form(command.strip())
    return None


def dockerfile_env(name: str) -> dict[str, str]:
    """Every ``ENV KEY=VALUE`` of an image."""
    env: dict[str, str] = {}
    for word, rest in dockerfile(DOCKERFILES[name]):
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


# -- shell -----------------------------------------------------------------------------------------


def _assignments(script: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for match in re.finditer(r'^\s*(\w+)="\$\{\1:-([^}]*)\}"\s*$', script, re.M):
        values[match.group(1)] = match.group(2)
    for match in re.finditer(r"^\s*(\w+)=([^\s\"'$]+)\s*$", script, re.M):
        values.setdefault(match.group(1), match.group(2))
    return values


def _expand(token: str, values: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, token)


def shell_invocations(script: str, source: str, first_line: int = 1) -> Iterator[Invocation]:
    """The ``dpfl*`` commands of a shell script (see the module docstring); sources are named
    ``source:LINE``, counting from ``first_line``."""
    values = _assignments(script)
    joined = re.sub(r"\\\n", " ", script)
    for number, line in enumerate(joined.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        i = 0
        at_command = True  # only a word in command position names a program
        while i < len(tokens):
            token = tokens[i]
            if token in _SEPARATORS or token in _PREFIXES or _ASSIGNMENT.match(token):
                at_command = at_command or token in _SEPARATORS
                i += 1
                continue
            if at_command and Path(token).name in PROGRAMS:
                end = i + 1
                while end < len(tokens) and tokens[end] not in _SEPARATORS:
                    end += 1
                argv = (tokens[i], *(_expand(t, values) for t in tokens[i + 1 : end]))
                yield Invocation(f"{source}:{first_line + number - 1}", argv)
                i = end
            else:
                at_command = False
                i += 1


# -- compose ---------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def _image_name(service: Mapping[str, Any]) -> str | None:
    build = service.get("build")
    if isinstance(build, Mapping):
        dockerfile_path = (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve()
        for name, path in DOCKERFILES.items():
            if path.resolve() == dockerfile_path:
                return name
    return None


def compose_invocations() -> Iterator[Invocation]:
    doc = compose()
    for name, service in doc["services"].items():
        source = f"compose.yaml services.{name}"
        image = _image_name(service)
        if image is not None:
            entrypoint, cmd = image_command(image)
            if "entrypoint" in service:
                entrypoint = list(service["entrypoint"])
                cmd = []
            if "command" in service:
                cmd = list(service["command"])
            argv = [a.replace("$$", "$") for a in entrypoint + cmd]
            yield from _container_invocations(argv, source, service)
        health = service.get("healthcheck", {}).get("test")
        if image is not None and health and health[0] == "CMD":
            yield from _direct(health[1:], f"{source}.healthcheck")
        elif image is not None and health and health[0] == "CMD-SHELL":
            yield from shell_invocations(health[1], f"{source}.healthcheck")


def _bind_source(service: Mapping[str, Any], target: str) -> Path | None:
    for volume in service.get("volumes", []):
        parts = volume.split(":")
        if parts[0].startswith(".") and parts[1] == target:
            return (COMPOSE.parent / parts[0]).resolve()
    return None


def _container_invocations(
    argv: list[str], source: str, service: Mapping[str, Any]
) -> Iterator[Invocation]:
    if argv[:2] in (["/bin/sh", "-c"], ["sh", "-c"]):
        yield from shell_invocations(argv[2], source)
    elif argv and argv[0] in ("/bin/sh", "sh"):
        script = _bind_source(service, argv[1])
        if script is None:
            raise AssertionError(f"{source}: {argv[1]} is not a script mounted from the repo")
        yield from shell_invocations(script.read_text(encoding="utf-8"), str(script.name))
    else:
        yield from _direct(argv, source)


def _direct(argv: list[str], source: str) -> Iterator[Invocation]:
    if argv and Path(argv[0]).name in PROGRAMS:
        yield Invocation(source, tuple(argv))
    elif argv:
        raise AssertionError(f"{source}: {argv[0]!r} is not a dpfl command")


# -- Kubernetes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kustomization:
    """One ``deploy/k8s/<part>`` folder: its objects and what its generators create."""

    folder: Path
    spec: dict[str, Any]
    objects: list[dict[str, Any]]

    def generated(self, kind: str) -> dict[str, dict[str, str]]:
        """Name → {key: value or source} of the generated Secrets or ConfigMaps."""
        key = "secretGenerator" if kind == "Secret" else "configMapGenerator"
        out: dict[str, dict[str, str]] = {}
        for gen in self.spec.get(key, []):
            data: dict[str, str] = {}
            for literal in gen.get("literals", []):
                k, _, v = literal.partition("=")
                data[k] = v
            for item in gen.get("files", []):
                k, _, path = item.partition("=")
                data[k if path else Path(k).name] = f"<file {path or k}>"
            for env in gen.get("envs", []):
                data[f"<keys of {env}>"] = f"<file {env}>"
            out[gen["name"]] = data
        return out

    def names(self, kind: str) -> set[str]:
        made = {o["metadata"]["name"] for o in self.objects if o["kind"] == kind}
        if kind in ("Secret", "ConfigMap"):
            made |= set(self.generated(kind))
        return made


def kustomizations() -> list[Kustomization]:
    found = []
    for path in sorted(K8S.glob("*/kustomization.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        objects: list[dict[str, Any]] = []
        for resource in spec["resources"]:
            text = (path.parent / resource).read_text(encoding="utf-8")
            objects += [d for d in yaml.safe_load_all(text) if d is not None]
        found.append(Kustomization(path.parent, spec, objects))
    return found


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def _resolve_k8s(arg: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def container_env(container: Mapping[str, Any], kust: Kustomization) -> dict[str, str]:
    """The container's environment as Kubernetes expands it (secrets as placeholders)."""
    env: dict[str, str] = {}
    config_maps = kust.generated("ConfigMap")
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _resolve_k8s(item["value"], env)
        elif "configMapKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["configMapKeyRef"]
            env[item["name"]] = config_maps.get(ref["name"], {}).get(ref["key"], "")
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = f"<secret {ref['name']}/{ref['key']}>"
    return env


def k8s_invocations() -> Iterator[Invocation]:
    for kust in kustomizations():
        for where, spec in pod_specs(kust.objects):
            for container in spec.get("containers", []) + spec.get("initContainers", []):
                env = container_env(container, kust)
                source = f"k8s/{kust.folder.name} {where} container {container['name']}"
                argv = [_resolve_k8s(a, env) for a in container.get("command", [])]
                argv += [_resolve_k8s(a, env) for a in container.get("args", [])]
                if argv and Path(argv[0]).name in PROGRAMS:
                    yield Invocation(source, tuple(argv))
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    command = container.get(probe, {}).get("exec", {}).get("command")
                    if command and Path(command[0]).name in PROGRAMS:
                        yield Invocation(f"{source} {probe}", tuple(command))


# -- docs ------------------------------------------------------------------------------------------

_IMAGE_REF = re.compile(r"^(?:[\w.-]+/)?(dpfl-coordinator|dpfl-agent):[\w.-]+$")
_VALUE_OPTIONS = {"-e", "--env", "-u", "--user", "-w", "--workdir", "-n", "--namespace", "-c"}


def _code_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, command line) of the fenced code blocks, continuations joined; the block
    after :data:`WALKTHROUGH_MARKER` is left to :func:`deploy_invocations` (the script itself)."""
    inside, pending, first, quoted = False, "", 0, False
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if raw.strip() == WALKTHROUGH_MARKER:
            quoted = True
        if raw.lstrip().startswith("```"):
            inside = not inside
            quoted = quoted and inside
            continue
        if not inside or quoted:
            continue
        line = raw.strip()
        if not pending:
            first = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield first, (pending + line).strip().removeprefix("$ ")
        pending = ""


def _after_exec(tokens: list[str]) -> list[str]:
    """What ``docker [compose ...] exec [OPTIONS] TARGET CMD...`` or ``kubectl exec ... -- CMD``
    runs."""
    if tokens[0] == "kubectl":
        return tokens[tokens.index("--") + 1 :] if "--" in tokens else []
    if "exec" not in tokens:
        return []
    i = tokens.index("exec") + 1
    while i < len(tokens) and tokens[i].startswith("-"):
        i += 2 if tokens[i] in _VALUE_OPTIONS else 1
    return tokens[i + 1 :]


def doc_invocations(path: Path = DEPLOY_DOC) -> Iterator[Invocation]:
    """Commands in the document's fenced code blocks: shell lines, ``docker [compose] exec`` and
    ``kubectl exec`` (the command they run), and ``docker run ... IMAGE:TAG args`` (the image's
    entrypoint with ``args``)."""
    for number, line in _code_lines(path):
        if not line or line.startswith("#"):
            continue
        source = f"{path.name}:{number}"
        tokens = shlex.split(line, comments=True)
        if tokens[:2] == ["docker", "run"]:
            for i, token in enumerate(tokens):
                match = _IMAGE_REF.match(token)
                if match:
                    name = match.group(1).removeprefix("dpfl-")
                    entrypoint, cmd = image_command(name)
                    args = tokens[i + 1 :] or cmd  # no arguments: the image's CMD
                    yield Invocation(source, (*entrypoint, *args))
                    break
        elif tokens[0] in ("docker", "kubectl"):
            command = _after_exec(tokens)
            if command:
                quoted = " ".join(shlex.quote(t) for t in command)
                yield from shell_invocations(quoted, path.name, number)
        else:
            yield from shell_invocations(line, path.name, number)


def image_invocations() -> Iterator[Invocation]:
    for name in DOCKERFILES:
        entrypoint, cmd = image_command(name)
        yield Invocation(f"{name}.Dockerfile ENTRYPOINT+CMD", tuple(entrypoint + cmd))
        health = healthcheck_command(name)
        if health is not None:
            yield Invocation(f"{name}.Dockerfile HEALTHCHECK", tuple(health))
        for word, rest in dockerfile(DOCKERFILES[name]):
            if word == "RUN":
                yield from shell_invocations(rest, f"{name}.Dockerfile RUN")


def deploy_invocations() -> list[Invocation]:
    return [
        *image_invocations(),
        *compose_invocations(),
        *k8s_invocations(),
        *(i for doc in DOCS for i in doc_invocations(doc)),
        *shell_invocations(WALKTHROUGH.read_text(encoding="utf-8"), WALKTHROUGH.name),
    ]


# -- the installed commands ------------------------------------------------------------------------


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    from dpfl.cli.main import parser as umbrella
    from dpfl.client.cli.main import parser as agent
    from dpfl.server.cli.main import parser as coordinator

    return {"dpfl": umbrella(), "dpfl-coordinator": coordinator(), "dpfl-agent": agent()}


def subcommand_path(parser: argparse.ArgumentParser, args: tuple[str, ...]) -> tuple[str, ...]:
    """The subcommand names at the start of ``args`` (``("certs", "init")``)."""
    path: list[str] = []
    current = parser
    for token in args:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or token not in subs[0].choices:
            break
        path.append(token)
        current = subs[0].choices[token]
    return tuple(path)
