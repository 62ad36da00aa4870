"""Entry point of ``dpfl-agent``."""

import sys

from dpfl.cmdline import Command

COMMAND = Command(
    prog="dpfl-agent",
    description="The dpfl agent: trains on one silo's data, adds calibrated noise and takes "
    "part in secure aggregation, within its local privacy policy.",
    package="dpfl.client.cli",
    modules=("run", "status", "keygen"),
)
parser, main = COMMAND.parser, COMMAND.main

if __name__ == "__main__":
    sys.exit(main())
