"""``dpfl federation``: the federation CA that certifies peers for malicious-secure rounds.

Held by the consortium or an auditor, never by the coordinator's operator: a coordinator that
could issue peer certificates could fill a round with agents of its own
(docs/deploy.md#who-holds-which-key). ``sign`` turns an agent's CSR (the one ``dpfl-agent
keygen`` made for its TLS certificate: same key, another certificate) into its peer certificate;
``verify`` says whether a certificate counts as a peer of a federation CA.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from pathlib import Path

from dpfl.cmdline import Subparsers
from dpfl.secagg.identity import IdentityError, PeerAuthority
from dpfl.server import tls


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "federation",
        help="the federation CA: peer certificates for malicious-secure rounds",
        description="Create the federation CA (held by the consortium or an auditor, never by "
        "the coordinator's operator), sign agents' CSRs into peer certificates, and verify them.",
    )
    sub = parser.add_subparsers(dest="federation_command", metavar="ACTION", required=True)

    init = sub.add_parser("init", help="create the federation CA: ca.pem and ca.key (mode 0600)")
    init.add_argument("--out", type=Path, required=True, help="folder to write into")
    init.add_argument("--force", action="store_true", help="overwrite an existing CA")
    init.set_defaults(func=_init)

    sign = sub.add_parser(
        "sign", help="sign an agent's CSR into its peer certificate NAME.peer.pem"
    )
    sign.add_argument("csr", type=Path, help="the agent's NAME.csr (from 'dpfl-agent keygen')")
    sign.add_argument("--ca-dir", type=Path, required=True, help="folder holding ca.pem, ca.key")
    sign.add_argument(
        "--out",
        type=Path,
        help="folder to write into (default: the CSR's folder); the CA certificate is copied "
        "alongside as federation-ca.pem",
    )
    sign.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    sign.add_argument("--force", action="store_true", help="overwrite an existing NAME.peer.pem")
    sign.set_defaults(func=_sign)

    verify = sub.add_parser("verify", help="whether a certificate is a peer of a federation CA")
    verify.add_argument("cert", type=Path, help="the certificate to check")
    verify.add_argument("--ca", type=Path, required=True, help="the federation CA certificate")
    verify.set_defaults(func=_verify)


def _init(args: argparse.Namespace) -> int:
    return _report(lambda: tls.init_federation_ca(args.out, force=args.force))


def _sign(args: argparse.Namespace) -> int:
    if args.days < 1:
        print(f"error: --days must be at least 1, got {args.days}", file=sys.stderr)
        return 2
    return _report(
        lambda: tls.sign_peer_csr_file(
            args.ca_dir, args.csr, out=args.out, force=args.force, days=args.days
        )
    )


def _verify(args: argparse.Namespace) -> int:
    try:
        authority = PeerAuthority(args.ca.read_bytes())
        peer = authority.identity(args.cert.read_bytes(), now=dt.datetime.now(dt.UTC))
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except IdentityError as exc:
        print(f"not a peer: {exc}", file=sys.stderr)
        return 1
    print(f"peer {peer.name!r}, fingerprint {peer.fingerprint.hex()}")
    return 0


def _report(action: Callable[[], list[Path]]) -> int:
    try:
        written = action()
    except tls.PkiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
