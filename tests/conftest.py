"""Session set-up shared by every test: the data folder, and the pytest-xdist workers.

The product finds MNIST, Fashion-MNIST and USPS by one rule (``--data-dir``/``data_dir=``, else
``$DPFL_DATA_DIR``; README, "Data"). The tests follow it unchanged, with one fallback of their
own: when ``$DPFL_DATA_DIR`` is unset and the shared offline copy lies beside the repository
(``../shared/data``, ``support.paths.SHARED_DATA``), it is exported as ``$DPFL_DATA_DIR`` for
the session, so ``make test`` runs the tests that need the files, and so do the commands the
tests start. Tests of the missing-folder errors unset it with ``monkeypatch``.

Under pytest-xdist with several workers (``make test`` runs ``-n``), each worker and every
command it starts gets one native thread (torch's intra-op pool, OpenMP, BLAS): the workers
already fill the cores, and threads beyond the free cores spin-wait (``dpfl.learning.device``
measured one training step up to ~50 times slower). A run without workers keeps the defaults.
The workers also take the files that hold a test marked slow first, in collection order (the
Makefile passes ``--no-loadscope-reorder``), so that the suite does not end with one worker
alone on a long federation while the other has nothing left.
"""

from __future__ import annotations

import os

import pytest
from support.paths import data_dir_for_tests

#: The native thread pools that read their size from the environment when they start.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def pytest_configure(config: pytest.Config) -> None:
    del config
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        for name in THREAD_VARIABLES:
            os.environ.setdefault(name, "1")
        # after the variables, and explicitly too: a plugin may have loaded numpy or torch
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(1)
        threadpool_limits(limits=1)
    found = data_dir_for_tests()
    if found is not None and not os.environ.get("DPFL_DATA_DIR", "").strip():
        os.environ["DPFL_DATA_DIR"] = str(found)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, the files with a test marked slow first; each file's tests keep their order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: files stay contiguous
