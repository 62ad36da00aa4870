"""``dpfl recipe`` without a search: each field the job leaves to defaults with the value it
takes, and, where that value is null, what the null stands for (5 local steps, FedAvgM at rate
1 and momentum 0.8, a σ calibrated to the target ε...), never a bare ``null``."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from dpfl.cli.main import main
from dpfl.learning.algorithms.dp_fedavg import DEFAULT_LOCAL_STEPS, DEFAULT_SERVER_MOMENTUM
from dpfl.learning.algorithms.registry import algorithms

PLAIN: dict[str, Any] = {
    "name": "plain",
    "algorithm": "dp-fedavg",
    "data": {"dataset": "digits", "partition": {"scheme": "shards", "classes_per_agent": 3}},
    "rounds": 5,
    "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 4.0},
}


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds: its type, or the members of its union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for member in typing.get_args(annotation) for m in _models(member)]


def _undescribed_nulls(model: type[BaseModel], prefix: str) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        if field.default is None and field.description is None:
            out.append(prefix + name)
        for inner in _models(field.annotation):
            out += _undescribed_nulls(inner, f"{prefix}{name}.")
    return out


@pytest.mark.parametrize("name", sorted(algorithms()))
def test_every_null_default_of_every_algorithm_says_what_it_stands_for(name: str) -> None:
    params = algorithms()[name].spec_type.model_fields["params"].annotation
    assert isinstance(params, type)
    assert issubclass(params, BaseModel)
    assert _undescribed_nulls(params, "params.") == []


def _recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str], document: dict[str, Any]) -> Any:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document), encoding="utf-8")
    assert main(["recipe", str(job), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["recipe", str(job)]) == 0
    return summary, capsys.readouterr().out


def test_a_plain_job_is_told_what_its_null_defaults_stand_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary, text = _recipe(tmp_path, capsys, PLAIN)
    means = summary["null_means"]
    assert summary["defaults"]["params.local_steps"] is None
    steps = f"null: {DEFAULT_LOCAL_STEPS}, unless local_epochs is given"
    assert means["params.local_steps"] == steps
    assert means["params.server_momentum"].startswith(f"null: {DEFAULT_SERVER_MOMENTUM} ")
    assert means["params.adaptive_clipping"] == "null: off, every round clips at clip"
    assert set(means) == {p for p, v in summary["defaults"].items() if v is None}
    assert steps in text
    assert "│ null " not in text
    assert "│ null│" not in text


def test_a_field_the_job_sets_or_a_default_that_is_not_null_has_no_meaning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = {**PLAIN, "params": {"local_epochs": 2, "server_momentum": 0.5}}
    summary, _ = _recipe(tmp_path, capsys, document)
    means = summary["null_means"]
    assert "params.local_epochs" not in summary["defaults"]
    assert "params.local_epochs" not in means
    assert "params.server_momentum" not in means
    assert "params.learning_rate" not in means  # 0.1, not null
    assert means["params.local_steps"].startswith("null: ")
