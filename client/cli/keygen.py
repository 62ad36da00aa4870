"""``dpfl-agent keygen``: make the agent's TLS key and a certificate signing request here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpfl.client.keygen import KeygenError, write_key_and_csr
from dpfl.cmdline import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="make this silo's TLS key and a CSR for the coordinator's CA to sign",
        description="Write NAME.key (mode 0600, it never leaves this machine) and NAME.csr. Send "
        "only NAME.csr to the federation's administrator ('dpfl-coordinator certs sign "
        "NAME.csr'); run the agent with --cert NAME.pem --key NAME.key once it comes back.",
    )
    parser.add_argument("name", help="the agent's name (its certificate's common name)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder (default: .)")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    parser.set_defaults(func=_keygen)


def _keygen(args: argparse.Namespace) -> int:
    try:
        key, csr = write_key_and_csr(args.name, args.out, force=args.force)
    except KeygenError as exc:
        print(f"dpfl-agent keygen: {exc}", file=sys.stderr)
        return exc.exit_code
    print(key)
    print(csr)
    return 0
