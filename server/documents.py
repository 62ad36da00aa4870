"""Reading an untrusted job document with bounded cost: the one loader of the REST API and the
``dpfl-coordinator job submit`` command (``dpfl.server.jobs_control.submit_job`` calls it).

A job is a few hundred bytes, four or five levels deep. Before anything recursive touches a
document (PyYAML's composer, ``json``, pydantic), it is held to :data:`MAX_JOB_BYTES` and
:data:`MAX_JOB_DEPTH`: the YAML is first walked as a flat stream of parser events (libyaml when
installed, iterative either way), which also counts the nodes and refuses aliases (a job needs
none, and ``&a [*b, *b, ...]`` chains would make validation exponential). JSON is parsed by
``json`` (whose C scanner stops at Python's recursion limit) and then measured iteratively. The
problems of a refused document are capped too (:func:`bounded_problems`), so a client that
sends a megabyte of mistakes gets a short answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from dpfl.learning.jobs import JobSpecError

__all__ = [
    "MAX_JOB_BYTES",
    "MAX_JOB_DEPTH",
    "MAX_JOB_NODES",
    "MAX_PROBLEMS",
    "DocumentTooLargeError",
    "bounded_problems",
    "load_job_document",
]

#: Largest job document accepted, in bytes (the REST API answers 413 above it).
MAX_JOB_BYTES = 1 << 20
#: Deepest nesting of mappings and lists accepted (a job uses about five levels).
MAX_JOB_DEPTH = 32
#: Most scalars, mappings and lists in one document.
MAX_JOB_NODES = 100_000
#: Most problems reported for one document, and the longest line of each.
MAX_PROBLEMS = 20
_MAX_PROBLEM_CHARS = 300

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DocumentTooLargeError(JobSpecError):
    """A document over :data:`MAX_JOB_BYTES` (HTTP 413)."""


def _too_deep() -> JobSpecError:
    return JobSpecError(
        [f"job document nested too deeply: more than {MAX_JOB_DEPTH} levels of mappings and lists"]
    )


def _too_many() -> JobSpecError:
    return JobSpecError([f"job document too large: more than {MAX_JOB_NODES} values"])


def _check_yaml(text: str) -> None:
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent):
                raise JobSpecError(
                    ["job document uses a YAML alias (*name): write the value out instead"]
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_JOB_DEPTH:
                    raise _too_deep()
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            if isinstance(event, yaml.NodeEvent):
                nodes += 1
                if nodes > MAX_JOB_NODES:
                    raise _too_many()
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own limit (1000 levels)
            raise _too_deep() from None
        # any other syntax error comes before anything deeper than the limit; the loader below
        # reports it with its line and column


def _check_tree(data: Any) -> None:
    """Depth and size of an already-parsed document, without recursion."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_JOB_NODES:
            raise _too_many()
        if isinstance(value, Mapping):
            children: Iterable[Any] = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if depth > MAX_JOB_DEPTH:
            raise _too_deep()
        stack.extend((child, depth + 1) for child in children)


def load_job_document(
    document: str | bytes | Mapping[str, object], *, json_only: bool = False
) -> Mapping[str, object]:
    """The document as a mapping, within the bounds of this module.

    Args:
        document: YAML or JSON text (bytes are UTF-8), or an already-parsed mapping (checked for
            depth and size only).
        json_only: hold the text to JSON syntax (a body labelled ``application/json``).

    Raises:
        DocumentTooLargeError: more than :data:`MAX_JOB_BYTES`.
        JobSpecError: not UTF-8, bad syntax (with line and column), nested deeper than
            :data:`MAX_JOB_DEPTH`, more than :data:`MAX_JOB_NODES` values, a YAML alias, or not
            a mapping.
    """
    if isinstance(document, Mapping):
        _check_tree(document)
        return document
    size = len(document) if isinstance(document, bytes) else len(document.encode("utf-8"))
    if size > MAX_JOB_BYTES:
        raise DocumentTooLargeError(
            [f"job document too large: {size} bytes, the limit is {MAX_JOB_BYTES}"]
        )
    if isinstance(document, bytes):
        try:
            text = document.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JobSpecError([f"job document is not UTF-8 text: {exc.reason}"]) from None
    else:
        text = document
    data: Any
    if json_only or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except RecursionError:
            raise _too_deep() from None
        except json.JSONDecodeError as exc:
            raise JobSpecError(
                [f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"]
            ) from None
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            raise JobSpecError([f"invalid JSON: {exc}"]) from None
        _check_tree(data)
    else:
        _check_yaml(text)
        try:
            data = yaml.safe_load(text)  # the loader (and messages) of ``parse_job``
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise JobSpecError([f"invalid YAML{where}: {problem}"]) from None
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            raise JobSpecError([f"invalid YAML: {exc}"]) from None
    if not isinstance(data, Mapping):
        kind = "an empty document" if data is None else type(data).__name__
        if json_only:
            raise JobSpecError([f"a job must be a JSON object of fields, got {kind}"])
        raise JobSpecError([f"a job must be a mapping of fields, got {kind}"])
    return data


def bounded_problems(problems: Iterable[str]) -> list[str]:
    """At most :data:`MAX_PROBLEMS` lines, each at most a few hundred characters, and a last
    line counting the rest."""
    out: list[str] = []
    extra = 0
    for problem in problems:
        if len(out) < MAX_PROBLEMS:
            line = " ".join(str(problem).split())
            if len(line) > _MAX_PROBLEM_CHARS:
                line = line[: _MAX_PROBLEM_CHARS - 1] + "…"
            out.append(line)
        else:
            extra += 1
    if extra:
        out.append(f"… and {extra} more problem{'s' if extra != 1 else ''}")
    return out
