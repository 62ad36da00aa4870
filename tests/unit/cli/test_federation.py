"""``dpfl federation``: the federation CA, peer certificates from agents' CSRs, and the agent's
``--peer-ca``/``--peer-cert`` start-up checks (docs/deploy.md#who-holds-which-key)."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from dpfl.cli.main import main
from dpfl.client.keygen import write_key_and_csr
from dpfl.client.peer_identity import PeerIdentityError, load_peer_credentials
from dpfl.secagg.identity import IdentityError, PeerAuthority
from dpfl.server import tls


def _silo(tmp_path: Path, name: str = "silo-1") -> tuple[Path, Path]:
    """(key, csr) made on the silo, as ``dpfl-agent keygen`` makes them."""
    return write_key_and_csr(name, tmp_path / name)


def test_init_sign_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fed = tmp_path / "federation"
    assert main(["federation", "init", "--out", str(fed)]) == 0
    assert stat.S_IMODE((fed / "ca.key").stat().st_mode) == 0o600
    key, csr = _silo(tmp_path)
    assert main(["federation", "sign", str(csr), "--ca-dir", str(fed)]) == 0
    peer_cert = csr.parent / "silo-1.peer.pem"
    assert (csr.parent / "federation-ca.pem").read_bytes() == (fed / "ca.pem").read_bytes()
    authority = PeerAuthority((fed / "ca.pem").read_bytes())
    assert authority.identity(peer_cert.read_bytes(), now=dt.datetime.now(dt.UTC)).name == "silo-1"
    # the agent's own key signs for that certificate
    creds = load_peer_credentials(peer_ca=fed / "ca.pem", peer_cert=peer_cert, key=key)
    assert creds is not None
    assert creds.signer.identity.name == "silo-1"
    capsys.readouterr()
    assert main(["federation", "verify", str(peer_cert), "--ca", str(fed / "ca.pem")]) == 0
    assert "peer 'silo-1'" in capsys.readouterr().out
    # a second init refuses to replace the CA: every peer certificate would stop verifying
    assert main(["federation", "init", "--out", str(fed)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err


def test_the_coordinators_certificates_are_never_peers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = tmp_path / "coordinator-pki"
    tls.init_pki(coordinator, hostnames=("localhost",))
    key, csr = _silo(tmp_path)
    (tls_cert,) = [p for p in tls.sign_agent_csr_file(coordinator, csr) if p.name == "silo-1.pem"]
    # the coordinator's CA as a "federation CA": its agent profile has no peer usage
    own = PeerAuthority((coordinator / "ca.pem").read_bytes())
    with pytest.raises(IdentityError, match="no secure-aggregation peer usage"):
        own.identity(tls_cert.read_bytes(), now=dt.datetime.now(dt.UTC))
    # against the real federation CA it is not even issued by it
    fed = tmp_path / "federation"
    tls.init_federation_ca(fed)
    code = main(["federation", "verify", str(tls_cert), "--ca", str(fed / "ca.pem")])
    assert code == 1
    assert "not issued by the federation CA" in capsys.readouterr().err
    with pytest.raises(PeerIdentityError, match=r"silo-1\.pem: .*not issued by the federation CA"):
        load_peer_credentials(peer_ca=fed / "ca.pem", peer_cert=tls_cert, key=key)


def test_bad_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fed = tmp_path / "federation"
    tls.init_federation_ca(fed)
    bad = tmp_path / "bad.csr"
    bad.write_text("not a csr")
    assert main(["federation", "sign", str(bad), "--ca-dir", str(fed)]) == 2
    assert "not a PEM certificate signing request" in capsys.readouterr().err
    _, csr = _silo(tmp_path)
    assert main(["federation", "sign", str(csr), "--ca-dir", str(fed), "--days", "0"]) == 2
    assert "--days must be at least 1" in capsys.readouterr().err
    assert main(["federation", "sign", str(csr), "--ca-dir", str(tmp_path / "none")]) == 2
    capsys.readouterr()
    assert main(["federation", "verify", str(tmp_path / "missing.pem"), "--ca", "x"]) == 2


def test_the_agent_refuses_an_incomplete_or_foreign_peer_identity(tmp_path: Path) -> None:
    fed = tmp_path / "federation"
    tls.init_federation_ca(fed)
    key, csr = _silo(tmp_path)
    (peer_cert, _) = tls.sign_peer_csr_file(fed, csr)
    other_key, _ = _silo(tmp_path, "silo-2")
    assert load_peer_credentials(peer_ca=None, peer_cert=None, key=key) is None
    with pytest.raises(PeerIdentityError, match="--peer-ca and --peer-cert go together"):
        load_peer_credentials(peer_ca=fed / "ca.pem", peer_cert=None, key=key)
    with pytest.raises(PeerIdentityError, match="needs --key"):
        load_peer_credentials(peer_ca=fed / "ca.pem", peer_cert=peer_cert, key=None)
    with pytest.raises(PeerIdentityError, match="not for this signing key"):
        load_peer_credentials(peer_ca=fed / "ca.pem", peer_cert=peer_cert, key=other_key)
    with pytest.raises(PeerIdentityError, match="cannot read the federation CA certificate"):
        load_peer_credentials(peer_ca=tmp_path / "nope.pem", peer_cert=peer_cert, key=key)
    with pytest.raises(PeerIdentityError, match="not a CA certificate"):
        load_peer_credentials(peer_ca=peer_cert, peer_cert=peer_cert, key=key)
