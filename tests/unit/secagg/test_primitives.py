"""Key agreement, share encryption and the context encoding (docs/secagg.md#primitives)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from dpfl.secagg.errors import DecryptionError, InvalidKey, ParameterError
from dpfl.secagg.kdf import derive_key, encode_fields
from dpfl.secagg.primitives import (
    _LOW_ORDER_U,
    agree,
    compute_session_id,
    decrypt_share,
    encrypt_share,
    keypair_from_private,
    mask_seed,
    share_key,
    validate_public_key,
)

P = 2**255 - 19
SESSION = bytes(range(32))
OTHER_SESSION = bytes(range(1, 33))


def _key(byte: int) -> bytes:
    return keypair_from_private(bytes([byte]) * 32).private


def test_length_prefixing_is_unambiguous() -> None:
    assert encode_fields("enc", 1, 23) != encode_fields("enc", 12, 3)
    assert encode_fields(b"ab", b"c") != encode_fields(b"a", b"bc")
    assert encode_fields("x") != encode_fields(b"x", b"")
    for bad in (-1, 1 << 64, True, 1.5):
        with pytest.raises(ParameterError):
            encode_fields(bad)  # type: ignore[arg-type]


def test_derived_keys_depend_on_every_field() -> None:
    ikm = b"k" * 32
    base = derive_key(ikm, session_id=SESSION, label="enc", fields=(1, 2))
    assert base != derive_key(ikm, session_id=OTHER_SESSION, label="enc", fields=(1, 2))
    assert base != derive_key(ikm, session_id=SESSION, label="mask", fields=(1, 2))
    assert base != derive_key(ikm, session_id=SESSION, label="enc", fields=(2, 1))


def test_share_keys_are_directional_and_mask_seeds_symmetric() -> None:
    a, b = keypair_from_private(_key(1)), keypair_from_private(_key(2))
    secret = agree(a.private, b.public)
    assert secret == agree(b.private, a.public)
    k12 = share_key(secret, session_id=SESSION, sender=1, receiver=2)
    k21 = share_key(secret, session_id=SESSION, sender=2, receiver=1)
    assert k12 != k21
    assert mask_seed(secret, session_id=SESSION, a=1, b=2) == mask_seed(
        secret, session_id=SESSION, a=2, b=1
    )
    assert mask_seed(secret, session_id=SESSION, a=1, b=2) != mask_seed(
        secret, session_id=OTHER_SESSION, a=1, b=2
    )


def test_session_id_binds_job_round_and_nonce() -> None:
    nonce = b"n" * 32
    base = compute_session_id(job_id="job", round=3, nonce=nonce)
    assert len(base) == 32
    assert base != compute_session_id(job_id="job", round=4, nonce=nonce)
    assert base != compute_session_id(job_id="jo", round=3, nonce=nonce)
    assert base != compute_session_id(job_id="job", round=3, nonce=b"m" * 32)
    with pytest.raises(ParameterError):
        compute_session_id(job_id="job", round=3, nonce=b"short")


@pytest.fixture
def ciphertext() -> bytes:
    return encrypt_share(
        b"K" * 32, session_id=SESSION, sender=3, receiver=5, plaintext=b"payload", nonce=b"N" * 12
    )


def test_share_round_trip(ciphertext: bytes) -> None:
    plain = decrypt_share(
        b"K" * 32, session_id=SESSION, sender=3, receiver=5, ciphertext=ciphertext
    )
    assert plain == b"payload"
    assert ciphertext[:12] == b"N" * 12


@pytest.mark.parametrize("position", [0, 11, 12, 20, -1])
def test_flipped_bit_is_rejected(ciphertext: bytes, position: int) -> None:
    tampered = bytearray(ciphertext)
    tampered[position] ^= 0x01
    with pytest.raises(DecryptionError):
        decrypt_share(
            b"K" * 32, session_id=SESSION, sender=3, receiver=5, ciphertext=bytes(tampered)
        )


@pytest.mark.parametrize(
    ("session", "sender", "receiver"),
    [(OTHER_SESSION, 3, 5), (SESSION, 4, 5), (SESSION, 3, 6), (SESSION, 5, 3)],
    ids=["replayed-from-other-session", "other-sender", "misdelivered", "reversed"],
)
def test_associated_data_binds_session_sender_receiver(
    ciphertext: bytes, session: bytes, sender: int, receiver: int
) -> None:
    with pytest.raises(DecryptionError):
        decrypt_share(
            b"K" * 32, session_id=session, sender=sender, receiver=receiver, ciphertext=ciphertext
        )


def test_truncated_ciphertext_is_rejected() -> None:
    with pytest.raises(DecryptionError, match="too short"):
        decrypt_share(b"K" * 32, session_id=SESSION, sender=3, receiver=5, ciphertext=b"x" * 27)


def test_low_order_points_are_rejected_and_really_are_low_order() -> None:
    sk = X25519PrivateKey.from_private_bytes(_key(7))
    for u in [*sorted(_LOW_ORDER_U), P, P + 1]:  # and the non-canonical encodings of 0 and 1
        for high_bit in (0, 1 << 255):
            encoded = (u | high_bit).to_bytes(32, "little")
            with pytest.raises(InvalidKey):
                validate_public_key(encoded)
            if u < P:  # X25519 of a low-order point is all zero, which cryptography refuses
                with pytest.raises(ValueError, match="shared key"):
                    sk.exchange(X25519PublicKey.from_public_bytes(encoded))


@pytest.mark.parametrize("key", [b"", b"x" * 31, b"x" * 33, "x" * 32])
def test_malformed_public_keys_are_rejected(key: bytes) -> None:
    with pytest.raises(InvalidKey):
        validate_public_key(key)


def test_private_keys_never_print() -> None:
    pair = keypair_from_private(_key(9))
    assert pair.private.hex() not in repr(pair)
