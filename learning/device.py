"""Where local training runs: ``cuda`` when a GPU is visible, otherwise the CPU.

The choice is made per call (never at import), so a test or an operator can force the CPU with
``DPFL_DEVICE=cpu`` or an explicit argument without touching global state.

CPU threads: the small models of dpfl gain little from several intra-op threads, and when more
busy threads exist than free cores (several agents in one machine, a test suite beside other
work), OpenMP's spin-waiting makes each step up to ~50 times slower (measured on 2 cores:
a digits logreg epoch took 3.4 s with 2 threads beside one busy process and 0.07 s with one).
Processes that host several agents should run them under :func:`cpu_threads` (1).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits

from dpfl.learning.errors import TrainingError

__all__ = ["cpu_threads", "select_device", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's cpuset, a pinned
    benchmark worker), not every core of the machine that ``os.cpu_count`` reports."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


@contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch intra-op threads and at most ``count`` BLAS/OpenMP
    threads in numpy's and scipy's native libraries, restoring both afterwards.

    BLAS matters as much as torch here: numpy's ``dot``/``norm`` on a 10⁵-vector took 9 µs alone
    and 0.4-2.8 ms with four such processes on 2 cores, because OpenBLAS's threads spin.

    Raises:
        TrainingError: ``count`` is not a positive integer.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TrainingError(f"thread count must be a positive integer, got {count!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        with threadpool_limits(limits=count):
            yield
    finally:
        torch.set_num_threads(before)


def select_device(preferred: str | torch.device | None = None) -> torch.device:
    """Return the device that training and evaluation should use.

    Args:
        preferred: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a :class:`torch.device`. ``None`` reads
            ``DPFL_DEVICE`` and otherwise picks ``cuda`` when available, so a silo with a GPU
            uses it without configuration.

    Returns:
        The device to place models and batches on.

    Raises:
        TrainingError: the preferred device is malformed, or CUDA was asked for but is unavailable
            (silently falling back to the CPU would hide a misconfigured GPU silo).
    """
    if preferred is None:
        preferred = os.environ.get("DPFL_DEVICE") or None
    if preferred is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(preferred)
    except (RuntimeError, TypeError) as exc:
        raise TrainingError(f"unknown device {preferred!r}: expected 'cpu' or 'cuda[:N]'") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TrainingError(f"device {preferred!r} requested but CUDA is not available here")
    if device.type not in ("cpu", "cuda"):
        raise TrainingError(f"unsupported device {preferred!r}: expected 'cpu' or 'cuda[:N]'")
    return device
