"""Entry point of ``dpfl-agent``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dpfl.cli.base import build_parser, run

#: Modules of dpfl.client.cli providing a subcommand, in the order --help lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = ("run", "status", "keygen")


def parser() -> argparse.ArgumentParser:
    return build_parser(
        prog="dpfl-agent",
        description="The dpfl agent: trains on one silo's data, adds calibrated noise and takes "
        "part in secure aggregation, within its local privacy policy.",
        package="dpfl.client.cli",
        modules=SUBCOMMAND_MODULES,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
