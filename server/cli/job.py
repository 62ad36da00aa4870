"""``dpfl-coordinator job``: submit, list, start and stop jobs.

These commands work on the **database** (``--database-url``, ``DPFL_DATABASE_URL`` or the
``--config`` file), not through the REST API: they need no running coordinator and no admin
token, and a running coordinator notices a job started or stopped here within a couple of
seconds (its orchestrator follows the jobs' status in the store). A job document is validated by
the same function as ``POST /api/v1/jobs`` (``dpfl.server.jobs_control.submit_job``), so both
accept and refuse exactly the same documents, under the same limits (1 MiB, 32 levels of
nesting; :mod:`dpfl.server.documents`) and data roots (``--data-dir``, ``--data-root``, as the
coordinator's: flags, ``DPFL_*`` variables or the ``--config`` file); a refused one writes
nothing and prints at most 20 problems. ``job start`` and ``job submit --start`` plan the job
for the members it starts with (``dpfl.server.jobs_control.start_job``) and refuse a job that
cannot run on them, with the reason on one line (``job list`` shows it too).

Exit codes: 0 done; 2 invalid document, unknown job or agent, or a refused status change;
1 the database failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dpfl.cmdline import Subparsers
from dpfl.learning.jobs import JobSpecError
from dpfl.server.cli.serve import (
    add_data_arguments,
    add_store_arguments,
    resolve_data_access,
    run_on_store,
)
from dpfl.server.documents import MAX_JOB_BYTES, bounded_problems
from dpfl.server.errors import ServerError

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported only by the command that runs
    from dpfl.server.store import Job, Store

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "job",
        help="submit, list, start and stop jobs (on the database)",
        description="Manage jobs in the coordinator's database; a running coordinator follows "
        "status changes within seconds.",
    )
    sub = parser.add_subparsers(dest="job_command", metavar="ACTION", required=True)

    submit = sub.add_parser("submit", help="validate and store a job (pending)")
    submit.add_argument("file", type=Path, help="the job document (YAML or JSON)")
    submit.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="ID",
        help="a member of the job's population (repeatable; default: every active agent "
        "when the job starts)",
    )
    submit.add_argument("--start", action="store_true", help="start it right away")
    add_data_arguments(submit)
    add_store_arguments(submit)
    submit.set_defaults(func=_submit)

    listing = sub.add_parser("list", help="list jobs")
    listing.add_argument("--status", default=None, help="only jobs in this status")
    add_store_arguments(listing)
    listing.set_defaults(func=_list)

    for action in ("start", "stop"):
        p = sub.add_parser(action, help=f"{action} a job")
        p.add_argument("job_id")
        if action == "start":
            add_data_arguments(p)
        add_store_arguments(p)
        p.set_defaults(func=_status, action=action)


def _job_json(job: Job, members: list[str] | None = None) -> dict[str, str | list[str] | None]:
    out: dict[str, str | list[str] | None] = {
        "id": job.id,
        "name": job.name,
        "algorithm": job.algorithm,
        "status": job.status.value,
        "created_at": job.created_at.isoformat(),
        "error": job.error,
    }
    if members is not None:
        out["members"] = members
    return out


def _run(args: argparse.Namespace, action: Callable[[Store], int]) -> int:
    def checked(store: Store) -> int:
        try:
            return action(store)
        except JobSpecError as exc:
            _print_problems(exc)
            return 2

    return run_on_store(args, checked, "dpfl-coordinator job")


def _print_problems(exc: JobSpecError) -> None:
    """The problems one per line, at most ``MAX_PROBLEMS`` of them, each of bounded length."""
    problems = bounded_problems(exc.problems)
    if len(problems) == 1:
        print(f"dpfl-coordinator job: invalid job: {problems[0]}", file=sys.stderr)
        return
    print("dpfl-coordinator job: invalid job:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)


def _read_document(path: Path) -> bytes:
    """The file's bytes, read no further than one byte past the REST API's limit.

    Raises:
        OSError: unreadable.
        JobSpecError: larger than ``MAX_JOB_BYTES``.
    """
    with path.open("rb") as handle:
        data = handle.read(MAX_JOB_BYTES + 1)
    if len(data) > MAX_JOB_BYTES:
        raise JobSpecError(
            [f"{path}: job document too large: over {MAX_JOB_BYTES} bytes (the limit)"]
        )
    return data


def _submit(args: argparse.Namespace) -> int:
    from dpfl.server.jobs_control import submit_job

    try:
        document = _read_document(args.file)
        access = resolve_data_access(args.data_dir, args.data_root, args.config)
    except OSError as exc:
        print(
            f"dpfl-coordinator job submit: cannot read {args.file}: {exc.strerror}", file=sys.stderr
        )
        return 2
    except JobSpecError as exc:
        _print_problems(exc)
        return 2
    except ServerError as exc:
        print(f"dpfl-coordinator job submit: {exc}", file=sys.stderr)
        return 2

    def action(store: Store) -> int:
        job = submit_job(store, document, members=args.agent, access=access, start=args.start)
        members = store.job_members(job.id)
        if args.json:
            print(json.dumps(_job_json(job, members)))
        else:
            print(
                f"{job.id}\t{job.name}\t{job.algorithm}\t{job.status.value}\t{len(members)} members"
            )
        return 0

    return _run(args, action)


def _list(args: argparse.Namespace) -> int:
    from dpfl.server.store import JobStatus

    def action(store: Store) -> int:
        status = JobStatus(args.status) if args.status else None
        jobs = store.list_jobs(status=status)
        if args.json:
            print(json.dumps([_job_json(j) for j in jobs]))
        else:
            for j in jobs:
                reason = f"\t{j.error}" if j.error else ""
                print(f"{j.id}\t{j.name}\t{j.algorithm}\t{j.status.value}{reason}")
        return 0

    if args.status and args.status not in {s.value for s in JobStatus}:
        print(f"dpfl-coordinator job list: unknown status {args.status!r}", file=sys.stderr)
        return 2
    return _run(args, action)


def _status(args: argparse.Namespace) -> int:
    from dpfl.server.jobs_control import start_job
    from dpfl.server.store import JobStatus

    access = None
    if args.action == "start":
        try:
            access = resolve_data_access(args.data_dir, args.data_root, args.config)
        except ServerError as exc:
            print(f"dpfl-coordinator job start: {exc}", file=sys.stderr)
            return 2

    def action(store: Store) -> int:
        if args.action == "start":
            job = start_job(store, args.job_id, access=access)
        else:
            job = store.set_job_status(args.job_id, JobStatus.STOPPED)
        print(json.dumps(_job_json(job)) if args.json else f"{job.id}\t{job.status.value}")
        return 0

    return _run(args, action)
