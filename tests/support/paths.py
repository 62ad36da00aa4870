"""Where things are, for tests that look at the repository itself."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "vectors"
ARTIFACTS = ROOT / "tests" / "artifacts"
#: Code folders and the import package each one becomes (the table of
#: docs/architecture.md#packages).
CODE_PACKAGES = {
    "api": "dpfl",
    "accounting": "dpfl.accounting",
    "secagg": "dpfl.secagg",
    "learning": "dpfl.learning",
    "protos": "dpfl.protos",
    "server": "dpfl.server",
    "client": "dpfl.client",
    "cli": "dpfl.cli",
    "cmdline": "dpfl.cmdline",
}
