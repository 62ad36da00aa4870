"""Downloads check membership from the agent's side, never by loading the job's population,
and read each model version from the store once.

Every member of a job downloads the model every round; a check that reads the job's whole member
list made each round cost O(N²) rows at the coordinator (10⁶ rows per round at N = 1000, the
largest cost ``benchmarks/scale.py`` found), and reading the model version's bytes from the
database for every member moved N copies of the model per round. The answers stay the same:
members get the blob, everyone else (and unknown jobs) get the same ``NotFound``.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from support.databases import PostgresBackend, SqliteBackend

from dpfl.learning.jobs import parse_job
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server import agent_protocol
from dpfl.server.errors import InvalidCredential, NotFound
from dpfl.server.store import Store

SPEC = parse_job({"name": "dl", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}})


class DownloadMembership:
    def test_download_never_reads_the_population(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        agents = [store.create_agent(name=f"a{i}") for i in range(40)]
        outsider = store.create_agent(name="outsider")
        job = store.create_job(SPEC, members=[a.id for a in agents])
        other = store.create_job(SPEC, members=[outsider.id])
        store.add_model_version(job.id, b"model-bytes")
        reads: list[Any] = []
        population = store.job_members

        def counted(job_id: str) -> list[str]:
            reads.append(job_id)
            return population(job_id)

        monkeypatch.setattr(store, "job_members", counted)
        request = pb.DownloadRequest(job_id=job.id, kind=pb.BLOB_MODEL, version=0)
        for agent in agents:
            chunks = list(agent_protocol.download(store, agent, request, blobs=None))
            assert b"".join(c.data for c in chunks) == b"model-bytes"
        with pytest.raises(NotFound, match="not found"):
            agent_protocol.download(store, outsider, request, blobs=None)
        unknown = pb.DownloadRequest(job_id="job-unknown", kind=pb.BLOB_MODEL, version=0)
        with pytest.raises(NotFound, match="not found"):
            agent_protocol.download(store, agents[0], unknown, blobs=None)
        theirs = pb.DownloadRequest(job_id=other.id, kind=pb.BLOB_MODEL, version=0)
        with pytest.raises(NotFound, match="not found"):
            agent_protocol.download(store, agents[0], theirs, blobs=None)
        assert reads == []

    def test_a_model_version_is_read_from_the_store_once(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from dpfl.server.orchestrator import Orchestrator
        from dpfl.server.sessions import SessionRegistry
        from dpfl.server.settings import Settings

        agents = [store.create_agent(name=f"a{i}") for i in range(20)]
        job = store.create_job(SPEC, members=[a.id for a in agents])
        store.add_model_version(job.id, b"v0")
        store.add_model_version(job.id, b"v1")
        orchestrator = Orchestrator(
            store=store,
            settings=Settings(admin_token=secrets.token_urlsafe(32)),
            registry=SessionRegistry(),
        )
        reads: list[tuple[str, int | None]] = []
        load = store.get_model_version

        def counted(job_id: str, version: int | None = None) -> Any:
            reads.append((job_id, version))
            return load(job_id, version)

        monkeypatch.setattr(store, "get_model_version", counted)
        for version, expected in ((0, b"v0"), (1, b"v1")):
            request = pb.DownloadRequest(job_id=job.id, kind=pb.BLOB_MODEL, version=version)
            for agent in agents:
                chunks = list(agent_protocol.download(store, agent, request, blobs=orchestrator))
                assert b"".join(c.data for c in chunks) == expected
        assert reads == [(job.id, 0), (job.id, 1)]
        missing = pb.DownloadRequest(job_id=job.id, kind=pb.BLOB_MODEL, version=7)
        for _ in range(2):  # a version that does not exist is never cached
            with pytest.raises(NotFound, match="no model version 7"):
                agent_protocol.download(store, agents[0], missing, blobs=orchestrator)
        assert reads[2:] == [(job.id, 7), (job.id, 7)]

    def test_a_cached_model_download_is_one_read_transaction(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from dpfl.server.agent_protocol import AGENT_ID_HEADER, AUTHORIZATION_HEADER
        from dpfl.server.orchestrator import Orchestrator
        from dpfl.server.sessions import SessionRegistry
        from dpfl.server.settings import Settings

        agent = store.create_agent(name="a")
        credential = store.issue_credential(agent.id)
        job = store.create_job(SPEC, members=[agent.id])
        store.add_model_version(job.id, b"v0")
        orchestrator = Orchestrator(
            store=store,
            settings=Settings(admin_token=secrets.token_urlsafe(32)),
            registry=SessionRegistry(),
        )
        orchestrator.cache_model(job.id, 0, b"v0")
        metadata = [(AGENT_ID_HEADER, agent.id), (AUTHORIZATION_HEADER, f"Bearer {credential}")]
        request = pb.DownloadRequest(job_id=job.id, kind=pb.BLOB_MODEL, version=0)
        opened: list[bool] = []
        transaction = store._transaction

        def counted(*, write: bool) -> Any:
            opened.append(write)
            return transaction(write=write)

        monkeypatch.setattr(store, "_transaction", counted)
        member, jobs = agent_protocol.authenticate_member(store, metadata)
        chunks = list(
            agent_protocol.download(store, member, request, blobs=orchestrator, jobs=jobs)
        )
        assert b"".join(c.data for c in chunks) == b"v0"
        assert opened == [False]
        wrong = [(AGENT_ID_HEADER, agent.id), (AUTHORIZATION_HEADER, "Bearer nope")]
        with pytest.raises(InvalidCredential):
            agent_protocol.authenticate_member(store, wrong)


class TestSqliteDownloads(SqliteBackend, DownloadMembership):
    pass


class TestPostgresDownloads(PostgresBackend, DownloadMembership):
    pass
