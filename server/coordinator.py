"""The coordinator process: gRPC server, REST app and orchestrator on one asyncio loop.

One :class:`Coordinator` owns (or borrows) one store and serves the agents' gRPC
``AgentService`` and the REST API, sharing the store, sessions and metrics. It starts in the
order of docs/architecture.md#the-coordinator-process, so ``/healthz`` answering 200 means both
ports listen. :meth:`Coordinator.close` stops the runners, leaving jobs running for the next
start; :meth:`Coordinator.crash` is the tests' crash, after which nothing more is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from typing import Any

import grpc

from dpfl.server.agents_control import AgentControl
from dpfl.server.errors import ConfigurationError
from dpfl.server.grpc import AgentServicer, server_credentials, start_grpc_server
from dpfl.server.grpc.crl import RevocationList
from dpfl.server.orchestrator import NO_HOOKS, FaultHooks, Orchestrator
from dpfl.server.orchestrator.state import COORDINATOR_RESTARTED
from dpfl.server.sessions import SessionRegistry
from dpfl.server.settings import Settings, StageDeadlines
from dpfl.server.store import Store, open_store

__all__ = ["Coordinator"]

log = logging.getLogger("dpfl.coordinator")


class Coordinator:
    """One coordinator process (see the module docstring).

    Args:
        settings: the validated settings (ports: 0 picks free ones).
        store: an open store to use (not closed by the coordinator); default: open
            ``settings.database_url`` (closed by :meth:`close`).
        serve_api: host the REST app (simulations without ``--serve`` may skip it).
        serve_grpc: host the gRPC server (in-process simulations connect without it).
        grpc_credentials: TLS credentials for the gRPC server; default: from the settings.
        hooks: fault-injection points (tests only).
        enforce_budgets: False only for tests of the agents' own budget checks.
        deadlines: stage deadlines (default: the settings').
        max_attempts: aborts of a round's own per round number before a job fails (its
            attempts a restart or shutdown ended do not count).
        coordinator_id: returned to enrolling agents (default: a random id).
        algorithms: resolves algorithm tags (default ``get_algorithm``; benchmarks inject).
    """

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store | None = None,
        serve_api: bool = True,
        serve_grpc: bool = True,
        grpc_credentials: grpc.ServerCredentials | None = None,
        hooks: FaultHooks = NO_HOOKS,
        enforce_budgets: bool = True,
        deadlines: StageDeadlines | None = None,
        max_attempts: int = 3,
        coordinator_id: str | None = None,
        algorithms: Any = None,
    ) -> None:
        self.settings = settings
        self._own_store = store is None
        self._store = store
        self.serve_api = serve_api
        self.serve_grpc = serve_grpc
        self._credentials = grpc_credentials
        self._hooks = hooks
        self._enforce_budgets = enforce_budgets
        self._deadlines = deadlines
        self._max_attempts = max_attempts
        self._algorithms = algorithms
        self.coordinator_id = coordinator_id or f"coordinator-{secrets.token_hex(4)}"
        self.metrics: Any = None
        self.registry: SessionRegistry | None = None
        self.orchestrator: Orchestrator | None = None
        self.app: Any = None
        self.servicer: AgentServicer | None = None
        self.grpc_port = 0
        self.api_port = 0
        self._grpc: grpc.aio.Server | None = None
        self._uvicorn: Any = None
        self._uvicorn_task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._watch: asyncio.Task[None] | None = None
        self._agent_watch: asyncio.Task[None] | None = None
        self.agents: AgentControl | None = None
        self.revocations: RevocationList | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the coordinator is not started")
        return self._store

    @property
    def grpc_address(self) -> str:
        return f"{self.settings.grpc_host}:{self.grpc_port}"

    @property
    def api_url(self) -> str:
        """The REST app's base URL (https when the settings give a TLS certificate)."""
        scheme = "https" if self.settings.tls_enabled else "http"
        return f"{scheme}://{self.settings.api_host}:{self.api_port}"

    async def start(self) -> None:
        """Open the store, recover, start both servers and resume running jobs."""
        if self._store is None:
            self._store = await asyncio.to_thread(open_store, self.settings.database_url)
        store = self._store
        await _abort_interrupted_rounds(store)
        self.metrics = _metrics(store)
        on_count = getattr(self.metrics, "agents_connected", None)
        self.registry = SessionRegistry(on_count=on_count, limits=self.settings.stream_limits)
        self.orchestrator = Orchestrator(
            store=store,
            settings=self.settings,
            registry=self.registry,
            hooks=self._hooks,
            metrics=self.metrics,
            enforce_budgets=self._enforce_budgets,
            max_attempts=self._max_attempts,
            deadlines=self._deadlines,
            **({"algorithms": self._algorithms} if self._algorithms is not None else {}),
        )
        if self.settings.tls_crl_file is not None and self.settings.tls_client_ca_file is not None:
            self.revocations = RevocationList(
                self.settings.tls_crl_file, self.settings.tls_client_ca_file
            )
        revocations = self.revocations
        self.agents = AgentControl(
            store,
            self.registry,
            revoked_serial=None if revocations is None else revocations.revoked,
        )
        await self.agents.sync()
        servicer = AgentServicer(
            store=store,
            settings=self.settings,
            registry=self.registry,
            blobs=self.orchestrator,
            coordinator_id=self.coordinator_id,
            revocations=revocations,
        )
        self.servicer = servicer
        if self.serve_grpc:
            await self._start_grpc(servicer)
        if self.serve_api:
            await self._start_api()
        await self.orchestrator.resume()
        self._watch = asyncio.get_running_loop().create_task(
            self.orchestrator.watch(), name="dpfl-job-watch"
        )
        self._agent_watch = asyncio.get_running_loop().create_task(
            self.agents.watch(), name="dpfl-agent-watch"
        )

    async def _start_grpc(self, servicer: AgentServicer) -> None:
        self._grpc, self.grpc_port = await start_grpc_server(
            servicer,
            host=self.settings.grpc_host,
            port=self.settings.grpc_port,
            max_message_bytes=self.settings.max_message_bytes,
            credentials=self._credentials or server_credentials(self.settings),
        )

    async def _start_api(self) -> None:
        import uvicorn

        from dpfl.server.api.app import create_app

        assert self.orchestrator is not None
        grpc_server = self._grpc
        self.app = create_app(
            store=self.store,
            settings=self.settings,
            jobs=self.orchestrator,
            agents=self.agents,
            metrics=self.metrics,
            health_checks={"grpc": lambda: grpc_server is not None and self.grpc_port > 0}
            if self.serve_grpc
            else {},
            grpc_port=self.grpc_port if self.serve_grpc else None,
        )
        sock = socket.socket(
            socket.AF_INET6 if ":" in self.settings.api_host else socket.AF_INET,
            socket.SOCK_STREAM,
        )
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.settings.api_host, self.settings.api_port))
        except OSError as exc:
            sock.close()
            raise ConfigurationError(
                f"cannot bind the REST API to {self.settings.api_host}:"
                f"{self.settings.api_port}: {exc.strerror}"
            ) from None
        sock.listen(128)
        sock.setblocking(False)
        self._socket = sock
        self.api_port = sock.getsockname()[1]
        # HTTPS with the gRPC port's certificate. No client certificates here: people and
        # browsers authenticate to the REST API with bearer tokens.
        cert, key = self.settings.tls_cert_file, self.settings.tls_key_file
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            ssl_certfile=None if cert is None else str(cert),
            ssl_keyfile=None if cert is None else str(key),
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._uvicorn = server
        self._uvicorn_task = asyncio.get_running_loop().create_task(
            server.main_loop(), name="dpfl-rest"
        )

    async def _stop_watch(self) -> None:
        for task in (self._watch, self._agent_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._watch = self._agent_watch = None

    async def close(self) -> None:
        """Stop gracefully: runners (their rounds aborted), streams, servers, own store."""
        await self._stop_watch()
        if self.orchestrator is not None:
            await self.orchestrator.close()
        await self._stop_servers(grace=1.0)
        if self._own_store and self._store is not None:
            await asyncio.to_thread(self._store.close)

    async def crash(self) -> None:
        """Stop everything at once and write nothing more (tests)."""
        await self._stop_watch()
        if self.orchestrator is not None:
            await self.orchestrator.crash()
        await self._stop_servers(grace=None)
        if self._own_store and self._store is not None:
            await asyncio.to_thread(self._store.close)

    async def _stop_servers(self, *, grace: float | None) -> None:
        if self.registry is not None:
            self.registry.close_all("the coordinator is shutting down")
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            if self._uvicorn_task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._uvicorn_task
            await self._uvicorn.shutdown(sockets=[self._socket] if self._socket else None)
            self._uvicorn = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def __aenter__(self) -> Coordinator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _metrics(store: Store) -> Any:
    from dpfl.server.metrics import Metrics  # prometheus_client, loaded when a coordinator runs

    return Metrics(store=store)


async def _abort_interrupted_rounds(store: Store) -> None:
    """Recovery: the rounds a stopped coordinator left in flight end (committed charges stay)."""
    aborted = await asyncio.to_thread(store.abort_interrupted_rounds, reason=COORDINATOR_RESTARTED)
    for r in aborted:
        log.warning(
            "aborted interrupted round %d (attempt %d) of job %s", r.number, r.attempt, r.job_id
        )
