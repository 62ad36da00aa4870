"""The coordinator's gRPC front end: a thin ``grpc.aio`` adapter over
:mod:`dpfl.server.agent_protocol` and :mod:`dpfl.server.sessions`
(docs/architecture.md#handlers-free-of-transport-typed-errors).

- :class:`AgentServicer` implements ``dpfl.v1.AgentService``; it maps every typed error to the
  status its class names (``err.grpc_status``, table in :mod:`dpfl.server.errors`).
- :func:`start_grpc_server` binds it with the configured message-size limits and keepalive, and
  with TLS when server credentials are given (:func:`server_credentials`).
"""

from dpfl.server.grpc.server import (
    GRPC_OPTIONS,
    server_credentials,
    server_options,
    start_grpc_server,
)
from dpfl.server.grpc.servicer import AgentServicer, grpc_status, peer_certificate_cn

__all__ = [
    "GRPC_OPTIONS",
    "AgentServicer",
    "grpc_status",
    "peer_certificate_cn",
    "server_credentials",
    "server_options",
    "start_grpc_server",
]
