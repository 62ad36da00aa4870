"""``dpfl simulate --backend ray``: a simulation's agents hosted in Ray actors over a cluster.

The coordinator runs in the driver (:class:`dpfl.simulation.Simulation`); :class:`RayAgentPool`
places the agents, ``agents_per_actor`` at a time, into
:class:`dpfl.client.remote_host.RemoteAgentHost` actors spread over the nodes, each agent on its
own gRPC stream. Ray is optional (``pip install 'dpfl[ray]'``) and imported lazily. Resources,
refused requests and dead actors: docs/architecture.md#ray-backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpfl.client.remote_host import HostedAgent, RemoteAgentHost

__all__ = ["RayAgentPool", "RayOptions", "import_ray"]

#: Seconds the pool waits for its actors to be scheduled and their agents enrolled.
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RayOptions:
    """Where and how to host the agents (``dpfl simulate --backend ray`` options).

    ``address``: an existing cluster (``ray start --head`` printed it; ``auto`` finds the local
    one); None starts a private single-node cluster for the run. The others: see the module
    docstring; None means the default.
    """

    address: str | None = None
    agents_per_actor: int | None = None
    cpus_per_agent: float | None = None
    gpus_per_agent: float | None = None

    def __post_init__(self) -> None:
        if self.agents_per_actor is not None and self.agents_per_actor < 1:
            raise ValueError(f"agents per actor must be >= 1, got {self.agents_per_actor}")
        for name in ("cpus_per_agent", "gpus_per_agent"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name.replace('_', ' ')} must be >= 0, got {value}")
        if self.gpus_per_agent is not None and self.gpus_per_agent > 1:
            raise ValueError(f"gpus per agent must be <= 1, got {self.gpus_per_agent}")


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            "the ray backend needs Ray: pip install 'dpfl[ray]' (on every node of the cluster)"
        ) from None
    return ray


@dataclass(frozen=True)
class ActorPlan:
    """How many agents each actor hosts and what it asks Ray for."""

    groups: list[list[int]]
    cpus_per_actor: list[float]
    gpus_per_actor: list[float]
    torch_threads: list[int]


def plan_actors(
    agents: int, options: RayOptions, *, cluster_cpus: float, cluster_gpus: float
) -> ActorPlan:
    """Split agent indices 0..agents-1 into actors and size their resource requests.

    Raises:
        ValueError: the request exceeds what the cluster has in total.
    """
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    per_actor = options.agents_per_actor or max(1, math.ceil(agents / max(1, int(cluster_cpus))))
    groups = [list(range(i, min(agents, i + per_actor))) for i in range(0, agents, per_actor)]
    cpus = options.cpus_per_agent
    if cpus is None:
        cpus = cluster_cpus / agents
    gpus = options.gpus_per_agent
    if gpus is None:
        gpus = min(1.0, cluster_gpus / agents) if cluster_gpus > 0 else 0.0
    # Ray accepts fractions of a resource down to 1e-4 and rejects finer ones.
    cpus_per_actor = [math.floor(cpus * len(g) * 1e4) / 1e4 for g in groups]
    gpus_per_actor = [math.floor(gpus * len(g) * 1e4) / 1e4 for g in groups]
    if sum(cpus_per_actor) > cluster_cpus + 1e-9:
        raise ValueError(
            f"{agents} agents × {cpus} CPUs need {sum(cpus_per_actor):g} CPUs; the Ray cluster "
            f"has {cluster_cpus:g} (lower --cpus-per-agent)"
        )
    if sum(gpus_per_actor) > cluster_gpus + 1e-9:
        raise ValueError(
            f"{agents} agents × {gpus} GPUs need {sum(gpus_per_actor):g} GPUs; the Ray cluster "
            f"has {cluster_gpus:g} (lower --gpus-per-agent)"
        )
    threads = [max(1, int(c)) for c in cpus_per_actor]
    return ActorPlan(groups, cpus_per_actor, gpus_per_actor, threads)


class RayAgentPool:
    """The simulation's agents in Ray actors (see the module docstring).

    Args:
        options: the cluster and per-agent resources.
    """

    def __init__(self, options: RayOptions) -> None:
        self.options = options
        self.ray = import_ray()
        self._own_ray = False
        self.actors: list[Any] = []
        self.plan: ActorPlan | None = None
        self.agent_actor: list[int] = []  # agent index -> actor index

    def connect(self) -> None:
        """Join the cluster (or start a private one); a session already initialised in this
        process is reused and left running by :meth:`close`."""
        ray = self.ray
        if ray.is_initialized():
            return
        ray.init(
            address=self.options.address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        self._own_ray = True

    def multi_node(self) -> bool:
        """Whether the cluster has more than one live node (the coordinator must then listen
        on an address the other nodes can reach)."""
        return sum(1 for n in self.ray.nodes() if n.get("Alive")) > 1

    def node_address(self) -> str:
        """This node's address as the cluster sees it."""
        return str(self.ray.util.get_node_ip_address())

    async def start(
        self, address: str, agents: Sequence[HostedAgent], *, coordinator_id: str
    ) -> list[str]:
        """Start the actors, each enrolling and starting its agents; returns the agents' ids in
        the order of ``agents``.

        Raises:
            ValueError: the cluster cannot host the request.
            TimeoutError: the actors were not all running within :data:`START_TIMEOUT_S`.
            RuntimeError: an actor failed to start its agents (its error is named).
        """
        ray = self.ray
        resources = ray.cluster_resources()
        plan = plan_actors(
            len(agents),
            self.options,
            cluster_cpus=float(resources.get("CPU", 0.0)),
            cluster_gpus=float(resources.get("GPU", 0.0)),
        )
        self.plan = plan
        remote = ray.remote(RemoteAgentHost)
        refs = []
        for k, group in enumerate(plan.groups):
            actor = remote.options(
                num_cpus=plan.cpus_per_actor[k],
                num_gpus=plan.gpus_per_actor[k],
                scheduling_strategy="SPREAD",
                max_restarts=0,
                name=None,
            ).remote(
                address,
                torch_threads=plan.torch_threads[k],
                device="cuda" if plan.gpus_per_actor[k] > 0 else "cpu",
                coordinator_id=coordinator_id,
            )
            self.actors.append(actor)
            self.agent_actor.extend([k] * len(group))
            refs.append(actor.start.remote([agents[i] for i in group]))
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(self._await(r) for r in refs)), START_TIMEOUT_S
            )
        except TimeoutError:
            raise TimeoutError(
                f"the Ray actors did not all start their agents within {START_TIMEOUT_S:g} s "
                "(not enough free resources on the cluster?)"
            ) from None
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"a Ray actor failed to start its agents: {exc}") from None
        return [agent_id for ids in results for agent_id in ids]

    @staticmethod
    async def _await(ref: Any) -> Any:
        return await ref

    def kill_actor(self, index: int) -> None:
        """Kill one actor at once, as a crashed machine would end (tests)."""
        self.ray.kill(self.actors[index], no_restart=True)

    async def close(self, *, timeout: float = 20.0) -> None:
        """Stop every actor's agents (dead actors are skipped), end the actors, and shut Ray
        down when this pool started it."""
        ray = self.ray
        if self.actors:
            refs = [a.stop.remote() for a in self.actors]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    asyncio.gather(*(self._await(r) for r in refs), return_exceptions=True),
                    timeout,
                )
            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            self.actors.clear()
        if self._own_ray:
            ray.shutdown()
            self._own_ray = False
