"""Fixtures of the learning tests: one torch thread, and the shared offline image data sets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import SHARED_DATA, data_dir_for_tests

from dpfl.learning.device import cpu_threads


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # Tiny models on a shared 2-core machine: a second OpenMP thread only adds spin-waiting
    # (up to 50x slower when another process holds the other core).
    with cpu_threads(1):
        yield


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The tests' data folder (``support.paths.data_dir_for_tests``: ``$DPFL_DATA_DIR``, else
    ``../shared/data`` beside the repository); skip, saying where it looked, when absent."""
    found = data_dir_for_tests()
    if found is None or not (found / "mnist").is_dir():
        pytest.skip(
            f"offline image data not found at {found or SHARED_DATA} "
            "(set DPFL_DATA_DIR to the folder holding mnist/, fashion-mnist/, usps/)"
        )
    return found
