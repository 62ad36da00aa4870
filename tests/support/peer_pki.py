"""A federation CA and peer certificates made in memory, for the malicious-variant tests.

Production certificates come from the federation tooling; these follow the same profile
(docs/secagg.md#the-malicious-secure-variant) and let a test also make the wrong ones: another
CA's, an expired one, one without the peer usage.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpfl.secagg.identity import PEER_USAGE, ClientIdentity, PeerAuthority, Signer

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class TestCA:
    certificate_pem: bytes
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def make(cls, name: str = "test federation CA") -> TestCA:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=30))
            .not_valid_after(NOW + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), key)

    def authority(self) -> PeerAuthority:
        return PeerAuthority(self.certificate_pem)

    def issue(
        self,
        name: str,
        *,
        key: ec.EllipticCurvePrivateKey | None = None,
        usage: x509.ObjectIdentifier | None = PEER_USAGE,
        days: int = 365,
        start: dt.datetime | None = None,
    ) -> tuple[bytes, bytes]:
        """(private key PEM, certificate PEM) of a peer named ``name``."""
        key = key or ec.generate_private_key(ec.SECP256R1())
        issuer = x509.load_pem_x509_certificate(self.certificate_pem).subject
        start = start or NOW - dt.timedelta(days=1)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([usage] if usage is not None else [])
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)

    def signer(self, name: str, *, authority: PeerAuthority | None = None) -> Signer:
        key_pem, cert_pem = self.issue(name)
        return Signer(key_pem, cert_pem, authority=authority or self.authority(), now=NOW)


def federation_identities(count: int, *, colluding: int = 0) -> list[ClientIdentity]:
    """``count`` peers of one fresh federation CA, checked at :data:`NOW`."""
    ca = TestCA.make()
    authority = ca.authority()
    return [
        ClientIdentity(
            signer=ca.signer(f"peer-{i}", authority=authority),
            authority=authority,
            max_colluding_peers=colluding,
            now=NOW,
        )
        for i in range(count)
    ]
