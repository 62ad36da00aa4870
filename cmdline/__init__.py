"""The little machinery shared by the three commands ``dpfl``, ``dpfl-coordinator`` and
``dpfl-agent``.

A subcommand is a module exposing ``register(subparsers)``, which adds its parser and sets ``func``
(``Namespace -> exit code``) as the parser's default. Each command lists its subcommand modules
explicitly, rather than discovering them by scanning, so that ``--help`` is fast and its order
stable. This package sits below ``dpfl.server``, ``dpfl.client`` and ``dpfl.cli`` and imports
nothing of dpfl (``tests/unit/test_layering.py``), so all three commands can share it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TypeAlias

#: What a subcommand module's ``register`` receives (``add_subparsers()`` of the command's parser);
#: a string because argparse's class is not subscriptable at run time.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

#: Options whose value is an opaque secret, which may start with "-" (URL-safe base64 does one
#: time in 64): argparse would take ``--token -x...`` for two options, so the next argument is
#: glued to them as ``--token=-x...`` before parsing.
SECRET_OPTIONS = frozenset({"--token"})


def glued(argv: Sequence[str]) -> list[str]:
    """``argv`` with each :data:`SECRET_OPTIONS` option joined to the argument after it (up to a
    ``--``, after which nothing is an option)."""
    out: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == "--":
            out.append(arg)
            out.extend(rest)
            break
        value = next(rest, None) if arg in SECRET_OPTIONS else None
        out.append(arg if value is None else f"{arg}={value}")
    return out


@dataclass(frozen=True)
class Command:
    """A command ``prog`` with one subcommand per module ``package.<module>``, in the order
    ``--help`` lists them."""

    prog: str
    description: str
    package: str
    modules: tuple[str, ...]

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=self.prog, description=self.description)
        parser.add_argument("--version", action="version", version=f"{self.prog} {version()}")
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        for name in self.modules:
            importlib.import_module(f"{self.package}.{name}").register(sub)
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Parse ``argv`` and call the chosen subcommand; without one, print help and return 2."""
        parser = self.parser()
        args = parser.parse_args(glued(sys.argv[1:] if argv is None else argv))
        func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 2
        return func(args)


def version() -> str:
    try:
        return metadata.version("dpfl")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, for a long-running command of the running event loop.

    Where the loop cannot install signal handlers (Windows, a thread other than the main one),
    the event is still returned and the default handling of the signals stays in place.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop
