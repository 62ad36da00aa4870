"""``dpfl simulate``: a coordinator and N agents, on loopback gRPC, in-process, or in Ray actors.

Runs what a deployment runs (the coordinator's store, ledger, round engine and secagg server, and
N real agents each with its data shard) over a loopback channel (``grpc``), in-process links that
still serialize every message (``inproc``), or Ray actors (``--backend ray``). :class:`Simulation`
is the library behind the command and ``dpfl demo``, and tests use it to reach the agents and the
coordinator. Transports and the ``--json`` line: docs/architecture.md#simulation-dpfl-simulate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import math
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from dpfl.cli.sim_result import SimulationResult, invitations_from_rounds, stop_reason
from dpfl.cmdline import Subparsers
from dpfl.learning.jobs import JobSpec, job_to_dict, load_job, parse_job

__all__ = [
    "RemoteAgent",
    "Simulation",
    "SimulationResult",
    "agent_policy",
    "client_budget",
    "register",
    "run_command",
    "run_with_progress",
    "simulate_job",
    "uniform_clients",
]


@dataclass(frozen=True)
class RemoteAgent:
    """An agent of the Ray backend: its id, index in the simulation and hosting actor."""

    agent_id: str
    index: int
    actor: int


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
        observer: called with (agent index, ``AgentEvent``) for every agent event.
        admin_token: the REST API's admin token (default: a fresh random one).
        backend: ``"local"`` (the agents in this process) or ``"ray"`` (in Ray actors over a
            cluster, always over gRPC; :mod:`dpfl.cli.ray_backend`).
        ray: the Ray backend's options (default: :class:`~dpfl.cli.ray_backend.RayOptions`'s).

    Attributes:
        agents: the started agents (:class:`~dpfl.client.simulation.SimulatedAgent`), in index
            order; ``host`` is their :class:`~dpfl.client.simulation.AgentHost`, created by the
            first ``start_coordinator`` or ``start_agents`` and closed by :meth:`close`.
    """

    def __init__(
        self,
        job: JobSpec,
        *,
        agents: int,
        transport: str = "grpc",
        database_url: str | None = None,
        workdir: Path | None = None,
        serve_api: bool = False,
        api_port: int = 0,
        grpc_port: int = 0,
        deadlines: Any = None,
        coordinator_options: Mapping[str, Any] | None = None,
        budgets: Mapping[int, tuple[float, float]] | None = None,
        policies: Mapping[int, Any] | None = None,
        observer: Callable[[int, Any], None] | None = None,
        admin_token: str | None = None,
        backend: str = "local",
        ray: Any = None,
    ) -> None:
        if transport not in ("grpc", "inproc"):
            raise ValueError(f"transport must be 'grpc' or 'inproc', got {transport!r}")
        if backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
        if backend == "ray" and transport != "grpc":
            raise ValueError("the ray backend connects its agents over gRPC (transport 'grpc')")
        if backend == "ray" and observer is not None:
            raise ValueError("agent observers need the agents in this process (backend 'local')")
        if agents < 1:
            raise ValueError(f"agents must be >= 1, got {agents}")
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
        self.coordinator_options = dict(coordinator_options or {})
        self.budgets = dict(budgets or {})
        self.policies = dict(policies or {})
        self.observer = observer
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.coordinator: Any = None
        self.inproc: Any = None
        self.host: Any = None
        self.agents: list[Any] = []
        self._transports: list[Any] = []
        self.job_id: str | None = None
        self.backend = backend
        self.ray_options = ray
        self.pool: Any = None
        self.ray_plan: Any = None
        self.grpc_host = "127.0.0.1"
        self.advertised_host = "127.0.0.1"

    # -- coordinator -----------------------------------------------------------------------------

    def settings(self) -> Any:
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

    def _host(self) -> Any:
        """The agent host, created before the coordinator's first thread does any torch work
        (so that the whole simulation computes with one intra-op thread per task)."""
        if self.host is None:
            from dpfl.client.simulation import AgentHost

            self.host = AgentHost()
        return self.host

    async def start_coordinator(self) -> Any:
        """Start (or restart, on the same database and gRPC port) the coordinator."""
        from dpfl.cli.inproc import InProcessCoordinator
        from dpfl.server.coordinator import Coordinator

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
        self.coordinator = coordinator
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
        from dpfl.cli.ray_backend import RayAgentPool, RayOptions

        self.pool = RayAgentPool(self.ray_options or RayOptions())
        self.pool.connect()
        if self.pool.multi_node():
            self.grpc_host = "0.0.0.0"
            self.advertised_host = self.pool.node_address()

    # -- agents ----------------------------------------------------------------------------------

    async def _enroll(self, token: str, name: str) -> tuple[str, str, Any]:
        from dpfl.protos.dpfl.v1 import agent_pb2 as pb

        if self.transport == "inproc":
            response = await self.inproc.enroll(pb.EnrollRequest(enrollment_token=token, name=name))
            return response.agent_id, response.credential, None
        from dpfl.client.transport import GrpcTransport

        transport = GrpcTransport(f"127.0.0.1:{self.grpc_port}", insecure=True)
        self._transports.append(transport)
        response = await transport.enroll(token=token, name=name)
        return response.agent_id, response.credential, transport

    async def start_agents(self) -> list[Any]:
        """Enrol N agents, give each its share of the data, and connect them."""
        from dpfl.client.data import data_spec_for_job
        from dpfl.client.transport import Backoff
        from dpfl.server.store import Budget

        if self.backend == "ray":
            return await self._start_ray_agents()
        host = self._host()
        store = self.coordinator.store
        for i in range(self.num_agents):
            budget = self.budgets.get(i)
            issued = await asyncio.to_thread(
                store.create_enrollment_token,
                ttl=timedelta(hours=1),
                budget=Budget(*budget) if budget is not None else None,
            )
            agent_id, credential, transport = await self._enroll(issued.token, f"sim-{i:04d}")
            if transport is None:
                connector = self.inproc.connector(agent_id=agent_id, credential=credential)
            else:
                connector = transport.connector(agent_id=agent_id, credential=credential)
            agent = await host.start(
                agent_id=agent_id,
                connector=connector,
                data_spec=data_spec_for_job(self.job.data, index=i, agents=self.num_agents),
                state_dir=self.workdir / "agents" / f"{i:04d}",
                policy=self.policies.get(i),
                coordinator_id=self.coordinator.coordinator_id,
                observer=None if self.observer is None else functools.partial(self.observer, i),
                backoff=Backoff(initial=0.05, maximum=0.5),
            )
            self.agents.append(agent)
        ok = await self.coordinator.registry.wait_connected(
            [a.agent_id for a in self.agents], timeout=30
        )
        if not ok:
            raise RuntimeError("not every simulated agent connected within 30 s")
        return self.agents

    async def _start_ray_agents(self) -> list[Any]:
        """Issue one enrollment token per agent; the Ray actors enrol and start the agents."""
        from dpfl.client.data import data_spec_for_job
        from dpfl.client.remote_host import HostedAgent
        from dpfl.server.store import Budget

        store = self.coordinator.store

        def tokens() -> list[str]:
            issued = []
            for i in range(self.num_agents):
                budget = self.budgets.get(i)
                issued.append(
                    store.create_enrollment_token(
                        ttl=timedelta(hours=1),
                        budget=Budget(*budget) if budget is not None else None,
                    ).token
                )
            return issued

        hosted = [
            HostedAgent(
                index=i,
                name=f"sim-{i:04d}",
                enrollment_token=token,
                data_spec=data_spec_for_job(self.job.data, index=i, agents=self.num_agents),
                policy=self.policies.get(i),
            )
            for i, token in enumerate(await asyncio.to_thread(tokens))
        ]
        address = f"{self.advertised_host}:{self.grpc_port}"
        ids = await self.pool.start(address, hosted, coordinator_id=self.coordinator.coordinator_id)
        self.ray_plan = self.pool.plan
        self.agents = [
            RemoteAgent(agent_id=agent_id, index=i, actor=self.pool.agent_actor[i])
            for i, agent_id in enumerate(ids)
        ]
        ok = await self.coordinator.registry.wait_connected(ids, timeout=60)
        if not ok:
            raise RuntimeError("not every agent of the Ray actors connected within 60 s")
        return self.agents

    # -- the job ---------------------------------------------------------------------------------

    async def submit(self) -> str:
        """Submit the job with the agents as its population and start it."""
        from dpfl.server.data_access import DataAccess
        from dpfl.server.jobs_control import submit_job

        store = self.coordinator.store
        job = await asyncio.to_thread(
            functools.partial(
                submit_job,
                store,
                job_to_dict(self.job),
                members=[a.agent_id for a in self.agents],
                access=DataAccess.from_settings(self.coordinator.settings),
            )
        )
        self.job_id = job.id
        await self.coordinator.orchestrator.start(job.id)
        return job.id

    async def wait(self) -> Any:
        """Wait until the job's runner ends (following coordinator restarts)."""
        while True:
            coordinator = self.coordinator
            job = await coordinator.orchestrator.wait(self.job_id)
            if coordinator is self.coordinator and job.status.value != "running":
                return job
            await asyncio.sleep(0.05)

    def result(self, wall_s: float) -> SimulationResult:
        store = self.coordinator.store
        job = store.get_job(self.job_id)
        rounds = store.list_rounds(self.job_id)
        done = [r for r in rounds if r.status.value == "completed"]
        last = max(done, key=lambda r: r.number) if done else None
        delta = self.job.privacy.delta
        # each client's ε for this job in the ledger: the smaller of the job's RDP figure and its
        # tight figure, both proven bounds unless the job's noise is discrete Gaussian (entries
        # marked approximate; docs/accounting.md#which-bound-each-ledger-figure-is); 0 for a
        # client the job never charged. One read of the job's entries for all clients.
        charged = store.job_epsilons(self.job_id or "", delta=delta)
        epsilon = {a.agent_id: float(charged.get(a.agent_id, 0.0)) for a in self.agents}
        plan = rounds[-1].noise.get("plan", {}) if rounds else {}
        runner = self.coordinator.orchestrator.runner(self.job_id)
        metrics = {}
        reports = list(runner.reports) if runner is not None else []
        completed = [r for r in reports if r.completed]
        if completed:
            metrics = dict(completed[-1].metrics)
        skipped = {r.round.number for r in reports if r.skipped and r.round is not None} - {
            d.number for d in done
        }
        invitations, per_round = invitations_from_rounds(rounds)
        return SimulationResult(
            job=self.job.name,
            job_id=self.job_id or "",
            algorithm=self.job.algorithm,
            status=job.status.value,
            rounds_completed=len(done),
            accuracy=last.accuracy if last is not None else None,
            epsilon=epsilon,
            delta=delta,
            noise_multiplier=plan.get("noise_multiplier"),
            wall_s=wall_s,
            metrics=metrics,
            error=job.error,
            claimed_epsilon=plan.get("details", {}).get("claimed_epsilon"),
            claim=plan.get("details", {}).get("claim"),
            rounds_planned=self.job.rounds,
            rounds_skipped=len(skipped),
            invitations=invitations,
            per_round=per_round,
            stop=stop_reason(
                status=job.status.value,
                error=job.error,
                rounds_planned=self.job.rounds,
                rounds_completed=len(done),
                rounds_skipped=len(skipped),
                reports=reports,
            ),
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
            if self.coordinator is not None:
                await self.coordinator.close()
        finally:
            if self.host is not None:
                await self.host.close()
            if self._tmp is not None:
                self._tmp.cleanup()

    async def run(self, *, progress: Callable[[Any], None] | None = None) -> SimulationResult:
        """Start everything, run the job to its end, and report."""
        started = time.monotonic()
        await self.start_coordinator()
        await self.start_agents()
        await self.submit()
        watcher = None
        if progress is not None:
            watcher = asyncio.get_running_loop().create_task(self._watch(progress))
        try:
            await self.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        return self.result(time.monotonic() - started)

    async def _watch(self, progress: Callable[[Any], None]) -> None:
        seen = 0
        while True:
            await asyncio.sleep(0.2)
            runner = self.coordinator.orchestrator.runner(self.job_id)
            if runner is not None and len(runner.reports) > seen:
                for report in runner.reports[seen:]:
                    progress(report)
                seen = len(runner.reports)


def simulate_job(
    job: JobSpec, *, agents: int, transport: str = "grpc", **options: Any
) -> SimulationResult:
    """Run a whole simulated job (blocking)."""

    async def main() -> SimulationResult:
        sim = Simulation(job, agents=agents, transport=transport, **options)
        try:
            return await sim.run()
        finally:
            await sim.close()

    return asyncio.run(main())


# -- the clients' budgets ------------------------------------------------------------------------


def client_budget(
    job: JobSpec, epsilon: float | None, delta: float | None = None
) -> tuple[float, float] | None:
    """The coordinator-side budget (ε, δ) every simulated client gets, or None for the
    coordinator's default; δ defaults to the job's.

    Raises:
        ValueError: ε not a finite number > 0, δ outside (0, 1), or δ without ε.
    """
    if epsilon is None:
        if delta is not None:
            raise ValueError("a budget δ needs a budget ε (--budget-epsilon)")
        return None
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"the budget ε must be a finite number > 0, got {epsilon!r}")
    d = job.privacy.delta if delta is None else delta
    if not (math.isfinite(d) and 0 < d < 1):
        raise ValueError(f"the budget δ must be in (0, 1), got {d!r}")
    return (float(epsilon), float(d))


def agent_policy(
    policy: Any = None,
    *,
    max_epsilon_per_job: float | None = None,
    max_epsilon_total: float | None = None,
    delta: float | None = None,
) -> Any:
    """The local policy every simulated agent runs (``dpfl.client.policy.Policy``), or None for
    the agents' default policy.

    Args:
        policy: a ``Policy``, a mapping of its fields, a YAML file's path, or None.
        max_epsilon_per_job, max_epsilon_total, delta: override those fields. When only the
            per-job cap is raised above the total cap, the total follows it (one job alone
            cannot need more than its own cap).

    Raises:
        dpfl.client.policy.PolicyError: an unreadable file or an invalid field (named).
    """
    from dpfl.client.policy import Policy

    overrides = {
        k: v
        for k, v in (
            ("max_epsilon_per_job", max_epsilon_per_job),
            ("max_epsilon_total", max_epsilon_total),
            ("delta", delta),
        )
        if v is not None
    }
    if policy is None and not overrides:
        return None
    if isinstance(policy, Policy):
        base = policy
    elif policy is None or isinstance(policy, Mapping):
        base = Policy.from_mapping(policy)
    else:
        base = Policy.load(Path(policy))
    if not overrides:
        return base
    fields = base.model_dump()
    if max_epsilon_total is None and max_epsilon_per_job is not None:
        fields["max_epsilon_total"] = max(fields["max_epsilon_total"], max_epsilon_per_job)
    return Policy.from_mapping({**fields, **overrides})


# -- the command ---------------------------------------------------------------------------------


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a job with a coordinator and N agents in this process",
        description="Start a coordinator and N agents (each with its share of the job's data) "
        "on loopback gRPC or in-process links, run the job, and report accuracy and ε.",
    )
    parser.add_argument("job", type=Path, help="the job document (YAML or JSON)")
    parser.add_argument("--agents", type=int, required=True, help="number of agents N")
    parser.add_argument("--transport", choices=("grpc", "inproc"), default="grpc")
    parser.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="where the agents run: this process, or Ray actors over a cluster (gRPC; "
        "needs dpfl[ray])",
    )
    ray = parser.add_argument_group("ray backend")
    ray.add_argument(
        "--address",
        default=None,
        help="the Ray cluster to join (ray start --head printed it; 'auto': the local one); "
        "default: a private single-node cluster",
    )
    ray.add_argument(
        "--agents-per-actor", type=int, default=None, help="default: agents / cluster CPUs"
    )
    ray.add_argument(
        "--cpus-per-agent", type=float, default=None, help="default: the CPUs shared evenly"
    )
    ray.add_argument(
        "--gpus-per-agent",
        type=float,
        default=None,
        help="default: the cluster's GPUs shared evenly (none without GPUs)",
    )
    budgets = parser.add_argument_group(
        "clients' budgets",
        "what each client may spend: the coordinator's per-client budget (it leaves a client out "
        "of a round it cannot pay for) and the agents' own local policy (an agent declines an "
        "invitation it cannot afford); docs/utility.md#honest-simulation",
    )
    budgets.add_argument(
        "--budget-epsilon",
        type=float,
        default=None,
        metavar="E",
        help="every client's ε budget at the coordinator (default: the coordinator's default)",
    )
    budgets.add_argument(
        "--budget-delta",
        type=float,
        default=None,
        metavar="D",
        help="the δ that budget is measured at (default: the job's δ)",
    )
    budgets.add_argument(
        "--agent-policy",
        type=Path,
        default=None,
        metavar="FILE",
        help="every agent's local policy (YAML, as dpfl-agent run --policy; default: the "
        "default policy)",
    )
    budgets.add_argument(
        "--agent-max-epsilon-per-job",
        type=float,
        default=None,
        metavar="E",
        help="override the policy's max_epsilon_per_job (the total cap rises with it if lower)",
    )
    budgets.add_argument(
        "--agent-max-epsilon-total",
        type=float,
        default=None,
        metavar="E",
        help="override the policy's max_epsilon_total",
    )
    budgets.add_argument(
        "--agent-delta",
        type=float,
        default=None,
        metavar="D",
        help="override the δ the agents' policy measures ε at",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="the folder holding mnist/, fashion-mnist/ and usps/, for jobs that read them "
        "(default: $DPFL_DATA_DIR)",
    )
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--seed", type=int, default=None, help="override the job's seed")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.set_defaults(func=_main)


def load_with_seed(path: Path, seed: int | None) -> JobSpec:
    """The job file, with ``seed`` (model and training seed) overridden when given."""
    job = load_job(path)
    if seed is None:
        return job
    return parse_job({**job_to_dict(job), "seed": seed})


def _main(args: argparse.Namespace) -> int:
    from dpfl.learning.errors import LearningError

    try:
        job = load_with_seed(args.job, args.seed)
    except LearningError as exc:
        print(f"dpfl simulate: {exc}", file=sys.stderr)
        return 2
    if args.agents < 1:
        print("dpfl simulate: --agents must be >= 1", file=sys.stderr)
        return 2
    from dpfl.cli.data_location import locate_job_data, using_data_dir

    try:
        data_folder = locate_job_data(job, args.data_dir, given_as="--data-dir")
    except LearningError as exc:
        print(f"dpfl simulate: {exc}", file=sys.stderr)
        return 2
    from dpfl.client.policy import PolicyError

    try:
        args.client_budget = client_budget(job, args.budget_epsilon, args.budget_delta)
    except ValueError as exc:
        print(f"dpfl simulate: {exc}", file=sys.stderr)
        return 2
    try:
        args.policy = agent_policy(
            args.agent_policy,
            max_epsilon_per_job=args.agent_max_epsilon_per_job,
            max_epsilon_total=args.agent_max_epsilon_total,
            delta=args.agent_delta,
        )
    except PolicyError as exc:
        print(f"dpfl simulate: agent policy: {exc}", file=sys.stderr)
        return 2
    ray_flags = [
        flag
        for flag, value in (
            ("--address", args.address),
            ("--agents-per-actor", args.agents_per_actor),
            ("--cpus-per-agent", args.cpus_per_agent),
            ("--gpus-per-agent", args.gpus_per_agent),
        )
        if value is not None
    ]
    if args.backend != "ray" and ray_flags:
        print(f"dpfl simulate: {', '.join(ray_flags)} need --backend ray", file=sys.stderr)
        return 2
    if args.backend == "ray":
        if args.transport != "grpc":
            print(
                "dpfl simulate: --backend ray connects over gRPC (not --transport inproc)",
                file=sys.stderr,
            )
            return 2
        from dpfl.cli.ray_backend import RayOptions

        try:
            args.ray_options = RayOptions(
                address=args.address,
                agents_per_actor=args.agents_per_actor,
                cpus_per_agent=args.cpus_per_agent,
                gpus_per_agent=args.gpus_per_agent,
            )
        except ValueError as exc:
            print(f"dpfl simulate: {exc}", file=sys.stderr)
            return 2
    with using_data_dir(data_folder):
        return run_command("dpfl simulate", _run(job, args), json_line=args.json)


def run_command(name: str, main: Coroutine[Any, Any, SimulationResult], *, json_line: bool) -> int:
    """Run a simulation command (``dpfl simulate``, ``dpfl demo``) to its exit code: 0 when the
    job completed, 1 when it did not or on an error (named on stderr), 130 on Ctrl-C; with
    ``json_line`` the result's JSON line ends stdout."""
    try:
        result = asyncio.run(main)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if json_line:
        print(result.to_json(), flush=True)
    return 0 if result.status == "completed" else 1


def uniform_clients(
    agents: int, *, budget: tuple[float, float] | None, policy: Any
) -> dict[str, Any]:
    """``Simulation``'s ``budgets`` and ``policies``: the same budget and policy for every agent."""
    return {
        "budgets": {} if budget is None else dict.fromkeys(range(agents), budget),
        "policies": {} if policy is None else dict.fromkeys(range(agents), policy),
    }


async def _run(job: JobSpec, args: argparse.Namespace) -> SimulationResult:
    from rich.console import Console

    sim = Simulation(
        job,
        agents=args.agents,
        transport=args.transport,
        database_url=args.database_url,
        backend=args.backend,
        ray=getattr(args, "ray_options", None),
        **uniform_clients(args.agents, budget=args.client_budget, policy=args.policy),
    )
    try:
        return await run_with_progress(
            sim, Console(stderr=True), description=f"{job.name} ({args.agents} agents)"
        )
    finally:
        await sim.close()


async def run_with_progress(sim: Simulation, console: Any, *, description: str) -> SimulationResult:
    """Run ``sim`` with a progress bar (one step a round) on ``console``, then print the
    summary; the caller closes ``sim`` (``dpfl simulate`` and ``dpfl demo``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
    ) as bar:
        task = bar.add_task(description, total=sim.job.rounds, status="")

        def progress(report: Any) -> None:
            if report.completed:
                acc = report.metrics.get("accuracy")
                survivors = int(report.metrics.get("survivors", 0))
                summed = f"{survivors} agents summed" if survivors else "round completed"
                text = summed if acc is None else f"{summed}, accuracy {acc:.3f}"
                bar.update(task, advance=1, status=text)
            elif report.skipped:
                bar.update(task, advance=1, status="skipped (too few sampled)")
            else:
                bar.update(task, status=f"aborted: {report.reason[:60]}")

        result = await sim.run(progress=progress)
    summary(console, result)
    return result


#: At most this many rows in the summary's ε table (``--json`` lists every client).
EPSILON_ROWS = 20


def epsilon_rows(epsilon: Mapping[str, float]) -> list[tuple[str, str]]:
    """The summary's ε table: clients whose ε prints the same share one row (``100 clients
    (agent-0 … agent-99)``), largest ε first; past :data:`EPSILON_ROWS` distinct values the
    smallest are summed up in a last row."""
    groups: dict[str, list[str]] = {}
    order: dict[str, float] = {}
    for client, value in sorted(epsilon.items()):
        shown = f"{value:.3f}" if math.isfinite(value) else "inf"
        groups.setdefault(shown, []).append(client)
        order[shown] = value if math.isfinite(value) else math.inf
    ranked = sorted(groups, key=lambda shown: -order[shown])
    rows = []
    for shown in ranked[:EPSILON_ROWS]:
        clients = groups[shown]
        if len(clients) == 1:
            rows.append((clients[0], shown))
        else:
            span = (
                f"{clients[0]}, {clients[1]}"
                if len(clients) == 2
                else (f"{clients[0]} … {clients[-1]}")
            )
            rows.append((f"{len(clients)} clients ({span})", shown))
    rest = ranked[EPSILON_ROWS:]
    if rest:
        count = sum(len(groups[shown]) for shown in rest)
        low, high = rest[-1], rest[0]
        rows.append((f"{count} more clients (--json lists each)", f"{low} – {high}"))
    return rows


def summary(console: Any, result: SimulationResult) -> None:
    """Accuracy and a per-client ε table."""
    from rich.table import Table

    eps = sorted(result.epsilon.values())
    title = (
        f"{result.job} ({result.algorithm}): {result.status}, "
        f"{result.rounds_completed} rounds, {result.wall_s:.1f} s"
    )
    table = Table(title=title)
    table.add_column("client")
    table.add_column(f"ε at δ={result.delta:g}", justify="right")
    for clients, shown in epsilon_rows(result.epsilon):
        table.add_row(clients, shown)
    console.print(table)
    accuracy = "n/a" if result.accuracy is None else f"{result.accuracy:.4f}"
    z = "n/a" if result.noise_multiplier is None else f"{result.noise_multiplier:.4g}"
    console.print(
        f"test accuracy {accuracy}; ε per client: max {max(eps, default=0):.3f}, "
        f"min {min(eps, default=0):.3f}; noise multiplier {z}"
    )
    if result.claimed_epsilon is not None:
        console.print(
            f"claimed ε {result.claimed_epsilon:.3f} (not a bound, not charged: {result.claim})"
        )
    extra = {k: v for k, v in result.metrics.items() if k not in ("accuracy", "survivors")}
    if extra:
        console.print("last round: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(extra.items())))
    invitations(console, result)
    if result.stop is not None:
        hint = _STOP_HINTS.get(result.stop.kind, "")
        console.print(
            f"[red]stopped early ({result.stop.kind}) after {result.rounds_completed} of "
            f"{result.rounds_planned} rounds: {result.stop.message}{hint}"
        )
    elif result.error:
        console.print(f"[red]job error: {result.error}")


#: What to change when a job stops for a client budget (printed after the reason).
_STOP_HINTS = {
    "budget_exhausted": " (the clients' coordinator-side budget: --budget-epsilon)",
}

#: The flag that sets each rule of the agents' local policy, named next to its declines.
_RULE_FLAGS = {
    "max_epsilon_per_job": "--agent-max-epsilon-per-job",
    "max_epsilon_total": "--agent-max-epsilon-total",
}


def invitations(console: Any, result: SimulationResult) -> None:
    """Invitations sent, accepted, declined per rule of the agents' policy, unanswered, and
    members the coordinator left out for their budget."""
    inv = result.invitations
    if inv.sent == 0 and inv.excluded_over_budget == 0:
        return
    console.print(
        f"invitations: {inv.sent} sent, {inv.accepted} accepted, {inv.declined} declined, "
        f"{inv.no_answer} unanswered; {inv.excluded_over_budget} left out by the coordinator "
        "(client budget spent)"
    )
    for rule, count in inv.declined_by_rule.items():
        flag = _RULE_FLAGS.get(rule)
        where = f" (agents' local policy; {flag})" if flag else ""
        console.print(f"  declined {count}× by {rule}{where}: e.g. {inv.example.get(rule, '')!r}")
