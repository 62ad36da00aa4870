"""Peer identities for the malicious-secure variant: federation-CA certificates, signatures.

A coordinator that runs its own certificate authority can mint as many agents as it likes, so the
protocol counts as a peer only an agent whose certificate was issued by the *federation CA* the
agent itself trusts (held by the consortium or an auditor, never by the coordinator's operator).
One certificate is one peer: its SHA-256 fingerprint is the peer's identity.

The peer profile: an EC P-256 key (the one ``dpfl-agent keygen`` makes), a certificate issued
directly by the federation CA, not a CA itself, valid at the time given, carrying the extended key
usage :data:`PEER_USAGE` that only the federation tooling issues. Signatures are ECDSA with
SHA-256 over byte strings that each start with their own domain tag (the protocol builds them), so
a signature made for one purpose never verifies for another, nor for a TLS handshake.
Pure: no I/O; the current time is an argument. Why: docs/secagg.md#the-malicious-secure-variant.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .errors import ErrorCode, SecAggError

__all__ = [
    "PEER_USAGE",
    "ClientIdentity",
    "IdentityError",
    "PeerAuthority",
    "PeerIdentity",
    "Signer",
]

#: Extended key usage of a peer certificate ("dpfl secure-aggregation peer", a UUID OID).
PEER_USAGE = x509.ObjectIdentifier("2.25.51562114859951535000748438239369683113")


class IdentityError(SecAggError, ValueError):
    """A certificate that is not a peer certificate of the federation CA, or a bad signature."""

    code = ErrorCode.PROTOCOL_ABORT


def _certificate(data: bytes, what: str) -> x509.Certificate:
    if not isinstance(data, bytes) or not data:
        raise IdentityError(f"{what}: no certificate")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise IdentityError(f"{what}: not an X.509 certificate ({exc})") from None


def _p256(key: object, what: str) -> ec.EllipticCurvePublicKey:
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise IdentityError(f"{what}: the key is not EC P-256")
    return key


def _within(cert: x509.Certificate, now: dt.datetime, what: str) -> None:
    if now.tzinfo is None:
        raise IdentityError("the time to check certificates at must be timezone-aware")
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise IdentityError(
            f"{what}: not valid at {now.isoformat()} (valid {cert.not_valid_before_utc.isoformat()}"
            f" to {cert.not_valid_after_utc.isoformat()})"
        )


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """A verified peer: its certificate's fingerprint (the identity), name and key."""

    fingerprint: bytes
    name: str
    certificate_der: bytes = field(repr=False)
    public_key: ec.EllipticCurvePublicKey = field(repr=False, compare=False)

    def verify(self, message: bytes, signature: bytes, *, what: str) -> None:
        """Raise :class:`IdentityError` naming ``what`` unless ``signature`` is this peer's
        ECDSA-SHA256 signature of ``message``."""
        if not isinstance(signature, bytes) or not signature:
            raise IdentityError(f"{what}: no signature from peer {self.name!r}")
        try:
            self.public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise IdentityError(
                f"{what}: the signature of peer {self.name!r} does not verify"
            ) from None


class PeerAuthority:
    """The federation CA an agent trusts; verifies peer certificates (cached by fingerprint)."""

    def __init__(self, ca_certificate: bytes) -> None:
        self._ca = _certificate(ca_certificate, "federation CA")
        constraints = self._ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        if not constraints.ca:
            raise IdentityError("federation CA: the certificate is not a CA certificate")
        _p256(self._ca.public_key(), "federation CA")
        self._cache: dict[bytes, PeerIdentity] = {}

    @property
    def fingerprint(self) -> bytes:
        """SHA-256 of the CA certificate (DER)."""
        return hashlib.sha256(self._ca.public_bytes(serialization.Encoding.DER)).digest()

    def identity(self, certificate: bytes, *, now: dt.datetime) -> PeerIdentity:
        """The peer a certificate (DER or PEM) names.

        Raises:
            IdentityError: not issued by this CA, a CA itself, without the peer usage, not
                valid at ``now``, or a key that is not EC P-256; the message names which.
        """
        cert = _certificate(certificate, "peer certificate")
        der = cert.public_bytes(serialization.Encoding.DER)
        fingerprint = hashlib.sha256(der).digest()
        cached = self._cache.get(fingerprint)
        name = _common_name(cert)
        what = f"peer certificate {name!r}"
        _within(cert, now, what)
        if cached is not None:
            return cached
        try:
            cert.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature):
            raise IdentityError(f"{what}: not issued by the federation CA") from None
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False  # without basic constraints a certificate is not a CA
        if is_ca:
            raise IdentityError(f"{what}: a CA certificate cannot be a peer")
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = x509.ExtendedKeyUsage([])
        if PEER_USAGE not in usages:
            raise IdentityError(f"{what}: no secure-aggregation peer usage")
        peer = PeerIdentity(fingerprint, name, der, _p256(cert.public_key(), what))
        self._cache[fingerprint] = peer
        return peer


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else "(no common name)"


class Signer:
    """An agent's signing key and its peer certificate, checked against the federation CA."""

    def __init__(
        self,
        private_key_pem: bytes,
        certificate: bytes,
        *,
        authority: PeerAuthority,
        now: dt.datetime,
    ) -> None:
        try:
            key = serialization.load_pem_private_key(private_key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(
                f"signing key: not an unencrypted PEM private key ({exc})"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise IdentityError("signing key: not an EC P-256 key")
        self.identity = authority.identity(certificate, now=now)
        if self.identity.public_key.public_numbers() != key.public_key().public_numbers():
            raise IdentityError("the peer certificate is not for this signing key")
        self._key = key

    @property
    def certificate_der(self) -> bytes:
        return self.identity.certificate_der

    def sign(self, message: bytes) -> bytes:
        """ECDSA-SHA256 signature of ``message`` (DER)."""
        return self._key.sign(message, ec.ECDSA(hashes.SHA256()))

    def __repr__(self) -> str:  # never print a private key
        return f"Signer({self.identity.name!r})"


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """What an agent brings to a malicious-secure round (docs/secagg.md#who-is-a-peer).

    Attributes:
        signer: the agent's signing key and peer certificate.
        authority: the federation CA the agent trusts (never the coordinator's).
        max_colluding_peers: c, the most certified peers the agent assumes may collude with the
            coordinator; it decides how many noise shares the agent can count on
            (:func:`dpfl.secagg.client.verified_noise_shares`).
        now: the time certificates are checked at (timezone-aware).

    Raises:
        IdentityError: the signer's certificate is not a peer of ``authority`` at ``now``, or c
            is not an integer ≥ 0.
    """

    signer: Signer
    authority: PeerAuthority = field(repr=False)
    max_colluding_peers: int
    now: dt.datetime

    def __post_init__(self) -> None:
        c = self.max_colluding_peers
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise IdentityError(f"max_colluding_peers must be an integer ≥ 0, got {c!r}")
        if not isinstance(self.signer, Signer) or not isinstance(self.authority, PeerAuthority):
            raise IdentityError("a client identity needs a Signer and a PeerAuthority")
        own = self.authority.identity(self.signer.certificate_der, now=self.now)
        if own.fingerprint != self.signer.identity.fingerprint:  # pragma: no cover - same DER
            raise IdentityError("the signer's certificate changed under verification")
