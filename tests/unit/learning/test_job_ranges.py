"""Every numeric field of a job document has a range a job can run in, and a boolean is not a
number (issue 29, item 4: ``rounds: 2**63`` and ``rounds: true`` (stored as 1), δ = 1e-320, a
target ε of 1e-300 or 1e308, ``clip: 1e308``, ``local_steps: 10**9`` and
``classes_per_agent: 10**9`` were all accepted).

The ranges come from ``dpfl.learning.jobs.FIELD_RANGES`` and each field's own constraint; the
table of docs/api.md#job-document-ranges lists them, and the OpenAPI schema carries them."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from support.paths import ROOT

from dpfl.learning.algorithms.registry import algorithm_names
from dpfl.learning.jobs import (
    FIELD_RANGES,
    JobSpecError,
    NumericField,
    job_json_schema,
    job_to_dict,
    numeric_fields,
    parse_job,
)

MINIMAL: dict[str, dict[str, Any]] = {
    "dp-fedavg": {"privacy": {"target_epsilon": 4.0}},
    "dp-fedsgd": {"privacy": {"noise_multiplier": 1.1}},
    "dp-fed-ls": {"privacy": {"target_epsilon": 4.0}},
    "dp-helmet": {"privacy": {"target_epsilon": 1.0}},
    "pate-fl": {"data": {"public_fraction": 0.1}, "params": {"sigma": 40.0}},
    "private-knn-fl": {"data": {"public_fraction": 0.1}, "privacy": {"target_epsilon": 2.0}},
}
FIELDS = numeric_fields()

#: What a field needs beside it: the discriminator of its union, the partition's scheme.
_CONTEXT: dict[str, dict[str, Any]] = {
    "data.partition.alpha": {"scheme": "dirichlet"},
    "data.partition.classes_per_agent": {"scheme": "shards"},
    "params.server_optimizer.epsilon": {"kind": "adam"},
    "params.server_optimizer.learning_rate": {"kind": "adam"},
    "params.server_optimizer.momentum": {"kind": "momentum"},
}


def document(field: NumericField, value: Any) -> dict[str, Any]:
    """A minimal document of the field's first algorithm with the field set to ``value``."""
    algorithm = field.algorithms[0]
    doc: dict[str, Any] = json.loads(json.dumps({"name": "j", "algorithm": algorithm}))
    doc.update(json.loads(json.dumps(MINIMAL[algorithm])))
    *parents, name = field.path.split(".")
    node = doc
    for i, parent in enumerate(parents):
        node = node.setdefault(parent, {})
        node.update(_CONTEXT.get(".".join(parents[: i + 1]) + "." + name, {}))
    if field.path.startswith("data.public.") and "public_fraction" in doc.get("data", {}):
        del doc["data"]["public_fraction"]
    node[name] = value
    return doc


def problems(doc: dict[str, Any]) -> list[str]:
    try:
        parse_job(doc)
    except JobSpecError as exc:
        return list(exc.problems)
    return []


def named(field: NumericField, found: list[str]) -> list[str]:
    return [p for p in found if p.startswith(f"{field.path}: must be")]


def test_every_numeric_field_has_a_finite_range() -> None:
    assert {f.path for f in FIELDS} >= {"rounds", "privacy.delta", "params.clip"}
    assert set().union(*(f.algorithms for f in FIELDS)) == set(algorithm_names())
    for field in FIELDS:
        assert field.low is not None, field
        assert field.high is not None, field
        assert math.isfinite(field.low), field
        assert math.isfinite(field.high), field
        assert field.low <= field.high, field


def test_every_range_holds_its_default() -> None:
    for algorithm in algorithm_names():
        parse_job({"name": "j", "algorithm": algorithm, **MINIMAL[algorithm]})
    for field in FIELDS:
        for algorithm in field.algorithms:
            value: Any = job_to_dict(
                parse_job({"name": "j", "algorithm": algorithm, **MINIMAL[algorithm]})
            )
            for part in field.path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(value, int | float):
                assert (field.low or 0) <= value <= (field.high or 0), (algorithm, field.path)


def _beyond(field: NumericField) -> list[float]:
    assert field.low is not None
    assert field.high is not None
    step = 1 if field.integer else 0
    low = field.low if field.low_open else (field.low - step if step else field.low / 2 - 1e-300)
    high = field.high if field.high_open else (field.high + step if step else field.high * 2)
    if field.low == 0 and not field.low_open and not step:
        low = -1e-9
    return [int(low) if step else low, int(high) if step else high]


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.path)
def test_beyond_either_end_is_refused_naming_the_field(field: NumericField) -> None:
    for value in _beyond(field):
        assert named(field, problems(document(field, value))), (field.path, value)


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.path)
def test_either_closed_end_is_in_range(field: NumericField) -> None:
    assert field.low is not None
    assert field.high is not None
    for value, is_open in ((field.low, field.low_open), (field.high, field.high_open)):
        if not is_open:
            chosen = int(value) if field.integer else value
            assert not named(field, problems(document(field, chosen))), (field.path, chosen)


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.path)
def test_a_boolean_is_not_a_number(field: NumericField) -> None:
    for value in (True, False):
        expected = f"{field.path}: must be a number, not a boolean (got {str(value).lower()})"
        assert expected in problems(document(field, value)), field.path


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"rounds": 2**63}, "rounds: must be <= 100000 (got 9223372036854775808)"),
        ({"rounds": 1e30}, "rounds: "),
        ({"rounds": True}, "rounds: must be a number, not a boolean (got true)"),
        ({"privacy": {"delta": 1e-320}}, "privacy.delta: must be >= 1e-30"),
        ({"privacy": {"target_epsilon": 1e-300}}, "privacy.target_epsilon: must be >= 0.001"),
        ({"privacy": {"target_epsilon": 1e308}}, "privacy.target_epsilon: must be <= 1000"),
        ({"params": {"clip": 1e308}}, "params.clip: must be <= 1e+06 (got 1e+308)"),
        ({"params": {"local_steps": 10**9}}, "params.local_steps: must be <= 10000"),
        (
            {"data": {"partition": {"scheme": "shards", "classes_per_agent": 10**9}}},
            "data.partition.classes_per_agent: must be <= 1000",
        ),
        ({"seed": -1}, "seed: must be >= 0 (got -1)"),
        (
            {"params": {"adaptive_clipping": {"count_noise": 1e300}}},
            "params.adaptive_clipping.count_noise: must be <= 1e+06 (got 1e+300)",
        ),
    ],
)
def test_the_issues_documents_are_refused(changes: dict[str, Any], expected: str) -> None:
    doc: dict[str, Any] = {"name": "j", "algorithm": "dp-fedavg", "privacy": {"delta": 1e-5}}
    doc["privacy"]["target_epsilon"] = 4.0
    for key, value in changes.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    found = problems(doc)
    assert any(p.startswith(expected) for p in found), found
    # the JSON text reads the same (JSON has no integer limit; 1e30 is a float)
    assert problems(json.loads(json.dumps(doc))) == found


def test_a_boolean_is_not_a_number_in_a_tuple_either() -> None:
    doc = {"name": "j", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}}
    doc["params"] = {"server_optimizer": {"kind": "adam", "betas": [False, 0.9]}}
    assert problems(doc) == [
        "params.server_optimizer.betas.0: must be a number, not a boolean (got false)"
    ]


def test_yaml_booleans_and_exponents() -> None:
    text = "name: j\nalgorithm: dp-fedavg\nprivacy: {target_epsilon: 4}\nrounds: yes\n"
    assert problems_of(text) == ["rounds: must be a number, not a boolean (got true)"]
    text = "name: j\nalgorithm: dp-fedavg\nprivacy: {target_epsilon: 1e-300, delta: 1e-320}\n"
    assert problems_of(text) == [
        "privacy.delta: must be >= 1e-30 (got 9.99989e-321)",
        "privacy.target_epsilon: must be >= 0.001 (got 1e-300)",
    ]


def problems_of(text: str) -> list[str]:
    with pytest.raises(JobSpecError) as info:
        parse_job(text)
    return list(info.value.problems)


def test_the_schema_carries_the_ranges() -> None:
    schema = job_json_schema()
    defs = schema["$defs"]

    def bounds(model: str, name: str) -> tuple[Any, Any]:
        prop = defs[model]["properties"][name]
        node = next((n for n in [prop, *prop.get("anyOf", [])] if "type" in n), prop)
        low = node.get("minimum", node.get("exclusiveMinimum"))
        return low, node.get("maximum", node.get("exclusiveMaximum"))

    rounds = {bounds(m, "rounds") for m in defs if "rounds" in defs[m].get("properties", {})}
    assert rounds == {(1, 100_000)}
    assert bounds("PrivacySpec", "delta") == (1e-30, 1)
    assert bounds("DpFedAvgParams", "clip") == (1e-6, 1e6)
    assert bounds("AdaptiveClipping", "count_noise")[1] == 1e6
    assert set(FIELD_RANGES) <= {name for d in defs.values() for name in d.get("properties", {})}, (
        "a range for a field no job has"
    )


def _range(field: NumericField) -> str:
    def text(value: float | None) -> str:
        assert value is not None
        return str(int(value)) if field.integer or value == int(value) else f"{value:g}"

    low = ("(" if field.low_open else "[") + text(field.low)
    return f"{low}, {text(field.high)}" + (")" if field.high_open else "]")


def table_row(field: NumericField) -> str:
    """The first four columns of the field's row in docs/api.md."""
    algorithms = set(field.algorithms)
    shown = "all" if algorithms == set(algorithm_names()) else ", ".join(sorted(algorithms))
    kind = "integer" if field.integer else "number"
    return f"| `{field.path}` | {kind} | {_range(field)} | {shown} |"


def test_docs_list_every_range() -> None:
    lines = (ROOT / "docs" / "api.md").read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if line.startswith("| `") and line.count("|") == 6]
    for field in FIELDS:
        row = table_row(field)
        assert sum(line.startswith(row) for line in rows) == 1, row
