"""Loading the repository's scripts (benchmarks/, scripts/) as modules, for tests of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str, *, register: bool = False) -> ModuleType:
    """The script at ``path`` imported as module ``name``. ``register`` puts it in
    ``sys.modules`` first, which dataclasses and pickling by name need."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
