"""Entry point of ``dpfl``: privacy accounting, simulation, demo and budget queries."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dpfl.cmdline import build_parser, run

#: Modules of dpfl.cli providing a subcommand, in the order --help lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = ("privacy", "budget", "simulate", "demo", "audit")


def parser() -> argparse.ArgumentParser:
    return build_parser(
        prog="dpfl",
        description="Differentially private federated learning: privacy accounting, simulation "
        "and budget queries.",
        package="dpfl.cli",
        modules=SUBCOMMAND_MODULES,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
