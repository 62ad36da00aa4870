"""``dpfl-coordinator dashboard-link``: a one-time link that opens the dashboard signed in.

For scripts and headless browsers (docs/api.md, "Dashboard"): prints
``<REST URL>/#login=<code>`` on stdout, nothing else, so that
``chromium --headless --screenshot "$(dpfl-coordinator dashboard-link)"`` works. The code is
minted from the admin token (``DPFL_ADMIN_TOKEN`` or the ``--config`` file) without asking the
coordinator; the admin token itself never appears in the link. The coordinator exchanges the
code, once and before it expires (``--ttl``, default 10 minutes, at most an hour), for a
read-only dashboard session (:mod:`dpfl.server.dashboard_link`).

The URL is ``--url`` when given, else the REST address of the settings: https when a TLS
certificate is set; a wildcard listen address (``0.0.0.0``, ``::``) becomes the certificate's
first name with TLS and ``127.0.0.1`` without. Exit codes: 0 printed; 2 settings refused or a
bad ``--ttl``/``--url``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from dpfl.cmdline import Subparsers
from dpfl.server.cli.enroll_token import parse_duration
from dpfl.server.dashboard_link import (
    DEFAULT_LINK_TTL_S,
    MAX_LINK_TTL_S,
    dashboard_url,
    mint_code,
)
from dpfl.server.errors import ConfigurationError

if TYPE_CHECKING:
    from dpfl.server.settings import Settings

__all__ = ["base_url", "register"]

_WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "dashboard-link",
        help="print a one-time link that opens the dashboard signed in (scripts, headless "
        "browsers)",
        description="Print <REST URL>/#login=<code>: the dashboard opens signed in with a "
        "read-only session. The code works once, for --ttl; the admin token (DPFL_ADMIN_TOKEN "
        "or --config) signs it and never appears in the link.",
    )
    parser.add_argument("--config", type=Path, help="YAML file of settings")
    parser.add_argument(
        "--url",
        metavar="URL",
        help="the dashboard's base URL as the browser reaches it, e.g. https://coord.example:8080 "
        "(default: from the settings' api_host, api_port and TLS certificate)",
    )
    parser.add_argument(
        "--ttl",
        type=parse_duration,
        metavar="DURATION",
        help=f"how long the link works (default {DEFAULT_LINK_TTL_S / 60:g}m, at most "
        f"{MAX_LINK_TTL_S / 60:g}m)",
    )
    parser.set_defaults(func=_link)


def base_url(settings: Settings) -> str:
    """The REST API's URL from the settings (see the module docstring for wildcards)."""
    scheme = "https" if settings.tls_enabled else "http"
    host = settings.api_host
    if host in _WILDCARDS:
        host = _certificate_name(settings) or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{settings.api_port}"


def _certificate_name(settings: Settings) -> str | None:
    if settings.tls_cert_file is None:
        return None
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(Path(settings.tls_cert_file).read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return None
    for name in names:
        return str(name.value)
    return None


def _link(args: argparse.Namespace) -> int:
    from dpfl.server.settings import load_settings

    ttl = DEFAULT_LINK_TTL_S if args.ttl is None else args.ttl.total_seconds()
    try:
        if args.url is not None:
            parts = urlsplit(args.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigurationError(
                    f"--url {args.url!r}: give the dashboard's base URL, e.g. "
                    "https://coordinator.example:8080"
                )
        settings = load_settings(args.config)
        url = args.url if args.url is not None else base_url(settings)
        code = mint_code(settings.admin_token.get_secret_value(), ttl_s=ttl)
    except (ConfigurationError, ValueError) as exc:
        print(f"dpfl-coordinator dashboard-link: {exc}", file=sys.stderr)
        return 2
    print(dashboard_url(url, code), flush=True)
    return 0
