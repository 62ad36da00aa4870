"""Entry point of ``dpfl``: privacy accounting, simulation, demo and budget queries."""

import sys

from dpfl.cmdline import Command

COMMAND = Command(
    prog="dpfl",
    description="Differentially private federated learning: privacy accounting, simulation "
    "and budget queries.",
    package="dpfl.cli",
    modules=("privacy", "budget", "simulate", "demo", "audit", "federation", "recipe"),
)
parser, main = COMMAND.parser, COMMAND.main

if __name__ == "__main__":
    sys.exit(main())
