"""Regenerate the checked-in gRPC code from ``protos/dpfl/v1/*.proto``.

Why a virtual proto path: the sources live in ``protos/dpfl/v1/`` while the installed Python
package is ``dpfl.protos.dpfl.v1`` (setuptools maps ``protos/`` to ``dpfl.protos``). Mapping the
virtual path ``dpfl/protos`` onto ``protos/`` makes protoc write imports such as
``from dpfl.protos.dpfl.v1 import agent_pb2``, which resolve in the installed package.

Usage: ``python scripts/gen_protos.py [--out DIR]``. Without ``--out`` the generated files replace
the checked-in ones; with it they are written under DIR (the staleness test compares the two).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos" / "dpfl" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _mypy_grpc_plugin() -> Path:
    """mypy-protobuf's plugin, which writes the typed ``*_pb2_grpc.pyi`` stubs grpc lacks."""
    name = "protoc-gen-mypy_grpc"
    beside = Path(sys.executable).parent / name
    found = beside if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extra (pip install -e '.[dev]')")
    return Path(found)


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto of ``protos/dpfl/v1`` into ``out_dir``; return the files written."""
    sources = sorted(PROTO_DIR.glob("*.proto"))
    if not sources:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    grpc_include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"--proto_path=dpfl/protos={ROOT / 'protos'}",
            f"--proto_path={grpc_include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--plugin=protoc-gen-mypy_grpc={_mypy_grpc_plugin()}",
            f"--mypy_grpc_out={tmp}",
            *[f"dpfl/protos/dpfl/v1/{s.name}" for s in sources],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        produced = Path(tmp) / "dpfl" / "protos" / "dpfl" / "v1"
        out_dir.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for f in sorted(produced.iterdir()):
            if f.name.endswith(GENERATED_SUFFIXES):
                shutil.copyfile(f, out_dir / f.name)
                written.append(out_dir / f.name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="output folder")
    ns = parser.parse_args(argv)
    for path in generate(ns.out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
