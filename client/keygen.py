"""The agent's private key and certificate signing request, made on the silo.

The key never leaves the machine it is made on: ``dpfl-agent keygen`` writes it (mode 0600)
with a certificate signing request (CSR) naming the agent; only the CSR goes to the federation's
administrator, who signs it (``dpfl-coordinator certs sign``) and sends back the certificate. The
key is ECDSA P-256, the curve the coordinator's PKI uses and every gRPC TLS stack supports.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dpfl.client.errors import AgentError

__all__ = ["KeygenError", "make_key_and_csr", "write_key_and_csr"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class KeygenError(AgentError):
    """A bad agent name, or a file that would be overwritten or cannot be written."""

    exit_code = 2


def make_key_and_csr(name: str) -> tuple[bytes, bytes]:
    """(private key PEM, CSR PEM) for the agent ``name`` (the certificate's common name).

    Raises:
        KeygenError: ``name`` is not 1-63 letters, digits, '.', '_' or '-'.
    """
    if not _NAME_RE.fullmatch(name):
        raise KeygenError(
            f"invalid agent name {name!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def write_key_and_csr(name: str, out: Path, *, force: bool = False) -> tuple[Path, Path]:
    """Write ``out/NAME.key`` (mode 0600) and ``out/NAME.csr``; return their paths.

    Raises:
        KeygenError: a bad name, or a file exists and ``force`` is false (a key is never
            silently replaced: its certificate would stop matching).
    """
    key_pem, csr_pem = make_key_and_csr(name)
    key_path, csr_path = out / f"{name}.key", out / f"{name}.csr"
    existing = [str(p) for p in (key_path, csr_path) if p.exists()]
    if existing and not force:
        raise KeygenError(f"refusing to overwrite {', '.join(existing)} (use --force)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        os.chmod(key_path, 0o600)
        csr_path.write_bytes(csr_pem)
    except OSError as exc:
        raise KeygenError(f"cannot write {exc.filename}: {exc.strerror}") from exc
    return key_path, csr_path
