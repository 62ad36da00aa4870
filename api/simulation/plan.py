"""A simulation's validated settings, before anything starts.

``dpfl simulate``'s arguments and ``dpfl.simulate``'s parameters both become a
:class:`SimulationPlan` (each front end checks its own input and names errors its own way); the
plan then makes the :class:`~.federation.Simulation` that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dpfl.learning.jobs import JobSpec
from dpfl.simulation.clients import ClientTerms
from dpfl.simulation.federation import Backend, Simulation, Transport

if TYPE_CHECKING:
    from dpfl.learning.data.images import DataFolder
    from dpfl.simulation.ray_backend import RayOptions

__all__ = ["SimulationPlan"]


@dataclass(frozen=True)
class SimulationPlan:
    """What to run: the job, N agents, how they connect and where they run, what each client
    may spend, and the data folder the job reads (None: it reads no file-based data set)."""

    job: JobSpec
    agents: int
    transport: Transport = "grpc"
    database_url: str | None = None
    clients: ClientTerms = field(default_factory=ClientTerms)
    data: DataFolder | None = None
    backend: Backend = "local"
    ray: RayOptions | None = None

    def simulation(self) -> Simulation:
        """The federation that runs this plan (nothing starts until its ``run``)."""
        return Simulation(
            self.job,
            agents=self.agents,
            transport=self.transport,
            database_url=self.database_url,
            budgets=self.clients.budgets,
            policies=self.clients.policies,
            backend=self.backend,
            ray=self.ray,
        )
