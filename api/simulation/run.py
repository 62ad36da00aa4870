"""``dpfl.simulate``: a coordinator and N agents in this process, from Python.

The same :class:`~.federation.Simulation` ``dpfl simulate`` runs, with the same client budget and
agent policy options, returning the same :class:`~.result.SimulationResult` (its ``to_json()``
is the command's ``--json`` line). Called where an event loop already runs (a Jupyter notebook),
the simulation runs on a worker thread with its own loop, so the call blocks either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from dpfl.learning.jobs import JobSpec, job_to_dict, load_job, parse_job
from dpfl.simulation.clients import agent_policy as make_policy
from dpfl.simulation.clients import client_budget, uniform_clients
from dpfl.simulation.data_location import locate_job_data, using_data_dir
from dpfl.simulation.federation import Simulation, Transport, check_run
from dpfl.simulation.plan import SimulationPlan
from dpfl.simulation.result import SimulationResult

if TYPE_CHECKING:
    from dpfl.client.policy import Policy

__all__ = ["JobLike", "resolve_job", "run_plan", "run_simulation", "simulate", "simulate_job"]

#: A job document: a validated spec, its mapping, or the path of its YAML/JSON file.
JobLike = JobSpec | Mapping[str, object] | str | Path


def resolve_job(job: JobLike, *, seed: int | None = None) -> JobSpec:
    """The validated job, with ``seed`` (model and training seed) overridden when given.

    Raises:
        dpfl.learning.jobs.JobSpecError: an unreadable file or an invalid document.
        TypeError: ``job`` is none of the accepted kinds.
    """
    if isinstance(job, JobSpec):
        spec = job
    elif isinstance(job, Mapping):
        spec = parse_job(job)
    elif isinstance(job, str | Path):
        spec = load_job(job)
    else:
        raise TypeError(f"job must be a JobSpec, a mapping or a path, got {type(job).__name__}")
    if seed is None:
        return spec
    return parse_job({**job_to_dict(spec), "seed": seed})


async def run_simulation(sim: Simulation) -> SimulationResult:
    """Run ``sim`` to its end and close it, whatever happens."""
    try:
        return await sim.run()
    finally:
        await sim.close()


def run_plan(plan: SimulationPlan) -> SimulationResult:
    """Run ``plan`` to its end, blocking, with ``$DPFL_DATA_DIR`` its data folder meanwhile;
    where an event loop runs in this thread (a notebook), on a worker thread's own loop."""
    with using_data_dir(plan.data):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run_simulation(plan.simulation()))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpfl-simulate") as pool:
            return pool.submit(lambda: asyncio.run(run_simulation(plan.simulation()))).result()


def simulate_job(job: JobSpec, *, agents: int, transport: Transport = "grpc") -> SimulationResult:
    """Run a validated job with ``agents`` agents and the default client terms (blocking)."""
    return run_plan(SimulationPlan(job, agents, transport))


def simulate(
    job: JobLike,
    agents: int,
    *,
    transport: Transport = "inproc",
    seed: int | None = None,
    budget_epsilon: float | None = None,
    budget_delta: float | None = None,
    agent_policy: Policy | Mapping[str, object] | str | Path | None = None,
    agent_max_epsilon_per_job: float | None = None,
    agent_max_epsilon_total: float | None = None,
    agent_delta: float | None = None,
    data_dir: str | Path | None = None,
    database_url: str | None = None,
) -> SimulationResult:
    """Run ``job`` with ``agents`` simulated agents to its end and report.

    Args:
        job: a :class:`~dpfl.learning.jobs.JobSpec`, its mapping, or a YAML/JSON file's path.
        agents: N, the number of agents (each gets its share of the job's data).
        transport: ``"inproc"`` (default; every message still crosses as bytes) or ``"grpc"``.
        seed: overrides the job's seed.
        budget_epsilon, budget_delta: every client's budget at the coordinator (``δ`` defaults
            to the job's); None: the coordinator's default budget.
        agent_policy: every agent's local policy: a ``dpfl.client.policy.Policy``, a mapping
            of its fields or a YAML file's path; None: the default policy.
        agent_max_epsilon_per_job, agent_max_epsilon_total, agent_delta: override those policy
            fields (as ``dpfl simulate --agent-...``).
        data_dir: the folder holding ``mnist/``, ``fashion-mnist/`` and ``usps/``, for a job
            that reads them (default ``$DPFL_DATA_DIR``; README, "Data"); it is
            ``$DPFL_DATA_DIR`` for the call only.
        database_url: the coordinator's database (default: a temporary SQLite file).

    Returns:
        The :class:`SimulationResult`; ``to_json()`` is ``dpfl simulate --json``'s line.

    Raises:
        dpfl.learning.jobs.JobSpecError: an invalid job.
        dpfl.learning.errors.DatasetError: the job reads MNIST, Fashion-MNIST or USPS and
            neither ``data_dir`` nor ``$DPFL_DATA_DIR`` gives a folder holding it (the message
            names the folder as given).
        ValueError: bad agents, transport, budget or policy (the message names it).
    """
    spec = resolve_job(job, seed=seed)
    check_run(transport, "local", agents=agents, observed=False)
    budget = client_budget(spec, budget_epsilon, budget_delta)
    policy = make_policy(
        agent_policy,
        max_epsilon_per_job=agent_max_epsilon_per_job,
        max_epsilon_total=agent_max_epsilon_total,
        delta=agent_delta,
    )
    clients = uniform_clients(agents, budget=budget, policy=policy)
    data = locate_job_data(spec, data_dir, given_as="data_dir")
    return run_plan(SimulationPlan(spec, agents, transport, database_url, clients, data))
