"""The simulated federation: a coordinator and N agents in one process, and what they report.

The library ``dpfl.simulate``, ``dpfl simulate`` and ``dpfl demo`` stand on (the commands only
parse arguments and print): :mod:`.run` (``simulate``), :mod:`.plan` (a simulation's validated
settings), :mod:`.federation` (:class:`Simulation`), :mod:`.clients` (what each client may
spend), :mod:`.result` (:class:`SimulationResult`), :mod:`.data_location` (the data folder),
:mod:`.inproc` (the in-process links) and :mod:`.ray_backend` (the agents in Ray actors).
Importing this package loads no torch, gRPC or SQL: those load when a simulation starts.
"""

from __future__ import annotations

from dpfl.simulation.clients import ClientTerms, agent_policy, client_budget, uniform_clients
from dpfl.simulation.federation import Simulation
from dpfl.simulation.plan import SimulationPlan
from dpfl.simulation.result import Invitations, RoundInvitations, SimulationResult, StopReason
from dpfl.simulation.run import JobLike, resolve_job, run_plan, simulate, simulate_job

__all__ = [
    "ClientTerms",
    "Invitations",
    "JobLike",
    "RoundInvitations",
    "Simulation",
    "SimulationPlan",
    "SimulationResult",
    "StopReason",
    "agent_policy",
    "client_budget",
    "resolve_job",
    "run_plan",
    "simulate",
    "simulate_job",
    "uniform_clients",
]
