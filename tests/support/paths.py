"""Where things are, for tests that look at the repository itself."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "vectors"
ARTIFACTS = ROOT / "tests" / "artifacts"
#: The tests' data folder (MNIST, Fashion-MNIST, USPS). The product's one rule (README, "Data";
#: ``dpfl.learning.data.images.locate_data_dir``) is ``--data-dir``/``data_dir=``, else
#: ``$DPFL_DATA_DIR``, else an error. The tests add one fallback of their own: the shared offline
#: copy beside the repository (``../shared/data``), which tests/conftest.py exports as
#: ``$DPFL_DATA_DIR`` for the session when it is unset, so every test, and every command a test
#: starts, finds the data by the product's rule. None when neither is there.
SHARED_DATA = ROOT.parent / "shared" / "data"


def data_dir_for_tests() -> Path | None:
    """``$DPFL_DATA_DIR``, else :data:`SHARED_DATA` when it holds ``mnist/``; else None."""
    env = os.environ.get("DPFL_DATA_DIR", "").strip()
    if env:
        return Path(env)
    return SHARED_DATA if (SHARED_DATA / "mnist").is_dir() else None


#: Code folders and the import package each one becomes (the table of
#: docs/architecture.md#packages).
CODE_PACKAGES = {
    "api": "dpfl",
    "accounting": "dpfl.accounting",
    "mechanisms": "dpfl.mechanisms",
    "secagg": "dpfl.secagg",
    "learning": "dpfl.learning",
    "protos": "dpfl.protos",
    "server": "dpfl.server",
    "client": "dpfl.client",
    "cli": "dpfl.cli",
    "cmdline": "dpfl.cmdline",
}
