"""The simulated federation: a coordinator and N agents in one process, and what they report.

The library ``dpfl.simulate``, ``dpfl simulate`` and ``dpfl demo`` stand on (the commands only
parse arguments and print). Its modules, each one thing:

- :mod:`.run`: ``simulate`` (the researchers' call) and the blocking runs behind it;
- :mod:`.plan`: :class:`SimulationPlan`, a simulation's validated settings;
- :mod:`.federation`: :class:`Simulation`, the coordinator and the agents in one event loop;
- :mod:`.clients`: what each simulated client may spend (budget, local policy);
- :mod:`.result`: :class:`SimulationResult`, read from the coordinator's store;
- :mod:`.data_location`: the data folder a job reads, checked before anything starts;
- :mod:`.inproc`: the in-process links (``transport="inproc"``);
- :mod:`.ray_backend`: the agents in Ray actors (``backend="ray"``).

Importing this package loads no torch, gRPC or SQL: those load when a simulation starts.
"""

from __future__ import annotations

from dpfl.simulation.clients import ClientTerms, agent_policy, client_budget, uniform_clients
from dpfl.simulation.federation import (
    Backend,
    CoordinatorOptions,
    RemoteAgent,
    Simulation,
    Transport,
)
from dpfl.simulation.plan import SimulationPlan
from dpfl.simulation.result import Invitations, RoundInvitations, SimulationResult, StopReason
from dpfl.simulation.run import (
    JobLike,
    resolve_job,
    run_plan,
    run_simulation,
    simulate,
    simulate_job,
)

__all__ = [
    "Backend",
    "ClientTerms",
    "CoordinatorOptions",
    "Invitations",
    "JobLike",
    "RemoteAgent",
    "RoundInvitations",
    "Simulation",
    "SimulationPlan",
    "SimulationResult",
    "StopReason",
    "Transport",
    "agent_policy",
    "client_budget",
    "resolve_job",
    "run_plan",
    "run_simulation",
    "simulate",
    "simulate_job",
    "uniform_clients",
]
