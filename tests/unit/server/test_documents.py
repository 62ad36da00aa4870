"""The bounded job-document loader shared by ``POST /api/v1/jobs`` and ``dpfl-coordinator job
submit``: deep nesting, aliases, size and the length of the error report."""

from __future__ import annotations

import json

import pytest

from dpfl.learning.jobs import JobSpecError
from dpfl.server.documents import (
    MAX_JOB_BYTES,
    MAX_JOB_DEPTH,
    MAX_PROBLEMS,
    DocumentTooLargeError,
    bounded_problems,
    load_job_document,
)


def _nested_yaml(depth: int) -> str:
    return "name: x\nalgorithm: dp-fedavg\nextra: " + "[" * depth + "]" * depth + "\n"


def _nested_json(depth: int) -> str:
    return '{"name": "x", "algorithm": "dp-fedavg", "extra": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [MAX_JOB_DEPTH + 1, 500, 5000, 100_000])
@pytest.mark.parametrize("make", [_nested_yaml, _nested_json], ids=["yaml", "json"])
def test_deep_nesting_is_one_problem(depth: int, make: object) -> None:
    text = make(depth)  # type: ignore[operator]
    with pytest.raises(JobSpecError) as info:
        load_job_document(text.encode())
    assert info.value.problems == (
        f"job document nested too deeply: more than {MAX_JOB_DEPTH} levels of mappings and lists",
    )


def test_block_style_nesting_is_caught_too() -> None:
    text = "name: x\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(600)) + "  " * 600 + "v: 1\n"
    with pytest.raises(JobSpecError, match="nested too deeply"):
        load_job_document(text)


def test_nesting_within_the_limit_still_parses() -> None:
    data = load_job_document(_nested_json(MAX_JOB_DEPTH - 1))
    assert data["name"] == "x"
    data = load_job_document(_nested_yaml(MAX_JOB_DEPTH - 1))
    assert data["algorithm"] == "dp-fedavg"


def test_parsed_mappings_are_held_to_the_same_depth() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(2000):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    with pytest.raises(JobSpecError, match="nested too deeply"):
        load_job_document({"name": "x", "extra": deep})


def test_yaml_aliases_are_refused() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
    with pytest.raises(JobSpecError, match="YAML alias"):
        load_job_document(bomb)


def test_too_many_values() -> None:
    with pytest.raises(JobSpecError, match="more than 100000 values"):
        load_job_document(json.dumps({"name": "x", "extra": [0] * 200_000}))


def test_size_limit() -> None:
    with pytest.raises(DocumentTooLargeError, match=f"the limit is {MAX_JOB_BYTES}"):
        load_job_document(b"#" * (MAX_JOB_BYTES + 1))


def test_huge_integers_are_a_problem_not_a_crash() -> None:
    with pytest.raises(JobSpecError, match="invalid JSON"):
        load_job_document('{"name": ' + "9" * 10_000 + "}")


def test_bounded_problems() -> None:
    lines = bounded_problems([f"f{i}: unknown field " + "y" * 1000 for i in range(5000)])
    assert len(lines) == MAX_PROBLEMS + 1
    assert lines[-1] == "… and 4980 more problems"
    assert all(len(line) <= 300 for line in lines)
    assert bounded_problems(["one"]) == ["one"]
