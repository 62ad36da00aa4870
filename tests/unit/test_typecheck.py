"""`make lint` type-checks every dpfl package: scripts/typecheck.py's link tree and mypy config."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from types import ModuleType

from support.paths import CODE_PACKAGES, ROOT
from support.scripts import load_script


def _typecheck() -> ModuleType:
    return load_script(ROOT / "scripts" / "typecheck.py", "typecheck")


def _mypy_config() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        config = tomllib.load(f)["tool"]["mypy"]
    assert isinstance(config, dict)
    return config


def test_link_tree_maps_every_code_package(tmp_path: Path) -> None:
    typecheck = _typecheck()
    packages = typecheck.build_tree(tmp_path)
    assert sorted(packages) == sorted(CODE_PACKAGES.values())
    namespace = tmp_path / "dpfl"
    for folder, package in CODE_PACKAGES.items():
        if package == "dpfl":  # api/ is dpfl itself: one link per module and subpackage
            modules = sorted((ROOT / folder).glob("*.py"))
            assert any(m.name == "__init__.py" for m in modules)
            subpackages = sorted(p.parent for p in (ROOT / folder).glob("*/__init__.py"))
            assert ROOT / folder / "simulation" in subpackages
            for module in [*modules, *subpackages]:
                link = namespace / module.name
                assert link.is_symlink()
                assert not os.path.isabs(os.readlink(link))
                assert link.resolve() == module.resolve()
            continue
        link = namespace / package.removeprefix("dpfl.")
        assert link.is_symlink()
        assert not os.path.isabs(os.readlink(link)), "relative, so a moved clone still works"
        assert link.resolve() == (ROOT / folder).resolve()


def test_link_tree_is_rebuilt_idempotently(tmp_path: Path) -> None:
    typecheck = _typecheck()
    first = typecheck.build_tree(tmp_path)
    namespace = tmp_path / "dpfl"
    (namespace / "gone").symlink_to(ROOT / "docs", target_is_directory=True)
    (namespace / "server").unlink()
    (namespace / "server").symlink_to(ROOT / "client", target_is_directory=True)
    assert typecheck.build_tree(tmp_path) == first
    assert not (namespace / "gone").exists(), "a package no longer mapped is dropped"
    assert (namespace / "server").resolve() == (ROOT / "server").resolve()
    top = [m.name for m in (ROOT / "api").glob("*.py")]
    top += [p.parent.name for p in (ROOT / "api").glob("*/__init__.py")]
    assert sorted(p.name for p in namespace.iterdir()) == sorted(
        [*(p.removeprefix("dpfl.") for p in CODE_PACKAGES.values() if p != "dpfl"), *top]
    )


def test_errors_are_silenced_only_in_generated_code() -> None:
    """``ignore_errors`` is for protoc's output alone: each such module is a file that
    scripts/gen_protos.py writes (test_generated_fresh.py checks that it is unedited)."""
    generated = {p.name for p in (ROOT / "protos" / "dpfl" / "v1").glob("*_pb2*.py*")}
    overrides = _mypy_config().get("overrides", [])
    assert isinstance(overrides, list)
    silenced = [m for o in overrides if o.get("ignore_errors") for m in o["module"]]
    assert silenced, "the generated protobuf modules are expected here"
    for module in silenced:
        assert module.startswith("dpfl.protos."), module
        package, _, name = module.rpartition(".")
        assert package == "dpfl.protos.dpfl.v1", module
        assert name.endswith(("_pb2", "_pb2_grpc")), f"{module} is not generated code"
        assert f"{name}.pyi" in generated, f"{module}: mypy should read its generated .pyi stub"


def test_missing_imports_are_ignored_per_library() -> None:
    overrides = _mypy_config().get("overrides", [])
    assert isinstance(overrides, list)
    assert _mypy_config().get("ignore_missing_imports") is not True, "no blanket ignore"
    for override in overrides:
        if override.get("ignore_missing_imports"):
            for module in override["module"]:
                assert not module.startswith(("dpfl", "*")), module
