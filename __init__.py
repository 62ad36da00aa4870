"""Not part of the dpfl package: a guard for a clone of this repository named ``dpfl``.

Python puts the working folder first on ``sys.path``. Run from the folder that *holds* a clone
named ``dpfl``, ``import dpfl`` would find the clone before the installed package, and the
repository's root is not the package (``dpfl`` is ``api/``, ``dpfl.server`` is ``server/``: the
mapping of pyproject.toml, which only an installation applies). Without this file the clone
became a namespace package and failed later with ``module 'dpfl' has no attribute 'privacy'``.

This file makes the clone a regular package that hands the import over: it imports ``dpfl``
again with the clone's parent folder left out of ``sys.path``, so the installed package (an
editable install of this very clone included) is what ``import dpfl`` returns. When dpfl is not
installed in this Python, it says so and how to install it. It never runs otherwise: the
package's own ``__init__`` is ``api/__init__.py``, and nothing installs this file.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys


def _folder_variants(path: str) -> set[str]:
    """``path`` as written (absolute) and with its links resolved."""
    out = {os.path.abspath(path)}
    with contextlib.suppress(OSError, ValueError):
        out.add(os.path.realpath(path))
    return out


def _hand_over() -> None:
    name = __name__
    clone = os.path.dirname(os.path.abspath(__file__))
    parents = _folder_variants(os.path.dirname(clone))
    if getattr(sys, "_dpfl_clone_handover", False):  # a second clone behind the first
        raise ImportError(f"'import {name}' found another source tree named {name!r}: {clone}")
    saved = list(sys.path)
    del sys.modules[name]
    sys.path[:] = [e for e in saved if not (_folder_variants(e or ".") & parents)]
    sys._dpfl_clone_handover = True  # type: ignore[attr-defined]
    try:
        installed = importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"'import {name}' found the source tree {clone} (a clone named {name!r} in the "
            f"working folder {os.path.dirname(clone)}), which is not the package itself, and no "
            f"installed {name} behind it: install it first (`make install` in {clone}, or "
            f"`pip install -e {clone}`), or run Python from another folder"
        ) from exc
    finally:
        sys.path[:] = saved
        del sys._dpfl_clone_handover  # type: ignore[attr-defined]
    sys.modules[name] = installed


if __name__ == "dpfl":
    _hand_over()
