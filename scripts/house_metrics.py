"""The size figures of issue 35's targets, read from the git-tracked sources.

Prints one JSON line: lines of code in learning/ server/ client/ cli/ api/ (generated code
excluded), functions longer than 60 lines (Python's ast, decorators included), and
`dict[str, Any]` / `Mapping[str, Any]` occurrences in server/ and learning/.
``tests/unit/test_house_metrics.py`` holds the ceilings as a ratchet.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

CODE_DIRS = ("learning", "server", "client", "cli", "api")
TYPED_DIRS = ("server", "learning")
LONG_FUNCTION = 60
_ANY_MAP = re.compile(r"\b(?:dict|Mapping|MutableMapping)\[\s*str\s*,\s*Any\s*\]")


@dataclass(frozen=True)
class HouseMetrics:
    lines: int
    long_functions: int
    any_maps: int
    longest: list[str]


def _tracked(root: Path, dirs: tuple[str, ...]) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--", *(f"{d}/*.py" for d in dirs)],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [root / p for p in out if "_pb2" not in p and (root / p).exists()]


def _function_lengths(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            found.append((length, f"{path.name}:{node.lineno} {node.name}"))
    return found


def measure(root: Path) -> HouseMetrics:
    code = _tracked(root, CODE_DIRS)
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in code)
    lengths = sorted((f for p in code for f in _function_lengths(p)), reverse=True)
    long = [f"{n} {where}" for n, where in lengths if n > LONG_FUNCTION]
    any_maps = sum(
        len(_ANY_MAP.findall(p.read_text(encoding="utf-8"))) for p in _tracked(root, TYPED_DIRS)
    )
    return HouseMetrics(lines=lines, long_functions=len(long), any_maps=any_maps, longest=long)


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    print(json.dumps(asdict(measure(root))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
