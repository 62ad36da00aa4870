"""The agent's peer identity for malicious-secure rounds, loaded at start-up.

``dpfl-agent run --peer-ca FILE --peer-cert FILE`` names the federation CA the agent trusts (held
by the consortium or an auditor, never by the coordinator's operator) and the agent's peer
certificate, issued by it for the agent's own key (``--key``, the one ``dpfl-agent keygen`` made):
docs/deploy.md#who-holds-which-key. Everything is checked before the agent connects, so a wrong
file stops it with one line naming the file and the problem.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dpfl.client.errors import AgentError
from dpfl.client.summation import PeerCredentials
from dpfl.secagg.identity import IdentityError, PeerAuthority, Signer

__all__ = ["PeerIdentityError", "load_peer_credentials"]


class PeerIdentityError(AgentError):
    """Peer-identity files that are missing, unreadable or do not fit together."""

    exit_code = 2


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PeerIdentityError(f"cannot read the {what} {path}: {exc.strerror}") from None


def load_peer_credentials(
    *, peer_ca: Path | None, peer_cert: Path | None, key: Path | None
) -> PeerCredentials | None:
    """The agent's :class:`PeerCredentials`, or None when no peer identity is configured.

    Raises:
        PeerIdentityError: one of ``--peer-ca``/``--peer-cert`` without the other, no ``--key``,
            an unreadable file, a federation CA that is not a CA, or a peer certificate that is
            not the federation CA's, not valid now, or not for the agent's key.
    """
    if peer_ca is None and peer_cert is None:
        return None
    if peer_ca is None or peer_cert is None:
        raise PeerIdentityError(
            "--peer-ca and --peer-cert go together (the federation CA and this agent's peer "
            "certificate)"
        )
    if key is None:
        raise PeerIdentityError(
            "--peer-cert needs --key: the peer certificate is for the agent's own key"
        )
    ca_pem = _read(peer_ca, "federation CA certificate")
    cert_pem = _read(peer_cert, "peer certificate")
    key_pem = _read(key, "private key")
    try:
        authority = PeerAuthority(ca_pem)
    except IdentityError as exc:
        raise PeerIdentityError(f"{peer_ca}: {exc}") from None
    try:
        signer = Signer(key_pem, cert_pem, authority=authority, now=dt.datetime.now(dt.UTC))
    except IdentityError as exc:
        raise PeerIdentityError(f"{peer_cert}: {exc}") from None
    return PeerCredentials(signer=signer, authority=authority)
