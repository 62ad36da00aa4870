"""Render a kustomization (``kubectl kustomize DIR``) without kubectl, for ``podman kube play``.

The project's machines and CI have no Kubernetes tools, and ``deploy/k8s`` needs a render: its
Secrets and ConfigMaps are generated, and an overlay sets the images and one silo's names. This
implements the part of kustomize that those folders and their overlays use, with kustomize's
meaning, and refuses everything else by name (a silently ignored field would deploy something
other than what the file says):

- ``resources``: YAML files, or folders holding a kustomization (bases), rendered first;
- ``namespace``: set on every object but Namespaces;
- ``namePrefix`` / ``nameSuffix``: on every object but Namespaces, with the references to the
  renamed objects updated (Secret, ConfigMap and claim names in pod specs, a StatefulSet's
  Service);
- ``images``: ``name`` → ``newName`` / ``newTag`` / ``digest`` in containers and init containers;
- ``configMapGenerator`` / ``secretGenerator``: ``literals``, ``files`` (``KEY=PATH`` or
  ``PATH``), ``envs`` (``KEY=VALUE`` lines), ``behavior`` create, merge or replace (of a base's
  generated object), ``type`` for Secrets; only with ``generatorOptions.disableNameSuffixHash``
  (name hashes are not implemented).

``tests/unit/deploy/test_kustomize.py`` compares the output with ``kubectl kustomize`` where
kubectl exists. Usage: ``python scripts/kustomize.py DIR`` prints the objects as YAML.
"""

from __future__ import annotations

import argparse
import base64
import copy
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
KNOWN_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "namePrefix",
    "nameSuffix",
    "images",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
}
GENERATOR_FIELDS = {"name", "behavior", "literals", "files", "envs", "type"}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


class KustomizeError(ValueError):
    """The kustomization uses what this renderer does not implement, or is wrong."""


@dataclass(frozen=True)
class Rename:
    """One object renamed by a prefix or suffix, for the references to it."""

    kind: str
    old: str
    new: str


def load_kustomization(folder: Path) -> Obj:
    path = folder / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{folder}: no kustomization.yaml")
    spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(spec, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: fields not implemented here: {sorted(unknown)}")
    return spec


def _read_resource(folder: Path, entry: str) -> list[Obj]:
    path = (folder / entry).resolve()
    if path.is_dir():
        return render(path)
    if not path.is_file():
        raise KustomizeError(f"{folder}: resource {entry} does not exist")
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= set(doc):
            raise KustomizeError(f"{path}: a document is not a Kubernetes object")
    return docs


def _source_file(folder: Path, relative: str) -> Path:
    """A generator's file, which kustomize reads only inside the kustomization's folder."""
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise KustomizeError(f"{folder}: {relative} lies outside the kustomization's folder")
    if not path.is_file():
        raise KustomizeError(f"{folder}: generator file {relative} does not exist")
    return path


def _env_lines(path: Path) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise KustomizeError(f"{path}:{number}: not KEY=VALUE")
        yield key.strip(), value


def generator_data(folder: Path, generator: Obj) -> dict[str, str]:
    """The key → text of one generator entry (literals, files, env files)."""
    unknown = set(generator) - GENERATOR_FIELDS
    if unknown:
        raise KustomizeError(f"{folder}: generator fields not implemented: {sorted(unknown)}")
    data: dict[str, str] = {}

    def put(key: str, value: str) -> None:
        if key in data:
            raise KustomizeError(f"{folder}: generator {generator['name']}: key {key} twice")
        data[key] = value

    for literal in generator.get("literals", []):
        key, sep, value = str(literal).partition("=")
        if not sep:
            raise KustomizeError(f"{folder}: literal {literal!r} is not KEY=VALUE")
        put(key, value)
    for item in generator.get("files", []):
        key, sep, relative = str(item).partition("=")
        path = _source_file(folder, relative if sep else key)
        put(key if sep else path.name, path.read_text(encoding="utf-8"))
    for env in generator.get("envs", []):
        for key, value in _env_lines(_source_file(folder, str(env))):
            put(key, value)
    return data


def _generated(kind: str, generator: Obj, data: dict[str, str]) -> Obj:
    obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": generator["name"]}}
    if kind == "Secret":
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())}
        obj["data"] = encoded
        obj["type"] = generator.get("type", "Opaque")
    else:
        obj["data"] = dict(sorted(data.items()))
    return obj


def _decoded(obj: Obj) -> dict[str, str]:
    data = obj.get("data", {})
    if obj["kind"] == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in data.items()}
    return dict(data)


def apply_generators(folder: Path, spec: Obj, objects: list[Obj]) -> list[Obj]:
    """Add (or merge into, or replace) the generated Secrets and ConfigMaps."""
    options = spec.get("generatorOptions", {})
    for kind, field in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in spec.get(field, []):
            data = generator_data(folder, generator)
            behavior = generator.get("behavior", "create")
            # a merged or replaced object keeps its base's name (and so the base's option)
            if behavior == "create" and not options.get("disableNameSuffixHash", False):
                raise KustomizeError(
                    f"{folder}: {field} without generatorOptions.disableNameSuffixHash "
                    "(name hashes are not implemented here)"
                )
            found = [
                i
                for i, o in enumerate(objects)
                if o["kind"] == kind and o["metadata"]["name"] == generator["name"]
            ]
            if behavior == "create":
                if found:
                    raise KustomizeError(f"{folder}: {kind} {generator['name']} exists already")
                objects.append(_generated(kind, generator, data))
            elif behavior in ("merge", "replace"):
                if not found:
                    raise KustomizeError(f"{folder}: no {kind} {generator['name']} to {behavior}")
                base = objects[found[0]]
                merged = {**_decoded(base), **data} if behavior == "merge" else data
                new = _generated(kind, {**generator, "type": base.get("type", "Opaque")}, merged)
                new["metadata"] = base["metadata"]
                objects[found[0]] = new
            else:
                raise KustomizeError(f"{folder}: generator behavior {behavior!r} is not known")
    return objects


def _pod_specs(obj: Obj) -> Iterator[Obj]:
    if obj["kind"] in WORKLOADS:
        yield obj["spec"]["template"]["spec"]
    elif obj["kind"] == "Pod":
        yield obj["spec"]


def _containers(spec: Obj) -> Iterator[Obj]:
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def rename(objects: list[Obj], prefix: str, suffix: str) -> list[Obj]:
    """``namePrefix`` / ``nameSuffix`` on every object but Namespaces, references included."""
    if not prefix and not suffix:
        return objects
    renames: dict[tuple[str, str], Rename] = {}
    for obj in objects:
        if obj["kind"] == "Namespace":
            continue
        old = obj["metadata"]["name"]
        new = f"{prefix}{old}{suffix}"
        renames[(obj["kind"], old)] = Rename(obj["kind"], old, new)
        obj["metadata"]["name"] = new

    def fix(holder: Obj, key: str, kind: str) -> None:
        found = renames.get((kind, holder.get(key, "")))
        if found is not None:
            holder[key] = found.new

    for obj in objects:
        if obj["kind"] == "StatefulSet":
            fix(obj["spec"], "serviceName", "Service")
        for spec in _pod_specs(obj):
            for volume in spec.get("volumes", []):
                if "secret" in volume:
                    fix(volume["secret"], "secretName", "Secret")
                if "configMap" in volume:
                    fix(volume["configMap"], "name", "ConfigMap")
                if "persistentVolumeClaim" in volume:
                    fix(volume["persistentVolumeClaim"], "claimName", "PersistentVolumeClaim")
            for container in _containers(spec):
                for item in container.get("env", []):
                    source = item.get("valueFrom", {})
                    if "secretKeyRef" in source:
                        fix(source["secretKeyRef"], "name", "Secret")
                    if "configMapKeyRef" in source:
                        fix(source["configMapKeyRef"], "name", "ConfigMap")
                for item in container.get("envFrom", []):
                    if "secretRef" in item:
                        fix(item["secretRef"], "name", "Secret")
                    if "configMapRef" in item:
                        fix(item["configMapRef"], "name", "ConfigMap")
    return objects


def set_images(objects: list[Obj], images: list[Obj]) -> list[Obj]:
    """kustomize's ``images``: match a container's image by name (without tag or digest)."""
    for image in images:
        if "name" not in image:
            raise KustomizeError(f"images: an entry without a name: {image}")
        unknown = set(image) - {"name", "newName", "newTag", "digest"}
        if unknown:
            raise KustomizeError(f"images: fields not implemented: {sorted(unknown)}")
    for obj in objects:
        for spec in _pod_specs(obj):
            for container in _containers(spec):
                container["image"] = _new_image(container["image"], images)
    return objects


def _new_image(ref: str, images: list[Obj]) -> str:
    name, _, digest = ref.partition("@")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, _, tag = name.rpartition(":")
    for image in images:
        if image["name"] != name:
            continue
        name = image.get("newName", name)
        if "digest" in image:
            return f"{name}@{image['digest']}"
        tag = str(image.get("newTag", tag))
        break
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest and not tag else "")


def render(folder: Path) -> list[Obj]:
    """The kustomization's objects, as ``kubectl kustomize`` gives them (order aside)."""
    folder = folder.resolve()
    spec = load_kustomization(folder)
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        objects += copy.deepcopy(_read_resource(folder, str(entry)))
    objects = apply_generators(folder, spec, objects)
    namespace = spec.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] != "Namespace":
                obj["metadata"]["namespace"] = namespace
    objects = rename(objects, spec.get("namePrefix", ""), spec.get("nameSuffix", ""))
    objects = set_images(objects, spec.get("images", []))
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            raise KustomizeError(f"{folder}: {key[0]} {key[2]} is defined twice")
        seen.add(key)
    return objects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        objects = render(args.folder)
    except KustomizeError as exc:
        print(f"kustomize: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
