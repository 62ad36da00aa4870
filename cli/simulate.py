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
from dpfl.learning.jobs import JobSpec
from dpfl.simulation import ClientTerms, SimulationPlan, SimulationResult, resolve_job
from dpfl.simulation.clients import agent_policy, client_budget, uniform_clients
from dpfl.simulation.data_location import locate_job_data, using_data_dir

if TYPE_CHECKING:
    from dpfl.simulation.ray_backend import RayOptions

__all__ = ["register"]

#: The Ray backend's flags: (flag, type, help); each needs ``--backend ray``.
_RAY_FLAGS: tuple[tuple[str, type, str], ...] = (
    (
        "--address",
        str,
        "the Ray cluster to join (ray start --head printed it; 'auto': the local one); "
        "default: a private single-node cluster",
    ),
    ("--agents-per-actor", int, "default: agents / cluster CPUs"),
    ("--cpus-per-agent", float, "default: the CPUs shared evenly"),
    ("--gpus-per-agent", float, "default: the cluster's GPUs shared evenly (none without GPUs)"),
)

#: What each client may spend: (flag, type, metavar, help).
_BUDGET_FLAGS: tuple[tuple[str, type, str, str], ...] = (
    (
        "--budget-epsilon",
        float,
        "E",
        "every client's ε budget at the coordinator (default: the coordinator's default)",
    ),
    ("--budget-delta", float, "D", "the δ that budget is measured at (default: the job's δ)"),
    (
        "--agent-policy",
        Path,
        "FILE",
        "every agent's local policy (YAML, as dpfl-agent run --policy; default: the default "
        "policy)",
    ),
    (
        "--agent-max-epsilon-per-job",
        float,
        "E",
        "override the policy's max_epsilon_per_job (the total cap rises with it if lower)",
    ),
    ("--agent-max-epsilon-total", float, "E", "override the policy's max_epsilon_total"),
    ("--agent-delta", float, "D", "override the δ the agents' policy measures ε at"),
)


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
    for flag, kind, text in _RAY_FLAGS:
        ray.add_argument(flag, type=kind, help=text)
    budgets = parser.add_argument_group(
        "clients' budgets",
        "what each client may spend: the coordinator's per-client budget (it leaves a client out "
        "of a round it cannot pay for) and the agents' own local policy (an agent declines an "
        "invitation it cannot afford); docs/utility.md#honest-simulation",
    )
    for flag, kind, metavar, text in _BUDGET_FLAGS:
        budgets.add_argument(flag, type=kind, metavar=metavar, help=text)
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the folder holding mnist/, fashion-mnist/ and usps/, for jobs that read them "
        "(default: $DPFL_DATA_DIR)",
    )
    parser.add_argument("--database-url", help="default: a temporary SQLite file")
    parser.add_argument("--seed", type=int, help="override the job's seed")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from dpfl.learning.errors import LearningError

    try:
        plan = _plan(args)
    except (LearningError, ValueError) as exc:
        print(f"dpfl simulate: {exc}", file=sys.stderr)
        return 2
    with using_data_dir(plan.data):
        return run_command("dpfl simulate", _run(plan), json_line=args.json)


def _plan(args: argparse.Namespace) -> SimulationPlan:
    """The arguments as a plan, checked in the order they matter (the first error wins).

    Raises:
        LearningError, ValueError: a bad job, agent count, data folder, budget, policy or Ray
            option (the message names it).
    """
    job = resolve_job(args.job, seed=args.seed)
    if args.agents < 1:
        raise ValueError("--agents must be >= 1")
    data = locate_job_data(job, args.data_dir, given_as="--data-dir")
    clients = _clients(job, args)
    return SimulationPlan(
        job,
        args.agents,
        args.transport,
        args.database_url,
        clients,
        data,
        backend=args.backend,
        ray=_ray_options(args),
    )


def _clients(job: JobSpec, args: argparse.Namespace) -> ClientTerms:
    """Every client's budget (``--budget-...``) and its agent's policy (``--agent-...``)."""
    from dpfl.client.policy import PolicyError

    budget = client_budget(job, args.budget_epsilon, args.budget_delta)
    try:
        policy = agent_policy(
            args.agent_policy,
            max_epsilon_per_job=args.agent_max_epsilon_per_job,
            max_epsilon_total=args.agent_max_epsilon_total,
            delta=args.agent_delta,
        )
    except PolicyError as exc:
        raise ValueError(f"agent policy: {exc}") from None
    return uniform_clients(args.agents, budget=budget, policy=policy)


def _ray_options(args: argparse.Namespace) -> RayOptions | None:
    """The Ray backend's options; None for the local backend (which takes none of them)."""
    given = [f for f, _, _ in _RAY_FLAGS if getattr(args, f[2:].replace("-", "_")) is not None]
    if args.backend != "ray":
        if given:
            raise ValueError(f"{', '.join(given)} need --backend ray")
        return None
    if args.transport != "grpc":
        raise ValueError("--backend ray connects over gRPC (not --transport inproc)")
    from dpfl.simulation.ray_backend import RayOptions

    return RayOptions(
        address=args.address,
        agents_per_actor=args.agents_per_actor,
        cpus_per_agent=args.cpus_per_agent,
        gpus_per_agent=args.gpus_per_agent,
    )


async def _run(plan: SimulationPlan) -> SimulationResult:
    from rich.console import Console

    sim = plan.simulation()
    try:
        return await run_with_progress(
            sim, Console(stderr=True), description=f"{plan.job.name} ({plan.agents} agents)"
        )
    finally:
        await sim.close()
