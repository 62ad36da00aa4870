"""The certificate revocation list, enforced by the coordinator itself on every RPC.

gRPC's Python TLS credentials take no CRL, so the handshake accepts any client certificate the
CA signed. The servicer therefore checks the verified peer certificate's serial number against
the CA's CRL (``tls_crl_file``, written by ``dpfl-coordinator certs revoke``) on every
``Enroll``, ``Connect`` and ``Download``, and the agents' watch
(:class:`dpfl.server.agents_control.AgentControl`) closes the open streams of revoked
certificates. The file is re-read when it changes (its modification time and size), so a
revocation needs no restart. A file that cannot be read or whose signature is not the CA's
keeps the last good list in force (and is logged); at start-up it is a configuration error.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
from pathlib import Path

from cryptography import x509

from dpfl.server.errors import ConfigurationError, InvalidCredential

__all__ = ["RevocationList", "peer_certificate_serial"]

_log = logging.getLogger("dpfl.coordinator")


def peer_certificate_serial(pem: bytes | None) -> int | None:
    """The serial number of the peer certificate gRPC verified (None without one)."""
    if not pem:
        return None
    try:
        return int(x509.load_pem_x509_certificate(pem).serial_number)
    except ValueError:
        return None


class RevocationList:
    """The revoked serial numbers of one CA, reloaded when the CRL file changes.

    Args:
        crl_file: the CRL (PEM), signed by the CA.
        ca_file: the CA certificate (the client CA of mutual TLS).

    Raises:
        ConfigurationError: the CRL cannot be read or is not the CA's.
    """

    def __init__(self, crl_file: Path, ca_file: Path) -> None:
        from dpfl.server.tls import PkiError

        self.crl_file = crl_file
        try:
            self._ca = ca_file.read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read client CA {ca_file}: {exc.strerror}") from exc
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._revoked: dict[int, dt.datetime] = {}
        try:
            self._load()
        except PkiError as exc:
            raise ConfigurationError(f"certificate revocation list: {exc}") from None

    def _load(self) -> None:
        from dpfl.server.tls import read_crl

        stat = os.stat(self.crl_file)
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        revoked = read_crl(self.crl_file, self._ca)
        self._revoked, self._stamp = revoked, stamp

    def refresh(self) -> None:
        """Re-read the file if it changed; keep the last good list on failure."""
        from dpfl.server.tls import PkiError

        with self._lock:
            try:
                self._load()
            except (OSError, PkiError) as exc:
                _log.error("certificate revocation list not reloaded, the last one stays: %s", exc)

    def revoked(self, serial: int) -> bool:
        self.refresh()
        return serial in self._revoked

    def check(self, serial: int | None) -> None:
        """Raises: InvalidCredential when the peer certificate is revoked."""
        if serial is not None and self.revoked(serial):
            raise InvalidCredential("the client certificate has been revoked")
