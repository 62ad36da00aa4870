"""Debian's chromium for the dashboard browser tests: where it is, how it is launched, and the
skip (with its reason) where it or Playwright is absent. The browser is never downloaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "chromium_or_skip"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
]


def chromium_or_skip(path: Path) -> Path:
    """``path`` when Debian's chromium and Playwright are there; otherwise skip, saying why."""
    if not (path.is_file() and shutil.which(str(path))):
        pytest.skip(
            f"Debian's chromium is absent ({path} not found): run `make browser` "
            "(apt-get install chromium) to run the dashboard browser test"
        )
    pytest.importorskip("playwright.sync_api", reason="the playwright Python package is missing")
    return path
