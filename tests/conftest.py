"""Session set-up shared by every test: the data folder.

The product finds MNIST, Fashion-MNIST and USPS by one rule (``--data-dir``/``data_dir=``, else
``$DPFL_DATA_DIR``; README, "Data"). The tests follow it unchanged, with one fallback of their
own: when ``$DPFL_DATA_DIR`` is unset and the shared offline copy lies beside the repository
(``../shared/data``, ``support.paths.SHARED_DATA``), it is exported as ``$DPFL_DATA_DIR`` for
the session, so ``make test`` runs the tests that need the files, and so do the commands the
tests start. Tests of the missing-folder errors unset it with ``monkeypatch``.
"""

from __future__ import annotations

import os

import pytest
from support.paths import data_dir_for_tests


def pytest_configure(config: pytest.Config) -> None:
    del config
    found = data_dir_for_tests()
    if found is not None and not os.environ.get("DPFL_DATA_DIR", "").strip():
        os.environ["DPFL_DATA_DIR"] = str(found)
