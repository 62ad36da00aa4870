"""A small private PKI for one federation: a CA, the coordinator's certificate, one per agent.

Our own CA, so that agents trust exactly their federation's coordinator and the coordinator
exactly the agents it certified. Keys are ECDSA P-256, written with mode 0600 and never
overwritten unless asked. :func:`sign_agent_csr` signs a CSR made on the silo with the agent
profile, using only its public key and common name; :func:`revoke_certificates` maintains
``crl.pem``, which the coordinator checks on every RPC (docs/deploy.md#2-certificates).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpfl.secagg.identity import PEER_USAGE

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
SERVER_CERT = "coordinator.pem"
SERVER_KEY = "coordinator.key"
CRL = "crl.pem"
#: how long a CRL is valid before it must be re-issued (``certs revoke`` with no serial renews)
CRL_DAYS = 30
DEFAULT_HOSTNAMES = ("localhost", "127.0.0.1")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class PkiError(Exception):
    """A certificate operation failed: bad name, missing CA, or a file that would be overwritten."""


@dataclass(frozen=True, slots=True)
class IssuedPair:
    """PEM bytes of a certificate and its private key."""

    certificate: bytes
    private_key: bytes


def create_ca(*, common_name: str = "dpfl federation CA", days: int = 3650) -> IssuedPair:
    """A self-signed CA certificate and key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _base_builder(subject=name, issuer=name, public_key=key.public_key(), days=days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return IssuedPair(_pem_cert(builder.sign(key, hashes.SHA256())), _pem_key(key))


def issue_server_certificate(
    ca: IssuedPair, *, hostnames: tuple[str, ...] = DEFAULT_HOSTNAMES, days: int = 825
) -> IssuedPair:
    """The coordinator's certificate, valid for every name in ``hostnames`` (DNS names or IPs).

    Raises:
        PkiError: no host name given, or one that is neither a DNS name nor an IP address.
    """
    if not hostnames:
        raise PkiError("a server certificate needs at least one --hostname")
    sans: list[x509.GeneralName] = []
    for host in hostnames:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not re.fullmatch(r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", host):
                raise PkiError(f"invalid host name {host!r}") from None
            sans.append(x509.DNSName(host))
    return _issue(
        ca, common_name=hostnames[0], sans=sans, usage=ExtendedKeyUsageOID.SERVER_AUTH, days=days
    )


def issue_agent_certificate(ca: IssuedPair, *, name: str, days: int = 825) -> IssuedPair:
    """A client certificate for the agent ``name`` (mutual TLS).

    Raises:
        PkiError: the name is not 1-63 characters of letters, digits, '.', '_' or '-'.
    """
    if not _NAME_RE.fullmatch(name):
        raise PkiError(
            f"invalid agent name {name!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    san = x509.DNSName(name.replace("_", "-").lower())
    return _issue(
        ca, common_name=name, sans=[san], usage=ExtendedKeyUsageOID.CLIENT_AUTH, days=days
    )


def sign_agent_csr(ca: IssuedPair, csr_pem: bytes, *, days: int = 825) -> bytes:
    """A client certificate (PEM) for the key of a CSR made on the agent's silo.

    Only the CSR's public key and common name are used: the certificate gets the agent profile
    of this module, never extensions the CSR asks for.

    Raises:
        PkiError: not a PEM CSR, a bad self-signature, a key that is not EC P-256, or a common
            name that is not a valid agent name.
    """
    key, name = _csr_key_and_name(csr_pem)
    san: list[x509.GeneralName] = [x509.DNSName(name.replace("_", "-").lower())]
    usage = ExtendedKeyUsageOID.CLIENT_AUTH
    return _sign(ca, key, common_name=name, sans=san, usage=usage, days=days)


def sign_peer_csr(ca: IssuedPair, csr_pem: bytes, *, days: int = 825) -> bytes:
    """A *peer* certificate (PEM) of the federation CA ``ca`` for the key of an agent's CSR:
    the profile :mod:`dpfl.secagg.identity` counts as one peer in malicious-secure rounds
    (extended key usage ``PEER_USAGE`` only, never a TLS usage). Same CSR rules as
    :func:`sign_agent_csr`.

    Raises:
        PkiError: as :func:`sign_agent_csr`.
    """
    key, name = _csr_key_and_name(csr_pem)
    san: list[x509.GeneralName] = [x509.DNSName(name.replace("_", "-").lower())]
    return _sign(ca, key, common_name=name, sans=san, usage=PEER_USAGE, days=days)


def issue_peer_certificate(ca: IssuedPair, *, name: str, days: int = 825) -> IssuedPair:
    """A key and its peer certificate from the federation CA ``ca``, made in one place: for a
    simulation, whose agents and federation CA live in the same process.

    Raises:
        PkiError: the name is not 1-63 characters of letters, digits, '.', '_' or '-'.
    """
    if not _NAME_RE.fullmatch(name):
        raise PkiError(f"invalid peer name {name!r}")
    san = x509.DNSName(name.replace("_", "-").lower())
    return _issue(ca, common_name=name, sans=[san], usage=PEER_USAGE, days=days)


def _csr_key_and_name(csr_pem: bytes) -> tuple[ec.EllipticCurvePublicKey, str]:
    """The P-256 key and the agent name of a CSR whose self-signature verifies."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise PkiError(f"not a PEM certificate signing request ({exc})") from None
    if not csr.is_signature_valid:
        raise PkiError("the CSR's signature does not verify (it was not made with its key)")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise PkiError("the CSR's key must be EC P-256 (what 'dpfl-agent keygen' makes)")
    attrs = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(attrs) != 1:
        raise PkiError("the CSR must name exactly one common name (the agent's name)")
    name = str(attrs[0].value)
    if not _NAME_RE.fullmatch(name):
        raise PkiError(
            f"invalid agent name {name!r} in the CSR: use 1-63 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    return key, name


def init_federation_ca(out: Path, *, force: bool = False) -> list[Path]:
    """Create the federation CA ``out/ca.{pem,key}``, which certifies peers for
    malicious-secure rounds and is held by the consortium or an auditor, never by the
    coordinator's operator (docs/deploy.md#who-holds-which-key); return the files written.

    Raises:
        PkiError: a file exists and ``force`` is false.
    """
    targets = [out / CA_CERT, out / CA_KEY]
    _refuse_overwrite(targets, force)
    ca = create_ca(common_name="dpfl peer federation CA")
    out.mkdir(parents=True, exist_ok=True)
    _write_pair(ca, *targets)
    return targets


def sign_peer_csr_file(
    ca_dir: Path, csr_path: Path, *, out: Path | None = None, force: bool = False, days: int = 825
) -> list[Path]:
    """Sign ``csr_path`` with the federation CA in ``ca_dir`` (:func:`sign_peer_csr`); write
    ``NAME.peer.pem`` (and a copy of ``ca.pem`` as ``federation-ca.pem``) next to the CSR or into
    ``out``; return the files written.

    Raises:
        PkiError: unreadable files, a bad CSR, or a file would be overwritten.
    """
    ca = load_pair(ca_dir / CA_CERT, ca_dir / CA_KEY)
    try:
        csr_pem = csr_path.read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {csr_path}: {exc.strerror}") from exc
    cert = sign_peer_csr(ca, csr_pem, days=days)
    name = certificate_common_name(cert)
    out = out or csr_path.parent
    targets = [out / f"{name}.peer.pem", out / "federation-ca.pem"]
    _refuse_overwrite(targets[:1], force)
    out.mkdir(parents=True, exist_ok=True)
    targets[0].write_bytes(cert)
    targets[1].write_bytes(ca.certificate)
    return targets


def sign_agent_csr_file(
    ca_dir: Path, csr_path: Path, *, out: Path | None = None, force: bool = False
) -> list[Path]:
    """Sign ``csr_path`` with the CA in ``ca_dir``; write ``NAME.pem`` (and a copy of ``ca.pem``)
    next to the CSR or into ``out``; return the files written.

    Raises:
        PkiError: unreadable files, a bad CSR (:func:`sign_agent_csr`), or a file would be
            overwritten.
    """
    ca = load_pair(ca_dir / CA_CERT, ca_dir / CA_KEY)
    try:
        csr_pem = csr_path.read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {csr_path}: {exc.strerror}") from exc
    cert = sign_agent_csr(ca, csr_pem)
    name = certificate_common_name(cert)
    out = out or csr_path.parent
    target = out / f"{name}.pem"
    _refuse_overwrite([target], force)
    out.mkdir(parents=True, exist_ok=True)
    target.write_bytes(cert)
    return _with_ca_copy([target], ca, ca_dir, out)


def certificate_serial(pem: bytes) -> int:
    """The serial number of a PEM certificate (what a CRL lists)."""
    try:
        return int(x509.load_pem_x509_certificate(pem).serial_number)
    except ValueError as exc:
        raise PkiError(f"not a PEM certificate ({exc})") from None


def build_crl(ca: IssuedPair, revoked: dict[int, dt.datetime], *, days: int = CRL_DAYS) -> bytes:
    """A CRL (PEM) signed by the CA listing ``revoked`` (serial → revocation time)."""
    ca_cert, ca_key = _ca_objects(ca)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - dt.timedelta(minutes=5))
        .next_update(now + dt.timedelta(days=days))
    )
    for serial, at in sorted(revoked.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(at).build()
        )
    crl = builder.sign(ca_key, hashes.SHA256())
    return crl.public_bytes(serialization.Encoding.PEM)


def read_crl(path: Path, ca_certificate: bytes) -> dict[int, dt.datetime]:
    """The serials a CRL file revokes (serial → revocation time), after checking that the CA
    signed it.

    Raises:
        PkiError: unreadable, not a PEM CRL, or not signed by this CA.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        crl = x509.load_pem_x509_crl(data)
    except ValueError as exc:
        raise PkiError(f"{path}: not a PEM certificate revocation list ({exc})") from None
    ca_cert = x509.load_pem_x509_certificate(ca_certificate)
    public_key = ca_cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not crl.is_signature_valid(
        public_key
    ):
        raise PkiError(f"{path}: not signed by the CA {ca_cert.subject.rfc4514_string()}")
    return {int(r.serial_number): r.revocation_date_utc for r in crl}


def revoke_certificates(ca_dir: Path, *, serials: list[int], out: Path | None = None) -> Path:
    """Add ``serials`` to the CA's ``crl.pem`` (created when missing) and re-sign it; with no
    serial this renews the list's validity. Returns the CRL written.

    Raises:
        PkiError: the CA files are missing, or the existing CRL is not the CA's.
    """
    ca = load_pair(ca_dir / CA_CERT, ca_dir / CA_KEY)
    target = out or ca_dir / CRL
    revoked = read_crl(target, ca.certificate) if target.exists() else {}
    now = dt.datetime.now(dt.UTC)
    for serial in serials:
        if serial <= 0:
            raise PkiError(f"invalid certificate serial number {serial}")
        revoked.setdefault(serial, now)
    data = build_crl(ca, revoked)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)  # a coordinator reading it never sees half a file
    return target


def _ca_objects(ca: IssuedPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert = x509.load_pem_x509_certificate(ca.certificate)
    ca_key = serialization.load_pem_private_key(ca.private_key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise PkiError("the CA key must be an EC key")
    return ca_cert, ca_key


def certificate_common_name(pem: bytes) -> str:
    """The subject CN of a PEM certificate (how the coordinator names an mTLS peer)."""
    cert = x509.load_pem_x509_certificate(pem)
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not attrs:
        raise PkiError("certificate has no common name")
    return str(attrs[0].value)


def init_pki(out: Path, *, hostnames: tuple[str, ...], force: bool = False) -> list[Path]:
    """Create ``out/ca.{pem,key}`` and ``out/coordinator.{pem,key}``; return the files written.

    Raises:
        PkiError: a file exists and ``force`` is false (a CA key is never silently replaced:
            every certificate it issued would stop verifying).
    """
    targets = [out / n for n in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)]
    _refuse_overwrite(targets, force)
    ca = create_ca()
    server = issue_server_certificate(ca, hostnames=hostnames)
    out.mkdir(parents=True, exist_ok=True)
    _write_pair(ca, out / CA_CERT, out / CA_KEY)
    _write_pair(server, out / SERVER_CERT, out / SERVER_KEY)
    return targets


def issue_server_files(
    ca_dir: Path, *, hostnames: tuple[str, ...], out: Path | None = None, force: bool = False
) -> list[Path]:
    """Issue a new ``coordinator.pem``/``coordinator.key`` signed by the CA in ``ca_dir`` (a
    renewal, or new host names) plus a copy of ``ca.pem``; return the files written. Agents keep
    trusting the coordinator because the CA is the same.

    Raises:
        PkiError: the CA files are missing or unreadable, a bad host name, or a file would be
            overwritten.
    """
    ca = load_pair(ca_dir / CA_CERT, ca_dir / CA_KEY)
    out = out or ca_dir
    targets = [out / SERVER_CERT, out / SERVER_KEY]
    _refuse_overwrite(targets, force)
    pair = issue_server_certificate(ca, hostnames=hostnames)
    out.mkdir(parents=True, exist_ok=True)
    _write_pair(pair, *targets)
    return _with_ca_copy(targets, ca, ca_dir, out)


def issue_agent_files(
    ca_dir: Path, *, name: str, out: Path | None = None, force: bool = False
) -> list[Path]:
    """Issue ``NAME.pem``/``NAME.key`` signed by the CA in ``ca_dir``, plus a copy of ``ca.pem``
    so that the folder is all an agent needs; return the files written.

    Raises:
        PkiError: the CA files are missing or unreadable, or a file would be overwritten.
    """
    ca = load_pair(ca_dir / CA_CERT, ca_dir / CA_KEY)
    out = out or ca_dir
    targets = [out / f"{name}.pem", out / f"{name}.key"]
    _refuse_overwrite(targets, force)
    pair = issue_agent_certificate(ca, name=name)
    out.mkdir(parents=True, exist_ok=True)
    _write_pair(pair, *targets)
    return _with_ca_copy(targets, ca, ca_dir, out)


def load_pair(cert_path: Path, key_path: Path) -> IssuedPair:
    """Read a certificate and its key, checking that they belong together."""
    try:
        cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {exc.filename}: {exc.strerror}") from exc
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as exc:
        raise PkiError(f"{cert_path} / {key_path}: not a PEM certificate and key ({exc})") from exc
    if cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise PkiError(f"{key_path} is not the key of {cert_path}")
    return IssuedPair(cert_pem, key_pem)


def _issue(
    ca: IssuedPair,
    *,
    common_name: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    days: int,
) -> IssuedPair:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(ca, key.public_key(), common_name=common_name, sans=sans, usage=usage, days=days)
    return IssuedPair(cert, _pem_key(key))


def _sign(
    ca: IssuedPair,
    public_key: ec.EllipticCurvePublicKey,
    *,
    common_name: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    days: int,
) -> bytes:
    """A leaf certificate (PEM) of ``public_key``, signed by the CA."""
    ca_cert, ca_key = _ca_objects(ca)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _base_builder(subject=subject, issuer=ca_cert.subject, public_key=public_key, days=days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    return _pem_cert(builder.sign(ca_key, hashes.SHA256()))


def _base_builder(
    *, subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _with_ca_copy(written: list[Path], ca: IssuedPair, ca_dir: Path, out: Path) -> list[Path]:
    """``written`` and, when ``out`` is not the CA's folder, the copy of ``ca.pem`` made there."""
    if (out / CA_CERT).resolve() == (ca_dir / CA_CERT).resolve():
        return written
    (out / CA_CERT).write_bytes(ca.certificate)
    return [*written, out / CA_CERT]


def _refuse_overwrite(paths: list[Path], force: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise PkiError(f"refusing to overwrite {', '.join(existing)} (use --force)")


def _write_pair(pair: IssuedPair, cert_path: Path, key_path: Path) -> None:
    cert_path.write_bytes(pair.certificate)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pair.private_key)
    os.chmod(key_path, 0o600)  # O_CREAT's mode does not apply to a file that already existed
