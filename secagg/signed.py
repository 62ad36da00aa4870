"""The byte strings of the malicious-secure variant: digests, the graph seed, what agents sign.

Both sides build them here and nowhere else, so the agent that verifies and the coordinator that
relays hash exactly the same bytes (docs/secagg.md#the-signed-byte-strings). Every string starts
with its own domain tag (ASCII, ending in a zero byte), integers are 8-byte big-endian, and each
variable-length field is preceded by its length, so no string of one kind equals one of another
kind or one with other fields. Nothing that a relay can change without an agent's key enters a
digest: not the ECDSA signatures (an (r, s) signature is also valid as (r, n − s)) and not the
certificate bytes (whose CA signature is malleable the same way), only the certificate's public
key. So the coordinator cannot re-draw the graph by re-encoding what it relays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from .errors import ParameterError
from .graph import NeighbourGraph, harary_neighbours, random_harary_graph, random_permutation
from .identity import IdentityError
from .messages import RosterEntry, SecAggSetup
from .randomness import SeededRandomSource

__all__ = [
    "DIGEST_BYTES",
    "advertisement_message",
    "certificate_key_id",
    "consistency_message",
    "graph_seed",
    "public_key_id",
    "roster_digest",
    "roster_hash",
    "seeded_graph",
    "seeded_neighbours",
    "setup_digest",
    "survivors_digest",
]

DIGEST_BYTES = 32
SESSION_BYTES = 32
KEY_BYTES = 32

SETUP_TAG = b"dpfl/secagg/v1/setup\x00"
ADVERTISE_TAG = b"dpfl/secagg/v1/advertise\x00"
ROSTER_ENTRY_TAG = b"dpfl/secagg/v1/roster-entry\x00"
ROSTER_TAG = b"dpfl/secagg/v1/roster\x00"
GRAPH_TAG = b"dpfl/secagg/v1/graph\x00"
SURVIVORS_TAG = b"dpfl/secagg/v1/survivors\x00"
CONSISTENCY_TAG = b"dpfl/secagg/v1/consistency\x00"
#: the label of the graph's stream in ``SeededRandomSource(graph_seed)``
GRAPH_STREAM = "graph"


def _u64(value: int, name: str) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise ParameterError(f"{name} must be an integer in [0, 2^64), got {value!r}")
    return value.to_bytes(8, "big")


def _fixed(value: bytes, size: int, name: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != size:
        length = len(value) if isinstance(value, bytes) else type(value).__name__
        raise ParameterError(f"{name} must be {size} bytes, got {length}")
    return value


def _prefixed(value: bytes) -> bytes:
    return _u64(len(value), "length") + value


def _sha256(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def setup_digest(setup: SecAggSetup) -> bytes:
    """SHA-256 over every field of the setup but the agent's own index."""
    return _sha256(
        SETUP_TAG,
        _u64(setup.num_clients, "num_clients"),
        _u64(setup.degree, "degree"),
        _u64(setup.threshold, "threshold"),
        _u64(setup.ring_bits, "ring_bits"),
        _u64(setup.vector_length, "vector_length"),
        _u64(setup.min_survivors, "min_survivors"),
        _prefixed(setup.encoding_json.encode("utf-8")),
        _prefixed(bytes(setup.session_nonce)),
        _prefixed(setup.threat_model.encode("utf-8")),
    )


def advertisement_message(
    *, session_id: bytes, index: int, encryption_key: bytes, masking_key: bytes, setup: bytes
) -> bytes:
    """What agent ``index`` signs in stage 1: its two public keys, bound to the session and to
    the setup digest ``setup``."""
    return b"".join(
        (
            ADVERTISE_TAG,
            _fixed(session_id, SESSION_BYTES, "session id"),
            _u64(index, "index"),
            _fixed(encryption_key, KEY_BYTES, "encryption public key"),
            _fixed(masking_key, KEY_BYTES, "masking public key"),
            _fixed(setup, DIGEST_BYTES, "setup digest"),
        )
    )


def certificate_key_id(certificate: bytes) -> bytes:
    """SHA-256 of the certificate's SubjectPublicKeyInfo (DER): the part of a peer certificate
    that a relay cannot re-encode.

    Raises:
        IdentityError: not a DER X.509 certificate.
    """
    if not isinstance(certificate, bytes) or not certificate:
        raise IdentityError("no certificate")
    try:
        return public_key_id(x509.load_der_x509_certificate(certificate).public_key())
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"not a DER X.509 certificate ({exc})") from None


def public_key_id(key: CertificatePublicKeyTypes) -> bytes:
    """SHA-256 of a certificate public key's SubjectPublicKeyInfo (DER)."""
    return _sha256(
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def roster_digest(*, index: int, encryption_key: bytes, masking_key: bytes, key_id: bytes) -> bytes:
    """d_j: the advertisement of j as the roster commits to it."""
    return _sha256(
        ROSTER_ENTRY_TAG,
        _u64(index, "index"),
        _fixed(encryption_key, KEY_BYTES, "encryption public key"),
        _fixed(masking_key, KEY_BYTES, "masking public key"),
        _fixed(key_id, DIGEST_BYTES, "certificate key id"),
    )


def roster_hash(roster: Sequence[RosterEntry]) -> bytes:
    """SHA-256 of the roster (entries as given; the protocol sends them in index order)."""
    parts = [ROSTER_TAG, _u64(len(roster), "roster size")]
    for entry in roster:
        parts.append(_u64(entry.index, "roster index"))
        parts.append(_fixed(entry.digest, DIGEST_BYTES, f"roster digest of {entry.index}"))
    return _sha256(*parts)


def graph_seed(session_id: bytes, roster: Sequence[RosterEntry]) -> bytes:
    """The seed of the graph: fixed only once every advertisement of the roster is."""
    return _sha256(GRAPH_TAG, _fixed(session_id, SESSION_BYTES, "session id"), roster_hash(roster))


def seeded_graph(num_clients: int, degree: int, seed: bytes) -> NeighbourGraph:
    """``random_harary_graph`` drawn from the stream ``"graph"`` of ``SeededRandomSource(seed)``."""
    return random_harary_graph(num_clients, degree, SeededRandomSource(seed).stream(GRAPH_STREAM))


def seeded_neighbours(num_clients: int, degree: int, seed: bytes, client: int) -> tuple[int, ...]:
    """N(client) in :func:`seeded_graph`, without building every neighbourhood (an agent needs
    only its own)."""
    stream = SeededRandomSource(seed).stream(GRAPH_STREAM)
    return harary_neighbours(random_permutation(num_clients, stream), degree, client)


def survivors_digest(survivors: Iterable[int]) -> bytes:
    """SHA-256 of the survivor set S, in index order."""
    ordered = sorted(survivors)
    if len(set(ordered)) != len(ordered):
        raise ParameterError("the survivor set lists an index twice")
    return _sha256(
        SURVIVORS_TAG,
        _u64(len(ordered), "survivor count"),
        *(_u64(i, "survivor index") for i in ordered),
    )


def consistency_message(*, session_id: bytes, index: int, survivors: bytes) -> bytes:
    """What agent ``index`` signs in the consistency round: the digest ``survivors`` of S."""
    return b"".join(
        (
            CONSISTENCY_TAG,
            _fixed(session_id, SESSION_BYTES, "session id"),
            _u64(index, "index"),
            _fixed(survivors, DIGEST_BYTES, "survivor-set digest"),
        )
    )
