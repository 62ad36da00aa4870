"""Test-only: a federation's PKI on disk, a real TLS coordinator and real agents on loopback.

- :func:`make_pki` writes what ``dpfl-coordinator certs`` writes: the CA, the coordinator's
  certificate (for 127.0.0.1 and localhost), client certificates for agents, and a second,
  foreign CA with its own "intruder" certificate;
- :func:`tls_coordinator` starts the real :class:`~dpfl.server.coordinator.Coordinator` (gRPC and
  HTTPS) on free ports with TLS or mutual TLS from those files;
- :func:`agent_options` builds the options ``dpfl-agent run`` would build from its flags, and
  :func:`run_agent_task` runs :func:`dpfl.client.runtime.run_agent` in the test's event loop;
- :func:`table_counts` counts the rows of every store table (the "no trace" checks).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from dpfl.client.runtime import AgentOptions, run_agent
from dpfl.client.transport import Backoff
from dpfl.server import tls
from dpfl.server.coordinator import Coordinator
from dpfl.server.settings import Settings, StageDeadlines
from dpfl.server.store.engine import normalize_url
from dpfl.server.store.models import Base

AGENTS = ("silo-1", "silo-2")


@dataclass(frozen=True)
class Pki:
    """Paths of a test federation's certificates."""

    root: Path
    ca: Path
    server_cert: Path
    server_key: Path
    other_ca: Path

    def agent(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of an agent of this federation (or ``intruder``, foreign CA)."""
        folder = self.root / ("foreign" if name == "intruder" else "agents")
        return folder / f"{name}.pem", folder / f"{name}.key"


def make_pki(root: Path) -> Pki:
    """The federation's CA and certificates, plus a foreign CA and its ``intruder``."""
    ca_dir = root / "ca"
    tls.init_pki(ca_dir, hostnames=("127.0.0.1", "localhost"))
    for name in AGENTS:
        tls.issue_agent_files(ca_dir, name=name, out=root / "agents")
    # a peer certificate (malicious-secure rounds' usage only) from the coordinator's own CA:
    # a misconfigured federation whose one CA signs both kinds
    peer = tls.issue_peer_certificate(
        tls.load_pair(ca_dir / tls.CA_CERT, ca_dir / tls.CA_KEY), name="peer-only"
    )
    (root / "agents" / "peer-only.pem").write_bytes(peer.certificate)
    (root / "agents" / "peer-only.key").write_bytes(peer.private_key)
    foreign = root / "foreign"
    tls.init_pki(foreign, hostnames=("127.0.0.1",))
    tls.issue_agent_files(foreign, name="intruder")
    return Pki(
        root=root,
        ca=ca_dir / tls.CA_CERT,
        server_cert=ca_dir / tls.SERVER_CERT,
        server_key=ca_dir / tls.SERVER_KEY,
        other_ca=foreign / tls.CA_CERT,
    )


def tls_settings(pki: Pki, database_url: str, *, mutual: bool) -> Settings:
    fast = StageDeadlines(
        invitation=10, advertise_keys=10, share_keys=10, masked_input=20, training=20, unmask=10
    )
    return Settings(
        database_url=database_url,
        grpc_port=0,
        api_port=0,
        admin_token=secrets.token_urlsafe(32),
        tls_cert_file=pki.server_cert,
        tls_key_file=pki.server_key,
        tls_client_ca_file=pki.ca if mutual else None,
        require_client_cert=mutual,
        stage_deadlines=fast,
    )


@asynccontextmanager
async def tls_coordinator(
    pki: Pki, database_url: str, *, mutual: bool = True, serve_api: bool = False
) -> AsyncIterator[Coordinator]:
    coordinator = Coordinator(
        settings=tls_settings(pki, database_url, mutual=mutual), serve_api=serve_api
    )
    await coordinator.start()
    try:
        yield coordinator
    finally:
        await coordinator.close()


def agent_options(
    coordinator: Coordinator,
    state_dir: Path,
    *,
    data: str,
    token: str | None,
    ca: Path | None,
    cert_key: tuple[Path, Path] | None = None,
    insecure: bool = False,
    name: str = "silo",
) -> AgentOptions:
    """What ``dpfl-agent run --coordinator 127.0.0.1:PORT ... [--ca --cert --key | --insecure]``
    passes to :func:`run_agent`."""
    cert, key = cert_key if cert_key is not None else (None, None)
    return AgentOptions(
        coordinator=f"127.0.0.1:{coordinator.grpc_port}",
        state_dir=state_dir,
        data=data,
        enrollment_token=token,
        name=name,
        device="cpu",
        insecure=insecure,
        ca=ca,
        cert=cert,
        key=key,
        backoff=Backoff(initial=0.05, maximum=0.5),
    )


def run_agent_task(options: AgentOptions, stop: asyncio.Event) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(run_agent(options, stop=stop))


def table_counts(database_url: str) -> dict[str, int]:
    """Rows per store table, read through a separate engine (what an auditor would see)."""
    engine = sa.create_engine(normalize_url(database_url))
    try:
        with engine.connect() as conn:
            return {
                t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in Base.metadata.sorted_tables
            }
    finally:
        engine.dispose()


def unused_tokens(database_url: str) -> int:
    engine = sa.create_engine(normalize_url(database_url))
    try:
        with engine.connect() as conn:
            table = Base.metadata.tables["enrollment_tokens"]
            query = sa.select(sa.func.count()).select_from(table).where(table.c.used_at.is_(None))
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()
