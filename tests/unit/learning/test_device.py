"""Device selection: cuda when available, explicit choices honoured, bad names refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from dpfl.learning.device import cpu_threads, select_device, usable_cores
from dpfl.learning.errors import TrainingError


def test_default_follows_cuda_availability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPFL_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert select_device().type == expected
    assert select_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("DPFL_DEVICE", "cpu")
    assert select_device() == torch.device("cpu")


def test_bad_or_unavailable_devices_are_refused() -> None:
    with pytest.raises(TrainingError, match="unknown device"):
        select_device("gpu0")
    with pytest.raises(TrainingError, match="unsupported device"):
        select_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(TrainingError, match="CUDA is not available"):
            select_device("cuda")


def test_cpu_threads_sets_and_restores() -> None:
    # from 2 threads everywhere, so that the test also shows something where the pools already
    # hold one thread (make test's workers: tests/conftest.py)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threadpool_limits(limits=2):
            blas_before = [pool["num_threads"] for pool in threadpool_info()]
            with cpu_threads(1):
                assert torch.get_num_threads() == 1
                assert all(pool["num_threads"] == 1 for pool in threadpool_info())
            assert torch.get_num_threads() == 2
            assert [pool["num_threads"] for pool in threadpool_info()] == blas_before
    finally:
        torch.set_num_threads(previous)
    with pytest.raises(TrainingError, match="positive integer"), cpu_threads(0):
        pass


@pytest.mark.slow
def test_usable_cores_follow_the_affinity_not_the_machine() -> None:
    """A process pinned to one core (a cpuset, a pinned benchmark worker) counts one core."""
    assert usable_cores() == len(os.sched_getaffinity(0))
    pinned = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from dpfl.learning.device import usable_cores; print(usable_cores(), os.cpu_count())"
    )
    out = subprocess.run(
        [sys.executable, "-c", pinned], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split()[0] == "1"
