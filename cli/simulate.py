"""``dpfl simulate``: run a job with a coordinator and N agents, and report accuracy and ε.

A thin shell over the library (:mod:`dpfl.simulation`): it turns the arguments into a
:class:`~dpfl.simulation.SimulationPlan` (a bad argument is exit code 2, named on stderr), runs
the plan's :class:`~dpfl.simulation.Simulation` with a progress bar, and prints the summary and,
with ``--json``, the result's JSON line (:mod:`dpfl.cli.sim_report`). Transports and the
``--json`` line: docs/architecture.md#simulation-dpfl-simulate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dpfl.cli.sim_report import run_command, run_with_progress
from dpfl.cmdline import Subparsers
from dpfl.learning.jobs import JobSpec, job_to_dict, load_job, parse_job
from dpfl.simulation import (
    ClientTerms,
    SimulationPlan,
    SimulationResult,
    agent_policy,
    client_budget,
    uniform_clients,
)
from dpfl.simulation.data_location import locate_job_data, using_data_dir

if TYPE_CHECKING:
    from dpfl.learning.data.images import DataFolder
    from dpfl.simulation.ray_backend import RayOptions

__all__ = ["load_with_seed", "register"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a job with a coordinator and N agents in this process",
        description="Start a coordinator and N agents (each with its share of the job's data) "
        "on loopback gRPC or in-process links, run the job, and report accuracy and ε.",
    )
    _add_run_arguments(parser)
    _add_ray_arguments(parser)
    _add_budget_arguments(parser)
    _add_output_arguments(parser)
    parser.set_defaults(func=_main)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The job, the agents, and how they connect and where they run."""
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


def _add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the Ray backend hosts the agents (each needs ``--backend ray``)."""
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


def _add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """What each client may spend: its coordinator-side budget and its agent's policy."""
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


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The data folder, the database, the seed and the JSON line."""
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


class _UsageError(Exception):
    """A bad argument: printed after the command's name, exit code 2."""


def load_with_seed(path: Path, seed: int | None) -> JobSpec:
    """The job file, with ``seed`` (model and training seed) overridden when given."""
    job = load_job(path)
    if seed is None:
        return job
    return parse_job({**job_to_dict(job), "seed": seed})


def _main(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except _UsageError as exc:
        print(f"dpfl simulate: {exc}", file=sys.stderr)
        return 2
    with using_data_dir(plan.data):
        return run_command("dpfl simulate", _run(plan), json_line=args.json)


def _plan(args: argparse.Namespace) -> SimulationPlan:
    """The arguments as a plan, checked in the order they matter (first error wins).

    Raises:
        _UsageError: a bad job, agent count, data folder, budget, policy or Ray option.
    """
    job = _job(args.job, args.seed)
    if args.agents < 1:
        raise _UsageError("--agents must be >= 1")
    data = _data_folder(job, args.data_dir)
    clients = _clients(job, args)
    ray = _ray_options(args)
    return SimulationPlan(
        job,
        args.agents,
        args.transport,
        args.database_url,
        clients,
        data,
        backend=args.backend,
        ray=ray,
    )


def _job(path: Path, seed: int | None) -> JobSpec:
    from dpfl.learning.errors import LearningError

    try:
        return load_with_seed(path, seed)
    except LearningError as exc:
        raise _UsageError(str(exc)) from None


def _data_folder(job: JobSpec, data_dir: str | None) -> DataFolder | None:
    from dpfl.learning.errors import LearningError

    try:
        return locate_job_data(job, data_dir, given_as="--data-dir")
    except LearningError as exc:
        raise _UsageError(str(exc)) from None


def _clients(job: JobSpec, args: argparse.Namespace) -> ClientTerms:
    """Every client's budget (``--budget-...``) and its agent's policy (``--agent-...``)."""
    from dpfl.client.policy import PolicyError

    try:
        budget = client_budget(job, args.budget_epsilon, args.budget_delta)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    try:
        policy = agent_policy(
            args.agent_policy,
            max_epsilon_per_job=args.agent_max_epsilon_per_job,
            max_epsilon_total=args.agent_max_epsilon_total,
            delta=args.agent_delta,
        )
    except PolicyError as exc:
        raise _UsageError(f"agent policy: {exc}") from None
    return uniform_clients(args.agents, budget=budget, policy=policy)


def _ray_options(args: argparse.Namespace) -> RayOptions | None:
    """The Ray backend's options; None for the local backend (which takes none of them)."""
    flags = {
        "--address": args.address,
        "--agents-per-actor": args.agents_per_actor,
        "--cpus-per-agent": args.cpus_per_agent,
        "--gpus-per-agent": args.gpus_per_agent,
    }
    given = [flag for flag, value in flags.items() if value is not None]
    if args.backend != "ray":
        if given:
            raise _UsageError(f"{', '.join(given)} need --backend ray")
        return None
    if args.transport != "grpc":
        raise _UsageError("--backend ray connects over gRPC (not --transport inproc)")
    from dpfl.simulation.ray_backend import RayOptions

    try:
        return RayOptions(
            address=args.address,
            agents_per_actor=args.agents_per_actor,
            cpus_per_agent=args.cpus_per_agent,
            gpus_per_agent=args.gpus_per_agent,
        )
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


async def _run(plan: SimulationPlan) -> SimulationResult:
    from rich.console import Console

    sim = plan.simulation()
    try:
        return await run_with_progress(
            sim, Console(stderr=True), description=f"{plan.job.name} ({plan.agents} agents)"
        )
    finally:
        await sim.close()
