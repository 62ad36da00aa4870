"""TLS and mutual TLS between the REAL coordinator and REAL agents on loopback.

The coordinator is :class:`dpfl.server.coordinator.Coordinator` with the settings
``dpfl-coordinator serve --tls-cert --tls-key --client-ca --require-client-cert`` builds; the
agents are :func:`dpfl.client.runtime.run_agent`, what ``dpfl-agent run --ca --cert --key``
runs. Checked:

- agents trusting the federation's CA, with their own certificates, enrol (bound to their
  certificate's CN) and complete a secure-aggregation round;
- a stolen credential used with another agent's (valid) certificate is refused, and the thief
  takes no part in the round;
- the wrong CA, a plaintext agent, a certificate of a foreign CA, a missing client certificate
  and a peer certificate (the malicious-secure rounds' usage only, even from the coordinator's
  own CA) are refused by the handshake with an error naming the problem, and leave no trace:
  no agent, no credential, the token unused, no round, no ledger entry, no local enrolment.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from support.coordination import small_job
from support.tls_federation import (
    AGENTS,
    Pki,
    agent_options,
    make_pki,
    run_agent_task,
    table_counts,
    tls_coordinator,
    unused_tokens,
)

from dpfl.client.data import data_spec_for_job
from dpfl.client.errors import DownloadError, TransportError
from dpfl.client.runtime import channel_credentials
from dpfl.client.transport import CredentialRejectedError, GrpcTransport
from dpfl.learning.jobs import job_to_dict
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.agent_protocol import submit
from dpfl.server.store import AgentStatus


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def _wait_for(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for: {what}") from None


def test_mtls_agents_enrol_bound_to_their_certificates_and_complete_a_round(
    pki: Pki, tmp_path: Path
) -> None:
    job = small_job(rounds=1)
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"

    async def main() -> None:
        async with tls_coordinator(pki, url) as coordinator:
            store = coordinator.store
            stop = asyncio.Event()
            tasks = []
            for i, name in enumerate(AGENTS):
                token = store.create_enrollment_token(ttl=timedelta(hours=1))
                options = agent_options(
                    coordinator,
                    tmp_path / name,
                    data=data_spec_for_job(job.data, index=i, agents=len(AGENTS)),
                    token=token.token,
                    ca=pki.ca,
                    cert_key=pki.agent(name),
                    name=name,
                )
                tasks.append(run_agent_task(options, stop))
            registry = coordinator.registry
            assert registry is not None
            await _wait_for(lambda: len(registry.connected()) == 2, timeout=30, what="connect")
            agents = {a.name: a for a in store.list_agents()}
            # each agent is bound to the CN of the certificate it enrolled with
            assert {n: a.certificate_cn for n, a in agents.items()} == {n: n for n in AGENTS}
            assert all(a.status == AgentStatus.ACTIVE for a in agents.values())

            # silo-1's credential presented with silo-2's certificate: refused, no session
            victim = agents["silo-1"]
            stolen = json.loads((tmp_path / "silo-1" / "agent.json").read_text())["credential"]
            thief = channel_credentials(
                ca=pki.ca, cert=pki.agent("silo-2")[0], key=pki.agent("silo-2")[1], insecure=False
            )
            async with GrpcTransport(
                f"127.0.0.1:{coordinator.grpc_port}", credentials=thief
            ) as transport:
                connector = transport.connector(agent_id=victim.id, credential=stolen)
                link = await connector.connect(pb.Hello(agent_id=victim.id))
                with pytest.raises(CredentialRejectedError) as refused:
                    await link.receive()
                with pytest.raises(DownloadError, match=r"UNAUTHENTICATED.*not the one agent"):
                    await link.download(pb.DownloadRequest(job_id="any", kind=pb.BLOB_MODEL))
            assert "CN 'silo-2'" in str(refused.value)
            assert "not the one agent" in str(refused.value)
            assert registry.connected() == {a.id for a in agents.values()}  # silo-1 stays

            created = submit(store, job_to_dict(job))
            await coordinator.orchestrator.start(created.id)  # type: ignore[union-attr]
            finished = await asyncio.wait_for(
                coordinator.orchestrator.wait(created.id),  # type: ignore[union-attr]
                60,
            )
            assert finished.status.value == "completed", finished.error
            (rnd,) = store.list_rounds(created.id)
            assert rnd.status.value == "completed"
            assert set(rnd.survivors["masked_input"]) == {a.id for a in agents.values()}
            for agent in agents.values():
                entries = store.ledger_entries(agent_id=agent.id, job_id=created.id)
                assert [e.round_number for e in entries] == [1]
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 15)

    asyncio.run(asyncio.wait_for(main(), 120))


#: (label, the CA the agent trusts, the certificate it presents, words its error must contain).
#: The agent cannot tell a refused client certificate from a missing one: under TLS 1.3 the
#: coordinator rejects it after the client's side of the handshake, by closing the connection.
REFUSALS = [
    ("wrong CA", "other_ca", "silo-1", "TLS: check --ca, --cert and --key"),
    ("plaintext agent", None, None, "a TLS coordinator closes plaintext connections"),
    ("certificate of a foreign CA", "ca", "intruder", "under mutual TLS"),
    ("no client certificate", "ca", None, "under mutual TLS"),
    # issued by the coordinator's own CA, but for peer signatures only: not a TLS client
    ("a peer certificate as the TLS certificate", "ca", "peer-only", "under mutual TLS"),
]


@pytest.mark.parametrize(("label", "trust", "identity", "message"), REFUSALS)
def test_refused_agents_leave_no_trace(
    pki: Pki,
    tmp_path: Path,
    coordinator_db: str,
    label: str,
    trust: str | None,
    identity: str | None,
    message: str,
) -> None:
    async def main() -> None:
        async with tls_coordinator(pki, coordinator_db) as coordinator:
            store = coordinator.store
            token = store.create_enrollment_token(ttl=timedelta(hours=1))
            before = table_counts(coordinator_db)
            options = agent_options(
                coordinator,
                tmp_path / "agent",
                data="digits#index=0&agents=2",
                token=token.token,
                ca=getattr(pki, trust) if trust is not None else None,
                cert_key=pki.agent(identity) if identity is not None else None,
                insecure=trust is None,
            )
            with pytest.raises(TransportError) as refused:
                await asyncio.wait_for(run_agent_task(options, asyncio.Event()), 30)
            text = str(refused.value)
            assert "cannot reach the coordinator" in text, text
            assert message in text, (label, text)
            assert table_counts(coordinator_db) == before
            assert before["agents"] == before["credentials"] == before["rounds"] == 0
            assert before["ledger_entries"] == 0
            assert unused_tokens(coordinator_db) == 1
            assert store.list_agents() == []
            assert not (tmp_path / "agent" / "agent.json").exists()
            assert coordinator.registry is not None
            assert coordinator.registry.connected() == set()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_tls_without_client_certificates_enrols_unbound_agents(pki: Pki, tmp_path: Path) -> None:
    """TLS only (no --require-client-cert): the CA is enough, the credential authenticates
    alone, and a plaintext agent is still refused."""
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"

    async def main() -> None:
        async with tls_coordinator(pki, url, mutual=False) as coordinator:
            store = coordinator.store
            stop = asyncio.Event()
            plain = agent_options(
                coordinator,
                tmp_path / "plain",
                data="digits#index=0&agents=2",
                token=store.create_enrollment_token(ttl=timedelta(hours=1)).token,
                ca=None,
                insecure=True,
            )
            with pytest.raises(TransportError, match="closes plaintext connections"):
                await asyncio.wait_for(run_agent_task(plain, stop), 30)
            options = agent_options(
                coordinator,
                tmp_path / "silo",
                data="digits#index=1&agents=2",
                token=store.create_enrollment_token(ttl=timedelta(hours=1)).token,
                ca=pki.ca,
            )
            task = run_agent_task(options, stop)
            registry = coordinator.registry
            assert registry is not None
            await _wait_for(lambda: len(registry.connected()) == 1, timeout=30, what="connect")
            (agent,) = store.list_agents()
            assert agent.certificate_cn is None
            assert registry.connected() == {agent.id}
            stop.set()
            await asyncio.wait_for(task, 15)

    asyncio.run(asyncio.wait_for(main(), 60))
