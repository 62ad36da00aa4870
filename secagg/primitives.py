"""Key agreement, authenticated encryption of shares and the session identifier.

X25519 with every derived key going through HKDF-SHA256 bound to the session; a directional key
per ordered pair for shares and a symmetric seed per pair for masks; AES-256-GCM whose associated
data binds session, sender and receiver. Low-order and malformed public keys are refused.
Derivations: docs/secagg.md#key-derivation-and-share-encryption.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import DecryptionError, InvalidKey, ParameterError
from .kdf import DOMAIN, derive_key, encode_fields

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_P25519 = 2**255 - 19
# u-coordinates of the points of order 1, 2, 4 and 8 on Curve25519 (Bernstein, "How do I validate
# Curve25519 public keys?"); a key whose masked u reduces to one of these is rejected.
_LOW_ORDER_U = frozenset(
    {
        0,
        1,
        _P25519 - 1,
        325606250916557431795983626356110631294008115727848805560023387167927233504,
        39382357235489614581723060781553021112529911719440698176882885853963445705823,
    }
)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A raw X25519 key pair (32-byte private scalar as given to X25519, 32-byte public u)."""

    private: bytes
    public: bytes

    def __repr__(self) -> str:  # never print a private key
        return f"KeyPair(public={self.public.hex()})"


def keypair_from_private(private: bytes) -> KeyPair:
    """The key pair whose private part is ``private`` (any 32 bytes; X25519 clamps them)."""
    if len(private) != KEY_BYTES:
        raise InvalidKey(f"an X25519 private key has {KEY_BYTES} bytes, got {len(private)}")
    public = X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()
    return KeyPair(private=bytes(private), public=public)


def validate_public_key(public: bytes) -> None:
    """Refuse malformed and low-order X25519 public keys.

    Raises:
        InvalidKey: wrong length or a point of small order.
    """
    if not isinstance(public, bytes) or len(public) != KEY_BYTES:
        length = len(public) if isinstance(public, bytes) else type(public).__name__
        raise InvalidKey(f"an X25519 public key has {KEY_BYTES} bytes, got {length}")
    u = int.from_bytes(public, "little") & ((1 << 255) - 1)
    if u % _P25519 in _LOW_ORDER_U:
        raise InvalidKey("public key is a point of small order")


def agree(private: bytes, peer_public: bytes) -> bytes:
    """Raw X25519 shared secret.

    Raises:
        InvalidKey: a malformed key, or a peer key that yields the all-zero secret.
    """
    validate_public_key(peer_public)
    if len(private) != KEY_BYTES:
        raise InvalidKey(f"an X25519 private key has {KEY_BYTES} bytes, got {len(private)}")
    try:
        return X25519PrivateKey.from_private_bytes(private).exchange(
            X25519PublicKey.from_public_bytes(peer_public)
        )
    except ValueError as exc:  # cryptography refuses an all-zero shared secret
        raise InvalidKey(f"key agreement failed: {exc}") from exc


def agree_many(private: bytes, peer_publics: list[bytes]) -> list[bytes]:
    """Raw X25519 secrets of one private key with many peers (the key object is built once).

    Raises:
        InvalidKey: as :func:`agree`, for the first bad peer key.
    """
    if len(private) != KEY_BYTES:
        raise InvalidKey(f"an X25519 private key has {KEY_BYTES} bytes, got {len(private)}")
    key = X25519PrivateKey.from_private_bytes(private)
    out = []
    for peer in peer_publics:
        validate_public_key(peer)
        try:
            out.append(key.exchange(X25519PublicKey.from_public_bytes(peer)))
        except ValueError as exc:
            raise InvalidKey(f"key agreement failed: {exc}") from exc
    return out


def compute_session_id(*, job_id: str, round: int, nonce: bytes) -> bytes:
    """session_id = SHA-256(encode(job_id ‖ round ‖ nonce)) (docs/secagg.md#stage-0-setup)."""
    if len(nonce) < 16:
        raise ParameterError(f"the server nonce needs ≥ 16 bytes, got {len(nonce)}")
    return hashlib.sha256(encode_fields(DOMAIN, "session", job_id, round, nonce)).digest()


def share_key(shared_secret: bytes, *, session_id: bytes, sender: int, receiver: int) -> bytes:
    """K_ij for the shares that ``sender`` encrypts to ``receiver``."""
    return derive_key(shared_secret, session_id=session_id, label="enc", fields=(sender, receiver))


def mask_seed(shared_secret: bytes, *, session_id: bytes, a: int, b: int) -> bytes:
    """The pairwise mask seed s_ab = s_ba (the order of ``a`` and ``b`` does not matter)."""
    lo, hi = min(a, b), max(a, b)
    return derive_key(shared_secret, session_id=session_id, label="mask", fields=(lo, hi))


def _share_ad(session_id: bytes, sender: int, receiver: int) -> bytes:
    return encode_fields(DOMAIN, "share", session_id, sender, receiver)


def encrypt_share(
    key: bytes, *, session_id: bytes, sender: int, receiver: int, plaintext: bytes, nonce: bytes
) -> bytes:
    """``nonce ‖ AES-256-GCM(key, nonce, plaintext, ad)``, ad = session ‖ "share" ‖ i ‖ j."""
    if len(key) != 32:
        raise ParameterError(f"an AES-256 key has 32 bytes, got {len(key)}")
    if len(nonce) != NONCE_BYTES:
        raise ParameterError(f"a GCM nonce has {NONCE_BYTES} bytes, got {len(nonce)}")
    return nonce + AESGCM(key).encrypt(nonce, plaintext, _share_ad(session_id, sender, receiver))


def decrypt_share(
    key: bytes, *, session_id: bytes, sender: int, receiver: int, ciphertext: bytes
) -> bytes:
    """Inverse of :func:`encrypt_share`.

    Raises:
        DecryptionError: too short, or the tag does not verify (tampered, misdelivered, replayed
            from another session, or encrypted for another sender/receiver pair).
    """
    if len(ciphertext) < NONCE_BYTES + TAG_BYTES:
        raise DecryptionError(f"ciphertext of {len(ciphertext)} bytes is too short")
    nonce, body = ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:]
    try:
        return AESGCM(key).decrypt(nonce, body, _share_ad(session_id, sender, receiver))
    except InvalidTag as exc:
        raise DecryptionError(f"share from {sender} to {receiver} failed authentication") from exc
