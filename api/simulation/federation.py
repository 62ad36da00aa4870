"""A coordinator and N agents in one event loop: the federation ``dpfl simulate`` runs.

Runs what a deployment runs (the coordinator's store, ledger, round engine and secagg server, and
N real agents each with its data shard) over a loopback channel (``grpc``), in-process links that
still serialize every message (``inproc``, :mod:`.inproc`), or with the agents in Ray actors
(``backend="ray"``, :mod:`.ray_backend`). :class:`Simulation` is the library behind
``dpfl.simulate``, ``dpfl simulate`` and ``dpfl demo``; tests use it to reach the agents and the
coordinator. Transports: docs/architecture.md#simulation-dpfl-simulate.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pydantic import SecretStr

from dpfl.learning.jobs import JobSpec, job_to_dict, parse_job
from dpfl.simulation.result import SimulationResult, collect_result

if TYPE_CHECKING:
    from dpfl.client.policy import Policy
    from dpfl.client.progress import AgentEvent
    from dpfl.client.simulation import AgentHost, SimulatedAgent
    from dpfl.client.summation import PeerCredentials
    from dpfl.client.transport import Connector, GrpcTransport
    from dpfl.server.coordinator import Coordinator
    from dpfl.server.orchestrator import FaultHooks, JobRunner, Orchestrator, RoundReport
    from dpfl.server.settings import Settings, StageDeadlines
    from dpfl.server.store import Job
    from dpfl.simulation.inproc import InProcessCoordinator
    from dpfl.simulation.ray_backend import ActorPlan, RayAgentPool, RayOptions

__all__ = ["Backend", "CoordinatorOptions", "RemoteAgent", "Simulation", "Transport", "check_run"]

#: How the agents reach the coordinator: a loopback gRPC channel or in-process links.
Transport = Literal["grpc", "inproc"]
#: Where the agents run: in this process, or in Ray actors over a cluster.
Backend = Literal["local", "ray"]
#: Called with (agent index, event) for every event of an agent in this process.
AgentObserver = Callable[[int, "AgentEvent"], None]
#: Called with each round's report while a job runs.
RoundProgress = Callable[["RoundReport"], None]


class CoordinatorOptions(TypedDict, total=False):
    """The extra keyword arguments of ``dpfl.server.coordinator.Coordinator`` a simulation
    passes on (tests inject fault hooks, instrumented algorithms, lenient budgets)."""

    hooks: FaultHooks
    enforce_budgets: bool
    max_attempts: int
    algorithms: Any  # the coordinator's own (untyped) algorithm resolver


@dataclass(frozen=True)
class RemoteAgent:
    """An agent of the Ray backend: its id, index in the simulation and hosting actor."""

    agent_id: str
    index: int
    actor: int


def check_run(
    transport: str, backend: str, *, agents: int, observed: bool, peered: bool = False
) -> None:
    """Refuse a combination the federation cannot run (the message names it)."""
    if transport not in ("grpc", "inproc"):
        raise ValueError(f"transport must be 'grpc' or 'inproc', got {transport!r}")
    if backend not in ("local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    if backend == "ray" and transport != "grpc":
        raise ValueError("the ray backend connects its agents over gRPC (transport 'grpc')")
    if backend == "ray" and observed:
        raise ValueError("agent observers need the agents in this process (backend 'local')")
    if backend == "ray" and peered:
        raise ValueError("peer identities need the agents in this process (backend 'local')")
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")


class Simulation:
    """A coordinator and N agents in this event loop (see the module docstring).

    Args:
        job: the validated job.
        agents: N.
        transport: ``"grpc"`` (loopback) or ``"inproc"``.
        database_url: the coordinator's database (default: a temporary SQLite file).
        workdir: where temporary files go (default: a fresh temporary folder).
        serve_api: also serve the REST API (``--serve``).
        api_port: its port (0: a free one).
        deadlines: stage deadlines (default: generous ones for simulation).
        coordinator_options: extra keyword arguments of ``Coordinator`` (tests: hooks, budgets).
        budgets: per agent index, (ε, δ) budget of its enrollment token (default: the settings').
        policies: per agent index, a ``dpfl.client.policy.Policy`` (default: the defaults).
        peers: per agent index, its ``dpfl.client.summation.PeerCredentials`` (peer certificate
            and federation CA) for ``secagg.threat_model: malicious`` (local backend only);
            default for a malicious job: every agent certified by one federation CA made for
            this simulation (:func:`simulated_peers`).
        observer: called with (agent index, ``AgentEvent``) for every agent event.
        admin_token: the REST API's admin token (default: a fresh random one).
        backend: ``"local"`` (the agents in this process) or ``"ray"`` (in Ray actors over a
            cluster, always over gRPC; :mod:`dpfl.simulation.ray_backend`).
        ray: the Ray backend's options (default: :class:`~.ray_backend.RayOptions`'s).

    Attributes:
        agents: the started agents (:class:`~dpfl.client.simulation.SimulatedAgent`, or
            :class:`RemoteAgent` on the Ray backend), in index order; ``host`` is their
            :class:`~dpfl.client.simulation.AgentHost`, created by the first
            ``start_coordinator`` or ``start_agents`` and closed by :meth:`close`.
    """

    def __init__(
        self,
        job: JobSpec,
        *,
        agents: int,
        transport: Transport = "grpc",
        database_url: str | None = None,
        workdir: Path | None = None,
        serve_api: bool = False,
        api_port: int = 0,
        grpc_port: int = 0,
        deadlines: StageDeadlines | None = None,
        coordinator_options: CoordinatorOptions | None = None,
        budgets: Mapping[int, tuple[float, float]] | None = None,
        policies: Mapping[int, Policy] | None = None,
        peers: Mapping[int, PeerCredentials] | None = None,
        observer: AgentObserver | None = None,
        admin_token: str | None = None,
        backend: Backend = "local",
        ray: RayOptions | None = None,
    ) -> None:
        check_run(
            transport, backend, agents=agents, observed=observer is not None, peered=bool(peers)
        )
        self.job = job
        self.num_agents = agents
        self.transport = transport
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dpfl-")
            workdir = Path(self._tmp.name)
        self.workdir = workdir
        self.database_url = database_url or f"sqlite:///{self.workdir / 'coordinator.db'}"
        self.serve_api = serve_api
        self.api_port = api_port
        self.grpc_port = grpc_port
        self.deadlines = deadlines
        self.coordinator_options: CoordinatorOptions = CoordinatorOptions(
            **(coordinator_options or {})
        )
        self.budgets = dict(budgets or {})
        self.policies = dict(policies or {})
        self.peers = dict(peers or {})
        if not self.peers and job.secagg.threat_model == "malicious" and backend == "local":
            self.peers = simulated_peers(agents)
        self.observer = observer
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self._coordinator: Coordinator | None = None
        self.inproc: InProcessCoordinator | None = None
        self.host: AgentHost | None = None
        self.agents: list[SimulatedAgent | RemoteAgent] = []
        self._transports: list[GrpcTransport] = []
        self.job_id: str | None = None
        self.backend = backend
        self.ray_options = ray
        self.pool: RayAgentPool | None = None
        self.ray_plan: ActorPlan | None = None
        self.grpc_host = "127.0.0.1"
        self.advertised_host = "127.0.0.1"

    # -- coordinator -----------------------------------------------------------------------------

    @property
    def coordinator(self) -> Coordinator:
        """The running coordinator (the latest, after a restart).

        Raises:
            RuntimeError: :meth:`start_coordinator` has not run.
        """
        if self._coordinator is None:
            raise RuntimeError("the simulation's coordinator is not started")
        return self._coordinator

    def _orchestrator(self) -> Orchestrator:
        orchestrator = self.coordinator.orchestrator
        if orchestrator is None:
            raise RuntimeError("the simulation's coordinator is not started")
        return orchestrator

    async def _all_connected(self, ids: list[str], *, timeout: float, who: str) -> None:
        registry = self.coordinator.registry
        if registry is None or not await registry.wait_connected(ids, timeout=timeout):
            raise RuntimeError(f"not every {who} connected within {timeout:g} s")

    def settings(self) -> Settings:
        from dpfl.server.settings import Settings, StageDeadlines

        deadlines = self.deadlines or StageDeadlines(
            invitation=20, advertise_keys=20, share_keys=20, masked_input=30, unmask=20
        )
        return Settings(
            database_url=self.database_url,
            grpc_host=self.grpc_host,
            grpc_port=self.grpc_port,
            api_port=self.api_port,
            admin_token=SecretStr(self.admin_token),
            stage_deadlines=deadlines,
            data_roots=self.data_roots(),
        )

    def data_roots(self) -> tuple[Path, ...]:
        """The folders of the files the job names (``npz:PATH``, ``csv:PATH``): the simulated
        coordinator's data roots. Whoever runs a simulation reads these files anyway; a served
        coordinator reads only under the roots its operator configures."""
        return tuple(
            dict.fromkeys(
                Path(path).expanduser().resolve().parent
                for _, path in self.job.data.files().values()
            )
        )

    def _host(self) -> AgentHost:
        """The agent host, created before the coordinator's first thread does any torch work
        (so that the whole simulation computes with one intra-op thread per task)."""
        if self.host is None:
            from dpfl.client.simulation import AgentHost

            self.host = AgentHost()
        return self.host

    async def start_coordinator(self) -> Coordinator:
        """Start (or restart, on the same database and gRPC port) the coordinator."""
        from dpfl.server.coordinator import Coordinator
        from dpfl.simulation.inproc import InProcessCoordinator

        self._host()
        if self.backend == "ray" and self.pool is None:
            self._connect_ray()
        coordinator = Coordinator(
            settings=self.settings(),
            serve_api=self.serve_api,
            serve_grpc=self.transport == "grpc",
            **self.coordinator_options,
        )
        await coordinator.start()
        self._coordinator = coordinator
        self.grpc_port = coordinator.grpc_port
        if self.serve_api:
            self.api_port = coordinator.api_port
        if self.inproc is None:
            self.inproc = InProcessCoordinator(coordinator)
        else:
            self.inproc.coordinator = coordinator
        return coordinator

    def _connect_ray(self) -> None:
        """Join the Ray cluster; on a multi-node cluster the coordinator listens on every
        interface and the actors dial this node's cluster address."""
        from dpfl.simulation.ray_backend import RayAgentPool, RayOptions

        self.pool = RayAgentPool(self.ray_options or RayOptions())
        self.pool.connect()
        if self.pool.multi_node():
            self.grpc_host = "0.0.0.0"
            self.advertised_host = self.pool.node_address()

    # -- agents ----------------------------------------------------------------------------------

    def _issue_token(self, index: int) -> str:
        """A one-time enrollment token for agent ``index``, carrying its budget (blocking)."""
        from dpfl.server.store import Budget

        budget = self.budgets.get(index)
        return self.coordinator.store.create_enrollment_token(
            ttl=timedelta(hours=1),
            budget=Budget(*budget) if budget is not None else None,
        ).token

    def _data_spec(self, index: int) -> str:
        from dpfl.client.data import data_spec_for_job

        return data_spec_for_job(self.job.data, index=index, agents=self.num_agents)

    async def _connect(self, index: int) -> tuple[str, Connector]:
        """Enrol agent ``index``; its id and a connector to the coordinator over the
        simulation's transport."""
        from dpfl.protos.dpfl.v1 import agent_pb2 as pb

        token = await asyncio.to_thread(self._issue_token, index)
        name = f"sim-{index:04d}"
        if self.transport == "inproc":
            assert self.inproc is not None  # made by start_coordinator
            response = await self.inproc.enroll(pb.EnrollRequest(enrollment_token=token, name=name))
            link = self.inproc.connector(agent_id=response.agent_id, credential=response.credential)
            return response.agent_id, link
        from dpfl.client.transport import GrpcTransport

        transport = GrpcTransport(f"127.0.0.1:{self.grpc_port}", insecure=True)
        self._transports.append(transport)
        enrolled = await transport.enroll(token=token, name=name)
        connector = transport.connector(agent_id=enrolled.agent_id, credential=enrolled.credential)
        return enrolled.agent_id, connector

    async def _start_local_agent(self, index: int) -> SimulatedAgent:
        from dpfl.client.transport import Backoff

        agent_id, connector = await self._connect(index)
        return await self._host().start(
            agent_id=agent_id,
            connector=connector,
            data_spec=self._data_spec(index),
            state_dir=self.workdir / "agents" / f"{index:04d}",
            policy=self.policies.get(index),
            peer=self.peers.get(index),
            coordinator_id=self.coordinator.coordinator_id,
            observer=None if self.observer is None else functools.partial(self.observer, index),
            backoff=Backoff(initial=0.05, maximum=0.5),
        )

    async def start_agents(self) -> list[SimulatedAgent | RemoteAgent]:
        """Enrol N agents, give each its share of the data, and connect them."""
        if self.backend == "ray":
            return await self._start_ray_agents()
        for i in range(self.num_agents):
            self.agents.append(await self._start_local_agent(i))
        ids = [a.agent_id for a in self.agents]
        await self._all_connected(ids, timeout=30, who="simulated agent")
        return self.agents

    async def _start_ray_agents(self) -> list[SimulatedAgent | RemoteAgent]:
        """Issue one enrollment token per agent; the Ray actors enrol and start the agents."""
        from dpfl.client.remote_host import HostedAgent

        assert self.pool is not None  # joined by start_coordinator
        tokens = await asyncio.to_thread(
            lambda: [self._issue_token(i) for i in range(self.num_agents)]
        )
        hosted = [
            HostedAgent(
                index=i,
                name=f"sim-{i:04d}",
                enrollment_token=token,
                data_spec=self._data_spec(i),
                policy=self.policies.get(i),
            )
            for i, token in enumerate(tokens)
        ]
        address = f"{self.advertised_host}:{self.grpc_port}"
        ids = await self.pool.start(address, hosted, coordinator_id=self.coordinator.coordinator_id)
        self.ray_plan = self.pool.plan
        self.agents = [
            RemoteAgent(agent_id=agent_id, index=i, actor=self.pool.agent_actor[i])
            for i, agent_id in enumerate(ids)
        ]
        await self._all_connected(ids, timeout=60, who="agent of the Ray actors")
        return self.agents

    # -- the job ---------------------------------------------------------------------------------

    async def submit(self) -> str:
        """Submit the job with the agents as its population and start it."""
        from dpfl.server.data_access import DataAccess
        from dpfl.server.jobs_control import submit_job

        coordinator = self.coordinator
        job = await asyncio.to_thread(
            functools.partial(
                submit_job,
                coordinator.store,
                job_to_dict(self.job),
                members=[a.agent_id for a in self.agents],
                access=DataAccess.from_settings(coordinator.settings),
            )
        )
        self.job_id = job.id
        self.job = parse_job(job.spec)  # with the recipe its coordinator chose, if it searched
        await self._orchestrator().start(job.id)
        return job.id

    def _job_id(self) -> str:
        if self.job_id is None:
            raise RuntimeError("the simulation's job is not submitted")
        return self.job_id

    async def wait(self) -> Job:
        """Wait until the job's runner ends (following coordinator restarts)."""
        while True:
            coordinator = self.coordinator
            job = await self._orchestrator().wait(self._job_id())
            if coordinator is self.coordinator and job.status.value != "running":
                return job
            await asyncio.sleep(0.05)

    def result(self, wall_s: float) -> SimulationResult:
        """What the job produced, read from the coordinator's store and its runner."""
        job_id = self._job_id()
        runner = self._orchestrator().runner(job_id)
        return collect_result(
            self.coordinator.store,
            self.job,
            job_id=job_id,
            agents=[a.agent_id for a in self.agents],
            reports=list(runner.reports) if runner is not None else [],
            wall_s=wall_s,
        )

    async def stop_agents(self) -> None:
        """Stop every agent (the coordinator keeps running; ``dpfl demo --serve``)."""
        if self.host is not None:
            await self.host.stop_agents(timeout=5)
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        for t in self._transports:
            with contextlib.suppress(Exception):
                await t.close()
        self._transports.clear()

    async def close(self) -> None:
        try:
            await self.stop_agents()
            if self._coordinator is not None:
                await self._coordinator.close()
        finally:
            if self.host is not None:
                await self.host.close()
            if self._tmp is not None:
                self._tmp.cleanup()

    async def run(self, *, progress: RoundProgress | None = None) -> SimulationResult:
        """Start everything, run the job to its end, and report; ``progress`` gets every
        round's report once, in order, the last round's included, before this returns."""
        started = time.monotonic()
        await self.start_coordinator()
        await self.start_agents()
        await self.submit()
        feed = None if progress is None else _ReportFeed(progress)
        watcher = None
        if feed is not None:
            watcher = asyncio.get_running_loop().create_task(self._watch(feed))
        try:
            await self.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        if feed is not None:  # the rounds that ended after the watcher's last look
            feed.deliver(self._orchestrator().runner(self._job_id()))
        return self.result(time.monotonic() - started)

    async def _watch(self, feed: _ReportFeed) -> None:
        while True:
            await asyncio.sleep(0.2)
            feed.deliver(self._orchestrator().runner(self._job_id()))


@dataclass
class _ReportFeed:
    """Hands a runner's round reports to ``progress`` once each, in order; a coordinator that
    restarted runs the job with a new runner, whose reports start afresh."""

    progress: RoundProgress
    runner: object | None = None
    seen: int = 0

    def deliver(self, runner: JobRunner | None) -> None:
        if runner is None:
            return
        if runner is not self.runner:
            self.runner, self.seen = runner, 0
        reports = list(runner.reports)
        for report in reports[self.seen :]:
            self.progress(report)
        self.seen = len(reports)


def simulated_peers(agents: int) -> dict[int, PeerCredentials]:
    """Peer identities for ``agents`` simulated agents: a federation CA made for this
    simulation alone and one peer certificate per agent (docs/deploy.md#who-holds-which-key
    says who holds which key in a real federation; here the caller is every party)."""
    import datetime as dt

    from dpfl.client.summation import PeerCredentials
    from dpfl.secagg.identity import PeerAuthority, Signer
    from dpfl.server import tls

    ca = tls.create_ca(common_name="dpfl simulation federation CA")
    authority = PeerAuthority(ca.certificate)
    now = dt.datetime.now(dt.UTC)
    out = {}
    for i in range(agents):
        pair = tls.issue_peer_certificate(ca, name=f"sim-agent-{i}")
        signer = Signer(pair.private_key, pair.certificate, authority=authority, now=now)
        out[i] = PeerCredentials(signer=signer, authority=authority)
    return out
