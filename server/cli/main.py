"""Entry point of ``dpfl-coordinator``."""

import sys

from dpfl.cmdline import Command

COMMAND = Command(
    prog="dpfl-coordinator",
    description="The dpfl coordinator: schedules rounds, runs secure aggregation and keeps "
    "the privacy ledger.",
    package="dpfl.server.cli",
    modules=("serve", "enroll_token", "job", "agent", "certs", "dashboard_link", "healthcheck"),
)
parser, main = COMMAND.parser, COMMAND.main

if __name__ == "__main__":
    sys.exit(main())
