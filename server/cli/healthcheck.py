"""``dpfl-coordinator healthcheck``: exit 0 when the local coordinator's ``/healthz`` answers 200.

The container images' ``HEALTHCHECK`` (and compose's) run it inside the coordinator's container,
so it needs neither curl nor the admin token. It checks that the process serves (both servers
listen), not who it is: it talks to its own loopback address, where the certificate's host names
(the public ones agents use) would not match, so TLS certificates are not verified. Without
``--url`` it does not need to know how ``serve`` was configured either: it asks in plain HTTP
first and in HTTPS when the server did not answer that. This order keeps both kinds of server's
logs clean: a TLS server drops a plaintext request silently (a failed handshake is not logged),
while a plaintext server would log every TLS handshake as an invalid HTTP request, at each
probe. The request carries no secret.

Exit codes (Docker's convention): 0 healthy, 1 unhealthy or unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys

from dpfl.cmdline import Subparsers

__all__ = ["probe", "register"]

_DEFAULT_PORT = 8080


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "healthcheck",
        help="exit 0 when the local coordinator's /healthz answers 200 (container probes)",
        description="Probe the coordinator's GET /healthz on this machine: exit 0 when it "
        "answers 200 (both servers listen), 1 otherwise. Tries plain HTTP (a server started "
        "with --insecure), then HTTPS. Certificates are not verified: this checks "
        "that the process serves, not who it is.",
    )
    parser.add_argument(
        "--url",
        help="the exact URL to probe (default: http, else https, on 127.0.0.1 at --port)",
    )
    parser.add_argument(
        "--port",
        type=int,
        help=f"the REST port (default: $DPFL_API_PORT, else {_DEFAULT_PORT})",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    parser.set_defaults(func=_main)


def probe(url: str, *, timeout: float) -> tuple[int | None, str]:
    """GET ``url`` without verifying certificates; (status code or None, one line of detail)."""
    import httpx

    try:
        response = httpx.get(url, timeout=timeout, verify=False, follow_redirects=False)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return response.status_code, response.text.strip().replace("\n", " ")[:200]


def _main(args: argparse.Namespace) -> int:
    if args.url:
        candidates = [args.url]
    else:
        port = args.port if args.port is not None else _env_port()
        if port is None:
            return 1
        candidates = [f"http://127.0.0.1:{port}/healthz", f"https://127.0.0.1:{port}/healthz"]
    status, detail, url = None, "", candidates[0]
    for url in candidates:
        status, detail = probe(url, timeout=args.timeout)
        if status == 200:
            print(f"healthy: {url} {detail}")
            return 0
        if status is not None:  # an HTTP answer: this is the server's scheme, and it is unwell
            break
    print(f"unhealthy: {url}: {detail if status is None else f'HTTP {status} {detail}'}")
    return 1


def _env_port() -> int | None:
    raw = os.environ.get("DPFL_API_PORT", "")
    if not raw:
        return _DEFAULT_PORT
    try:
        return int(raw)
    except ValueError:
        print(f"unhealthy: DPFL_API_PORT is not a port number: {raw!r}", file=sys.stderr)
        return None
