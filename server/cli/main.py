"""Entry point of ``dpfl-coordinator``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dpfl.cmdline import build_parser, run

#: Modules of dpfl.server.cli providing a subcommand, in the order --help lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "serve",
    "enroll_token",
    "job",
    "agent",
    "certs",
    "dashboard_link",
    "healthcheck",
)


def parser() -> argparse.ArgumentParser:
    return build_parser(
        prog="dpfl-coordinator",
        description="The dpfl coordinator: schedules rounds, runs secure aggregation and keeps "
        "the privacy ledger.",
        package="dpfl.server.cli",
        modules=SUBCOMMAND_MODULES,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
