"""Which of the coordinator's two ports a HOST:PORT is: a quick probe for the common mix-up.

The coordinator listens twice: gRPC for agents (``--grpc-port``, default 50051; HTTP/2 only)
and the REST API and dashboard for people (``--api-port``, default 8080; HTTP/1.1 only). An
agent pointed at the REST port fails with ``Cannot check peer: missing selected ALPN property``,
``dpfl budget`` pointed at the gRPC port with ``Server disconnected without sending a
response``: true, and useless. After such a failure the command calls :func:`probe_port` (one
connection, a short timeout) and :func:`port_hint` turns the answer into what to do:

- over TLS, the server's ALPN choice tells: ``h2`` is the gRPC port (the REST server never
  offers HTTP/2); otherwise an HTTP/1.1 request for ``/healthz`` is sent;
- in plaintext, the HTTP/2 connection preface is sent: a gRPC server answers with an HTTP/2
  SETTINGS frame, the REST server with an ``HTTP/1.1`` status line.

The REST port's ``/healthz`` names the coordinator's gRPC port in the ``X-DPFL-gRPC-Port``
header, which the hint repeats. The probe sends no credential and verifies no certificate (it
only tells the two protocols apart). Standard library only: the three commands share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "GRPC_PORT_HEADER",
    "PortProbe",
    "port_hint",
    "probe_port",
    "split_address",
]

#: The REST port's ``/healthz`` answers with the coordinator's gRPC port in this header.
GRPC_PORT_HEADER = "X-DPFL-gRPC-Port"
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x04


@dataclass(frozen=True, slots=True)
class PortProbe:
    """What answered at a port.

    Attributes:
        kind: ``"rest"`` (HTTP/1.1: the REST API), ``"grpc"`` (HTTP/2 only: the agents' gRPC
            service), or ``"unknown"`` (nothing answered in time, or something else).
        grpc_port: the gRPC port a REST port named (``X-DPFL-gRPC-Port``), if any.
    """

    kind: Literal["rest", "grpc", "unknown"]
    grpc_port: int | None = None


def split_address(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); None when it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def _grpc_port_of(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == GRPC_PORT_HEADER.lower().encode():
            text = value.strip().decode("ascii", "replace")
            return int(text) if text.isdigit() else None
    return None


def _classify(head: bytes) -> PortProbe:
    if head.startswith(b"HTTP/1."):
        return PortProbe("rest", _grpc_port_of(head))
    if len(head) >= 9 and head[3] == _SETTINGS:
        return PortProbe("grpc")
    return PortProbe("unknown")


async def _probe(host: str, port: int, tls: bool) -> PortProbe:
    context: ssl.SSLContext | None = None
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # telling protocols apart only: nothing is sent
        context.set_alpn_protocols(["h2", "http/1.1"])
    reader, writer = await asyncio.open_connection(
        host, port, ssl=context, server_hostname=host if tls else None
    )
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            return PortProbe("grpc")
        if tls:
            request = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
            writer.write(request.encode("ascii"))
        else:
            writer.write(_H2_PREFACE)
        await writer.drain()
        head = await reader.read(4096)
        if head.startswith(b"HTTP/1.") and b"\r\n\r\n" not in head:
            with contextlib.suppress(Exception):
                head += await reader.read(4096)
        if not tls and head.startswith(b"HTTP/1."):
            return await _rest_headers(host, port) or _classify(head)
        return _classify(head)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _rest_headers(host: str, port: int) -> PortProbe | None:
    """A plaintext REST port's ``/healthz`` (for the gRPC port it names)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        request = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode("ascii"))
        await writer.drain()
        head = await reader.read(4096)
        return _classify(head) if head.startswith(b"HTTP/1.") else None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def probe_port(host: str, port: int, *, tls: bool, timeout: float = 2.0) -> PortProbe:
    """What answers at ``host:port``, within ``timeout`` seconds (``"unknown"`` past it, or on
    any connection error: the caller reports its own error then)."""
    try:
        return await asyncio.wait_for(_probe(host, port, tls), timeout)
    except (TimeoutError, OSError, ssl.SSLError, ValueError, EOFError):
        return PortProbe("unknown")


def port_hint(probe: PortProbe, *, wanted: Literal["rest", "grpc"], address: str) -> str | None:
    """What to do when ``address`` is the other port than the ``wanted`` one; None when the
    probe does not show a mix-up."""
    if probe.kind == "unknown" or probe.kind == wanted:
        return None
    if wanted == "grpc":
        known = (
            f"; this coordinator's gRPC port is {probe.grpc_port}"
            if probe.grpc_port is not None
            else ""
        )
        return (
            f"{address} looks like the coordinator's REST port (it answers HTTP/1.1, as the "
            "REST API and dashboard do), not its gRPC port: point the agent's --coordinator at the "
            "gRPC port "
            f"(dpfl-coordinator serve --grpc-port, default 50051){known}"
        )
    return (
        f"{address} looks like the coordinator's gRPC port (it speaks only HTTP/2, as the "
        "agents' gRPC service does), not its REST port: give the REST API's port "
        "(dpfl-coordinator serve --api-port, default 8080)"
    )
