"""Peer certificates of the federation CA: what counts as a peer, and signatures."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from support.peer_pki import NOW, TestCA

from dpfl.secagg.identity import IdentityError, PeerAuthority, Signer


def test_a_peer_of_the_federation_ca_verifies_and_signs() -> None:
    ca = TestCA.make()
    signer = ca.signer("silo-1")
    peer = ca.authority().identity(signer.certificate_der, now=NOW)
    assert peer.name == "silo-1"
    assert peer.fingerprint == signer.identity.fingerprint
    signature = signer.sign(b"dpfl/test\x00hello")
    peer.verify(b"dpfl/test\x00hello", signature, what="test message")
    with pytest.raises(IdentityError, match="test message: the signature of peer 'silo-1'"):
        peer.verify(b"dpfl/test\x00hellO", signature, what="test message")
    with pytest.raises(IdentityError, match="no signature"):
        peer.verify(b"x", b"", what="test message")


def test_a_certificate_of_another_ca_is_not_a_peer() -> None:
    federation, coordinator = TestCA.make(), TestCA.make("coordinator CA")
    _, minted = coordinator.issue("sybil-1")
    with pytest.raises(IdentityError, match="'sybil-1': not issued by the federation CA"):
        federation.authority().identity(minted, now=NOW)


def test_expired_unusable_and_ca_certificates_are_refused() -> None:
    ca = TestCA.make()
    authority = ca.authority()
    _, old = ca.issue("old", days=10, start=NOW - dt.timedelta(days=20))
    with pytest.raises(IdentityError, match="'old': not valid at"):
        authority.identity(old, now=NOW)
    _, tls_only = ca.issue("tls-only", usage=None)
    with pytest.raises(IdentityError, match="no secure-aggregation peer usage"):
        authority.identity(tls_only, now=NOW)
    with pytest.raises(IdentityError, match="a CA certificate cannot be a peer"):
        authority.identity(ca.certificate_pem, now=NOW)
    with pytest.raises(IdentityError, match=r"not an X\.509 certificate"):
        authority.identity(b"garbage", now=NOW)
    with pytest.raises(IdentityError, match="timezone-aware"):
        authority.identity(old, now=NOW.replace(tzinfo=None))


def test_a_signer_needs_the_key_of_its_certificate() -> None:
    ca = TestCA.make()
    _, cert = ca.issue("silo-1")
    other_key, _ = ca.issue("silo-2")
    with pytest.raises(IdentityError, match="not for this signing key"):
        Signer(other_key, cert, authority=ca.authority(), now=NOW)
    with pytest.raises(IdentityError, match="signing key: not an unencrypted PEM"):
        Signer(b"nope", cert, authority=ca.authority(), now=NOW)


def test_the_authority_must_be_a_ca() -> None:
    ca = TestCA.make()
    _, leaf = ca.issue("silo-1", key=ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(IdentityError, match="not a CA certificate"):
        PeerAuthority(leaf)
