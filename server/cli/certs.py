"""``dpfl-coordinator certs``: the federation's CA, certificates, CSR signing and revocation.

``sign`` turns an agent's certificate signing request (made on its silo by ``dpfl-agent
keygen``) into its client certificate, so the agent's key never leaves the silo. ``revoke``
adds certificates to the CA's revocation list ``crl.pem``, which a coordinator started with
``--crl`` checks on every gRPC call and re-reads when it changes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from dpfl.cmdline import Subparsers
from dpfl.server import tls

_HOSTNAME_HELP = (
    "a DNS name or IP address agents use to reach the coordinator (repeatable; "
    f"default: {', '.join(tls.DEFAULT_HOSTNAMES)})"
)
_BESIDE_CA = "folder to write into (default: the CA folder); ca.pem is copied alongside"


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="create the CA, the coordinator certificate and agent certificates",
        description="Create a private PKI for one federation: a CA, the coordinator's TLS "
        "certificate and per-agent client certificates for mutual TLS.",
    )
    sub = parser.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    init = sub.add_parser("init", help="create ca.{pem,key} and coordinator.{pem,key}")
    init.add_argument("--out", type=Path, required=True, help="folder to write into")
    init.add_argument("--hostname", action="append", metavar="H", help=_HOSTNAME_HELP)
    _force(init, _init, "overwrite existing files")

    server = sub.add_parser(
        "server",
        help="issue a new coordinator.{pem,key} from an existing CA (renewal, new host names)",
    )
    _ca_dir(server)
    server.add_argument("--hostname", action="append", metavar="H", help=_HOSTNAME_HELP)
    server.add_argument("--out", type=Path, help=_BESIDE_CA)
    _force(server, _server, "overwrite existing files")

    agent = sub.add_parser("agent", help="issue NAME.{pem,key} for one agent (mutual TLS)")
    agent.add_argument("name", help="the agent's name (its certificate's common name)")
    _ca_dir(agent)
    agent.add_argument("--out", type=Path, help=_BESIDE_CA)
    _force(agent, _agent, "overwrite existing files")

    sign = sub.add_parser(
        "sign",
        help="sign an agent's CSR (from 'dpfl-agent keygen'): its key stays on its silo",
    )
    sign.add_argument("csr", type=Path, help="the agent's NAME.csr")
    _ca_dir(sign)
    sign.add_argument(
        "--out",
        type=Path,
        help="folder to write NAME.pem into (default: the CSR's folder); ca.pem is copied "
        "alongside",
    )
    _force(sign, _sign, "overwrite an existing NAME.pem")
    _register_revoke(sub)


def _ca_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ca-dir", type=Path, required=True, help="folder holding ca.pem, ca.key")


def _force(
    parser: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int], help: str
) -> None:
    parser.add_argument("--force", action="store_true", help=help)
    parser.set_defaults(func=func)


def _register_revoke(sub: Subparsers) -> None:
    revoke = sub.add_parser(
        "revoke",
        help="add certificates to the CA's revocation list (crl.pem); none: renew the list",
    )
    _ca_dir(revoke)
    revoke.add_argument(
        "--cert",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a certificate to revoke (repeatable)",
    )
    revoke.add_argument(
        "--serial",
        action="append",
        default=[],
        metavar="N",
        help="a serial number to revoke, decimal or 0x-hex (repeatable)",
    )
    revoke.add_argument("--out", type=Path, help="the CRL file (default: CA folder/crl.pem)")
    revoke.set_defaults(func=_revoke)


def _init(args: argparse.Namespace) -> int:
    hostnames = tuple(args.hostname) if args.hostname else tls.DEFAULT_HOSTNAMES
    return _report(lambda: tls.init_pki(args.out, hostnames=hostnames, force=args.force))


def _server(args: argparse.Namespace) -> int:
    hostnames = tuple(args.hostname) if args.hostname else tls.DEFAULT_HOSTNAMES
    return _report(
        lambda: tls.issue_server_files(
            args.ca_dir, hostnames=hostnames, out=args.out, force=args.force
        )
    )


def _agent(args: argparse.Namespace) -> int:
    return _report(
        lambda: tls.issue_agent_files(args.ca_dir, name=args.name, out=args.out, force=args.force)
    )


def _sign(args: argparse.Namespace) -> int:
    return _report(
        lambda: tls.sign_agent_csr_file(args.ca_dir, args.csr, out=args.out, force=args.force)
    )


def _revoke(args: argparse.Namespace) -> int:
    def action() -> list[Path]:
        serials: list[int] = []
        for text in args.serial:
            try:
                serials.append(int(text, 0))
            except ValueError:
                raise tls.PkiError(f"invalid serial number {text!r}") from None
        for path in args.cert:
            try:
                serials.append(tls.certificate_serial(path.read_bytes()))
            except OSError as exc:
                raise tls.PkiError(f"cannot read {path}: {exc.strerror}") from exc
        return [tls.revoke_certificates(args.ca_dir, serials=serials, out=args.out)]

    return _report(action)


def _report(action: Callable[[], list[Path]]) -> int:
    try:
        written = action()
    except tls.PkiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
