"""``dpfl recipe``: the recipe a job would get, and the validation figures that chose it.

Without a search, the fields the job leaves to defaults and the values they take. With one (the
job's ``recipe.search``, or ``--proxy``), each candidate's validation accuracy on the proxy and
the one chosen, exactly as the coordinator chooses at submission (docs/utility.md#recipes);
``--write`` saves the job with its choice, which a coordinator then stores as it is.
Exit codes: 0 success; 2 a bad job or argument, or a search that could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel

from dpfl.cmdline import Subparsers
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, RecipeTrial, job_to_dict, load_job, parse_job

__all__ = ["register"]

#: The population a search simulates when neither the job nor ``--agents`` gives one.
DEFAULT_AGENTS = 100


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "recipe",
        help="the recipe a job would get, and the validation figures that chose it",
        description="Show the fields a job leaves to defaults, or choose them on a public proxy "
        "(the job's recipe.search, or --proxy) as the coordinator would, and print each "
        "candidate's validation accuracy.",
    )
    parser.add_argument("job", type=Path, help="the job document (YAML or JSON)")
    parser.add_argument(
        "--proxy",
        help="search on this labelled public data set (sets recipe.search and recipe.proxy)",
    )
    parser.add_argument(
        "--agents",
        type=int,
        help=f"the population to simulate (default: recipe.agents, else {DEFAULT_AGENTS})",
    )
    parser.add_argument(
        "--data-dir", metavar="DIR", help="the folder of mnist/, fashion-mnist/, usps/"
    )
    parser.add_argument("--write", type=Path, metavar="OUT", help="save the job with its recipe")
    parser.add_argument("--json", action="store_true", help="print the recipe as one JSON line")
    parser.set_defaults(func=_main)


def _job(args: argparse.Namespace) -> JobSpec:
    job = load_job(args.job)
    if args.proxy is None:
        return job
    document = job_to_dict(job)
    recipe = document["recipe"]
    assert isinstance(recipe, dict)
    document["recipe"] = {**recipe, "search": True, "proxy": args.proxy, "chosen": None}
    return parse_job(document)


def _main(args: argparse.Namespace) -> int:
    from dpfl.learning.recipes import search_recipe

    if args.agents is not None and args.agents < 2:
        print("dpfl recipe: --agents must be >= 2", file=sys.stderr)
        return 2
    try:
        job = _job(args)
        if job.recipe.search:
            agents = job.recipe.agents or args.agents or DEFAULT_AGENTS
            job = search_recipe(job, agents=agents, data_dir=args.data_dir, progress=_progress)
    except (LearningError, ValueError) as exc:
        print(f"dpfl recipe: {exc}", file=sys.stderr)
        return 2
    if args.write is not None:
        text = yaml.safe_dump(job_to_dict(job), sort_keys=False)
        args.write.write_text(text, encoding="utf-8")
    if args.json:
        print(json.dumps(_summary(job)))
    else:
        _print(job)
    return 0


def _figure(trial: RecipeTrial) -> str:
    """The trial's validation accuracy, with each run's when there were several."""
    if trial.validation_accuracy is None:
        return trial.error or "—"
    runs = f" (runs {' / '.join(f'{r:.4f}' for r in trial.runs)})" if len(trial.runs) > 1 else ""
    return f"{trial.validation_accuracy:.4f}{runs}"


def _progress(trial: RecipeTrial) -> None:
    print(f"  {trial.name}: {_figure(trial)} ({trial.seconds:.0f} s)", file=sys.stderr)


def _defaults(job: JobSpec) -> dict[str, object]:
    """Each field the job leaves to defaults, with the value it has (after any choice)."""
    document = job_to_dict(job)
    out: dict[str, object] = {}
    for path in job.recipe.defaults or ():
        node: object = document
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[path] = node
    return out


def _null_means(job: JobSpec) -> dict[str, str]:
    """What each field the job leaves to defaults at null stands for: its field's description
    (``params.local_steps``: ``null: 5, unless local_epochs is given``)."""
    out: dict[str, str] = {}
    for path in job.recipe.defaults or ():
        *parents, name = path.split(".")
        owner: object = job
        for part in parents:
            owner = getattr(owner, part, None)
        if not isinstance(owner, BaseModel) or getattr(owner, name, None) is not None:
            continue
        field = type(owner).model_fields.get(name)
        if field is not None and field.description is not None:
            out[path] = field.description
    return out


def _summary(job: JobSpec) -> dict[str, object]:
    chosen = job.recipe.chosen
    return {
        "job": job.name,
        "algorithm": job.algorithm,
        "defaults": _defaults(job),
        "null_means": _null_means(job),
        "chosen": None if chosen is None else chosen.model_dump(mode="json"),
    }


def _print(job: JobSpec) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    chosen = job.recipe.chosen
    if chosen is not None:
        table = Table(title=f"{job.name}: candidates on {chosen.proxy} ({chosen.agents} agents)")
        for column in ("candidate", "validation accuracy", "s", "sets"):
            table.add_column(column)
        for t in chosen.trials:
            mark = " (chosen)" if t.name == chosen.chosen else ""
            table.add_row(t.name + mark, _figure(t), f"{t.seconds:.0f}", json.dumps(t.overrides))
        console.print(table)
    table = Table(title=f"{job.name}: fields left to defaults ({job.algorithm})")
    table.add_column("field")
    table.add_column("value")
    means = _null_means(job)
    for path, value in _defaults(job).items():
        table.add_row(path, means.get(path, json.dumps(value)))
    console.print(table)
