"""Binding the servicer: message-size limits, keepalive, optional TLS.

The limits come from ``Settings.max_message_bytes``: a larger message is refused by gRPC itself
with ``RESOURCE_EXHAUSTED`` before any handler runs. Keepalive pings let the coordinator notice an
agent whose connection died silently, so its session closes and its round counts it as a dropout.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from dpfl.server.errors import ConfigurationError
from dpfl.server.grpc.servicer import AgentServicer
from dpfl.server.settings import Settings

__all__ = ["GRPC_OPTIONS", "server_credentials", "server_options", "start_grpc_server"]

#: Options besides the message limits: ping idle streams every 20 s, give up after 10 s without
#: an answer; accept client pings every 5 s. No SO_REUSEPORT (gRPC's default sets it): two
#: coordinators on one port would split the agents between two ledgers without a word.
GRPC_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
)


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """The channel options of the coordinator's server."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *GRPC_OPTIONS,
    ]


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}") from exc


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings, or None (plaintext).

    With ``require_client_cert`` every connection must present a certificate that chains to
    ``tls_client_ca_file`` (mutual TLS); the handshake refuses anything else, before any RPC
    reaches the servicer. gRPC offers no "ask but do not require" mode, which is why the
    settings only accept a client CA together with ``require_client_cert``.
    """
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    cert = _read(settings.tls_cert_file, "TLS certificate")
    key = _read(settings.tls_key_file, "TLS key")
    ca = (
        _read(settings.tls_client_ca_file, "client CA")
        if settings.tls_client_ca_file is not None and settings.require_client_cert
        else None
    )
    _check_tls_files(
        settings.tls_cert_file, settings.tls_key_file, ca_file=settings.tls_client_ca_file, ca=ca
    )
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def _check_tls_files(
    cert_file: Path, key_file: Path, *, ca_file: Path | None, ca: bytes | None
) -> None:
    """Name the bad file here: gRPC itself only says that it cannot bind the port."""
    from cryptography import x509

    from dpfl.server.tls import PkiError, load_pair

    try:
        load_pair(cert_file, key_file)
    except PkiError as exc:
        raise ConfigurationError(f"TLS certificate and key: {exc}") from None
    if ca is not None:
        try:
            x509.load_pem_x509_certificates(ca)
        except ValueError:
            raise ConfigurationError(f"client CA {ca_file}: not a PEM certificate bundle") from None


async def start_grpc_server(
    servicer: AgentServicer,
    *,
    host: str,
    port: int,
    max_message_bytes: int,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start a ``grpc.aio`` server for ``servicer``; returns it and the bound port (``port`` 0
    picks a free one).

    Raises:
        ConfigurationError: the address cannot be bound.
    """
    server = grpc.aio.server(options=server_options(max_message_bytes))
    server.add_generic_rpc_handlers((servicer.rpc_handlers(),))
    address = f"{host}:{port}"
    try:
        bound = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError as exc:
        raise ConfigurationError(
            f"cannot bind the gRPC server to {address} (--grpc-port {port}): {exc}; is another "
            "process (another coordinator?) listening on it?"
        ) from exc
    if bound == 0:
        raise ConfigurationError(
            f"cannot bind the gRPC server to {address} (--grpc-port {port}): is another process "
            "(another coordinator?) listening on it?"
        )
    await server.start()
    return server, bound
