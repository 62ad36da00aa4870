"""Mutual TLS: one certificate one agent, keys made on the silo, and the revocation list.

Real coordinator with mutual TLS on loopback (SQLite and PostgreSQL), real ``dpfl-agent
keygen`` / ``dpfl-coordinator certs sign|revoke`` commands, real TLS channels:

- a silo enrolled with its certificate cannot enrol a second agent (a second budget) with a
  fresh token over the same certificate: refused, and the token stays unused;
- a key made by ``dpfl-agent keygen`` (never leaving the silo folder) and a certificate signed
  from its CSR enrol and connect;
- ``dpfl-coordinator certs revoke`` of that certificate closes its open stream within seconds,
  and every later ``Enroll``, ``Connect`` and ``Download`` with it is ``UNAUTHENTICATED``,
  without a restart; other certificates keep working.
"""

from __future__ import annotations

import asyncio
import stat
from datetime import timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest
from support.tls_federation import make_pki, tls_settings

from dpfl.client.cli.main import main as agent_main
from dpfl.client.runtime import channel_credentials
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.dpfl.v1 import agent_pb2_grpc
from dpfl.server import tls
from dpfl.server.cli.main import main as coordinator_main
from dpfl.server.coordinator import Coordinator

from .test_tls_coordinator import _wait_for


def _meta(agent_id: str, credential: str) -> tuple[tuple[str, str], ...]:
    return (("x-dpfl-agent-id", agent_id), ("authorization", f"Bearer {credential}"))


async def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code()


def test_one_certificate_one_agent_csr_flow_and_revocation(
    coordinator_db: str, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    ca_dir = pki.ca.parent
    # the silo makes its key; only the CSR travels; the administrator signs it
    silo = tmp_path / "silo-3"
    assert agent_main(["keygen", "silo-3", "--out", str(silo)]) == 0
    key, csr = silo / "silo-3.key", silo / "silo-3.csr"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    inbox = tmp_path / "admin-inbox"
    inbox.mkdir()
    (inbox / "silo-3.csr").write_bytes(csr.read_bytes())
    assert (
        coordinator_main(["certs", "sign", str(inbox / "silo-3.csr"), "--ca-dir", str(ca_dir)]) == 0
    )
    cert = inbox / "silo-3.pem"
    assert tls.certificate_common_name(cert.read_bytes()) == "silo-3"
    assert not list(inbox.glob("*.key"))  # no key was ever made or needed here
    # an empty revocation list to start with
    assert coordinator_main(["certs", "revoke", "--ca-dir", str(ca_dir)]) == 0
    crl = ca_dir / tls.CRL

    async def main() -> None:
        settings = tls_settings(pki, coordinator_db, mutual=True).model_copy(
            update={"tls_crl_file": crl}
        )
        c = Coordinator(settings=settings, serve_api=False)
        await c.start()
        address = f"127.0.0.1:{c.grpc_port}"

        def channel(cert_key: tuple[Path, Path]) -> grpc.aio.Channel:
            creds = channel_credentials(
                ca=pki.ca, cert=cert_key[0], key=cert_key[1], insecure=False
            )
            assert creds is not None
            return grpc.aio.secure_channel(address, creds)

        def token() -> str:
            return c.store.create_enrollment_token(ttl=timedelta(hours=1)).token

        try:
            silo1 = pki.agent("silo-1")
            async with channel(silo1) as ch:
                stub = agent_pb2_grpc.AgentServiceStub(ch)
                first = await stub.Enroll(pb.EnrollRequest(enrollment_token=token(), name="A"))
                second_token = token()
                code = await _code(
                    stub.Enroll(pb.EnrollRequest(enrollment_token=second_token, name="A-bis"))
                )
                assert code == grpc.StatusCode.ALREADY_EXISTS
            agents = c.store.list_agents()
            assert [a.id for a in agents] == [first.agent_id]
            assert agents[0].certificate_cn == "silo-1"
            unused = [t for t in c.store.list_enrollment_tokens() if t.used_at is None]
            assert len(unused) == 1  # the refused enrolment did not burn the token

            # the CSR-made certificate enrols and connects; silo-2 is connected alongside
            streams: dict[str, tuple[grpc.aio.Channel, object, asyncio.Event]] = {}
            ids: dict[str, tuple[str, str]] = {}
            for name, pair in (("silo-3", (cert, key)), ("silo-2", pki.agent("silo-2"))):
                ch = channel(pair)
                stub = agent_pb2_grpc.AgentServiceStub(ch)
                enrolled = await stub.Enroll(pb.EnrollRequest(enrollment_token=token(), name=name))
                ids[name] = (enrolled.agent_id, enrolled.credential)
                done = asyncio.Event()

                async def outbound(
                    agent_id: str = enrolled.agent_id, done: asyncio.Event = done
                ) -> object:
                    yield pb.AgentMessage(hello=pb.Hello(agent_id=agent_id))
                    await done.wait()

                call = stub.Connect(outbound(), metadata=_meta(*ids[name]))
                streams[name] = (ch, call, done)
            registry = c.registry
            assert registry is not None
            both = {ids["silo-3"][0], ids["silo-2"][0]}
            await _wait_for(lambda: registry.connected() == both, timeout=20, what="connected")

            # revoke silo-3's certificate: no restart, the open stream closes within seconds
            assert (
                coordinator_main(["certs", "revoke", "--ca-dir", str(ca_dir), "--cert", str(cert)])
                == 0
            )
            await _wait_for(
                lambda: registry.connected() == {ids["silo-2"][0]}, timeout=10, what="eviction"
            )
            ch3 = channel((cert, key))
            stub3 = agent_pb2_grpc.AgentServiceStub(ch3)
            assert (
                await _code(stub3.Enroll(pb.EnrollRequest(enrollment_token=token(), name="again")))
                == grpc.StatusCode.UNAUTHENTICATED
            )

            async def hello() -> object:
                yield pb.AgentMessage(hello=pb.Hello(agent_id=ids["silo-3"][0]))
                await asyncio.sleep(5)

            async def drain(call: object) -> None:
                async for _ in call:  # type: ignore[attr-defined]
                    pass

            connect = stub3.Connect(hello(), metadata=_meta(*ids["silo-3"]))
            assert await _code(drain(connect)) == grpc.StatusCode.UNAUTHENTICATED
            download = stub3.Download(
                pb.DownloadRequest(job_id="any", kind=pb.BLOB_MODEL),
                metadata=_meta(*ids["silo-3"]),
            )
            assert await _code(drain(download)) == grpc.StatusCode.UNAUTHENTICATED
            await ch3.close()
            assert registry.connected() == {ids["silo-2"][0]}  # silo-2 unaffected
            for ch, _call, done in streams.values():
                done.set()
                await ch.close()
        finally:
            await c.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_certs_sign_refuses_a_bad_csr_and_revoke_a_foreign_crl(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    ca_dir = pki.ca.parent
    bad = tmp_path / "bad.csr"
    bad.write_text("not a CSR")
    assert coordinator_main(["certs", "sign", str(bad), "--ca-dir", str(ca_dir)]) == 1
    # a CRL signed by another CA is refused, never silently extended
    foreign = pki.other_ca.parent
    assert coordinator_main(["certs", "revoke", "--ca-dir", str(foreign), "--serial", "7"]) == 0
    (ca_dir / tls.CRL).write_bytes((foreign / tls.CRL).read_bytes())
    assert coordinator_main(["certs", "revoke", "--ca-dir", str(ca_dir), "--serial", "8"]) == 1
    with pytest.raises(tls.PkiError, match="not signed by the CA"):
        tls.read_crl(ca_dir / tls.CRL, pki.ca.read_bytes())
    # keygen refuses to overwrite a key
    assert agent_main(["keygen", "s", "--out", str(tmp_path / "k")]) == 0
    assert agent_main(["keygen", "s", "--out", str(tmp_path / "k")]) == 2
