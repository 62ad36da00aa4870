"""The coordinator's two ports mixed up (issue 36, item 7): an agent pointed at the REST port, and
``dpfl budget`` pointed at the gRPC port, say which port they reached and which one to use,
within seconds, over TLS (the coordinator's certificate, mutual TLS on gRPC) and in plaintext.

Real servers: the REST app under uvicorn (``live_server``) with its ``/healthz`` naming the gRPC
port, and a ``grpc.aio`` server with the coordinator's credentials (no services needed: the
protocols are what tells the ports apart)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
from support.api import admin_settings
from support.tls_federation import Pki, make_pki

from dpfl.cli.main import main as dpfl_main
from dpfl.client.errors import TransportError
from dpfl.client.transport import GrpcTransport
from dpfl.cmdline.ports import GRPC_PORT_HEADER, PortProbe, port_hint, probe_port
from dpfl.server.api import create_app
from dpfl.server.jobs_control import StoreJobControl
from dpfl.server.store import open_store

pytestmark = pytest.mark.anyio

GRPC_PORT = 50999  # what the REST app says its gRPC port is


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(params=["tls", "plaintext"])
def tls(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "tls")


@pytest.fixture
def rest(pki: Pki, tls: bool, tmp_path: Path) -> Iterator[str]:
    """The REST app's base URL (https with the coordinator's certificate, or http)."""
    from support.api import live_server

    with open_store(f"sqlite:///{tmp_path / 'dpfl.db'}") as store:
        app = create_app(
            store=store,
            settings=admin_settings(),
            jobs=StoreJobControl(store),
            grpc_port=GRPC_PORT,
        )
        with live_server(app, tls=(pki.server_cert, pki.server_key) if tls else None) as url:
            yield url


@pytest.fixture
async def grpc_port(pki: Pki, tls: bool) -> AsyncIterator[int]:
    """A gRPC server as the coordinator runs it (mutual TLS, or plaintext)."""
    server = grpc.aio.server()
    if tls:
        credentials = grpc.ssl_server_credentials(
            [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
            root_certificates=pki.ca.read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


async def test_the_probe_tells_the_ports_apart(rest: str, grpc_port: int, tls: bool) -> None:
    rest_port = int(rest.rsplit(":", 1)[1])
    assert await probe_port("127.0.0.1", rest_port, tls=tls) == PortProbe("rest", GRPC_PORT)
    assert await probe_port("127.0.0.1", grpc_port, tls=tls) == PortProbe("grpc")
    # nothing listening: unknown, quickly, and no hint
    started = time.monotonic()
    closed = await probe_port("127.0.0.1", 9, tls=tls, timeout=2.0)
    assert closed == PortProbe("unknown")
    assert time.monotonic() - started < 3
    assert port_hint(closed, wanted="grpc", address="x:9") is None


async def test_healthz_names_the_grpc_port(rest: str, pki: Pki) -> None:
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(pki.ca))) as client:
        response = await client.get(f"{rest}/healthz")
    assert response.headers[GRPC_PORT_HEADER] == str(GRPC_PORT)


async def test_an_agent_pointed_at_the_rest_port_says_so(rest: str, pki: Pki, tls: bool) -> None:
    address = rest.split("://", 1)[1]
    transport = GrpcTransport(
        address,
        credentials=grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        if tls
        else None,
        insecure=not tls,
        enroll_timeout=20,
    )
    started = time.monotonic()
    try:
        with pytest.raises(TransportError) as info:
            await transport.enroll(token="dpfl_enroll_x", name="silo")
    finally:
        await transport.close()
    message = str(info.value)
    assert f"{address} looks like the coordinator's REST port" in message
    assert f"this coordinator's gRPC port is {GRPC_PORT}" in message
    assert time.monotonic() - started < 15


async def test_budget_pointed_at_the_grpc_port_says_so(
    grpc_port: int, pki: Pki, tls: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"https://127.0.0.1:{grpc_port}" if tls else f"http://127.0.0.1:{grpc_port}"
    security = ["--ca", str(pki.ca)] if tls else ["--insecure"]
    started = time.monotonic()
    code = await asyncio.to_thread(
        dpfl_main, ["budget", "--coordinator", url, "--token", "t" * 32, *security]
    )
    err = capsys.readouterr().err
    assert code == 5, err
    assert f"127.0.0.1:{grpc_port} looks like the coordinator's gRPC port" in err
    assert "--api-port" in err
    assert time.monotonic() - started < 15
