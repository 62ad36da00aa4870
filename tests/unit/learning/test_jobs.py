"""Job specifications: the issue's example validates as written, every algorithm has runnable
defaults, and every kind of mistake gets a message naming the field and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.paths import ROOT

from dpfl.learning.algorithms.dp_fedavg import DpFedAvgJob
from dpfl.learning.algorithms.pate_fl import PateFlJob
from dpfl.learning.algorithms.registry import algorithm_names
from dpfl.learning.jobs import (
    JobSpecError,
    PublicSpec,
    ShardsPartition,
    job_to_dict,
    load_job,
    parse_job,
)

ALGORITHMS = algorithm_names()

EXAMPLES = ROOT / "examples"

#: The smallest valid document of each algorithm (noise given one way or the other).
MINIMAL: dict[str, dict[str, Any]] = {
    "dp-fedavg": {"privacy": {"target_epsilon": 4.0}},
    "dp-fedsgd": {"privacy": {"noise_multiplier": 1.1}},
    "dp-fed-ls": {"privacy": {"target_epsilon": 4.0}},
    "dp-helmet": {"privacy": {"target_epsilon": 1.0}},
    "pate-fl": {"data": {"public_fraction": 0.1}, "params": {"sigma": 40.0}},
    "private-knn-fl": {"data": {"public_fraction": 0.1}, "privacy": {"target_epsilon": 2.0}},
}


def job(algorithm: str, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": "j", "algorithm": algorithm, **MINIMAL[algorithm]}
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


def problems(source: Any) -> str:
    with pytest.raises(JobSpecError) as info:
        parse_job(source)
    return str(info.value)


def test_the_issue_example_validates_exactly_as_written() -> None:
    spec = load_job(EXAMPLES / "demo-dpfedavg.yaml")
    assert isinstance(spec, DpFedAvgJob)
    assert spec.name == "demo-dpfedavg"
    assert spec.data.dataset == "digits"
    assert spec.data.partition == ShardsPartition(scheme="shards", classes_per_agent=3)
    assert spec.data.public is None
    assert spec.data.test_rule == "split"
    assert spec.model == "logreg"
    assert spec.rounds == 10
    assert (spec.privacy.unit, spec.privacy.delta, spec.privacy.target_epsilon) == (
        "agent",
        1e-5,
        4.0,
    )
    assert (spec.privacy.honest_fraction, spec.privacy.noise) == (1.0, "skellam")
    assert (spec.secagg.enabled, spec.secagg.corrupt_fraction, spec.secagg.dropout_fraction) == (
        True,
        0.05,
        0.05,
    )
    p = spec.params
    assert (p.clip, p.sampling_rate, p.local_steps, p.learning_rate) == (1.0, 1.0, 5, 0.5)


def test_the_pate_example_validates() -> None:
    spec = load_job(EXAMPLES / "demo-pate-fl.yaml")
    assert isinstance(spec, PateFlJob)
    assert spec.data.public == PublicSpec(source="train", fraction=0.2)
    assert spec.params.queries == 200
    assert spec.privacy.unit == "record"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_has_runnable_defaults_and_round_trips(algorithm: str) -> None:
    spec = parse_job(job(algorithm))
    assert spec.algorithm == algorithm
    data = job_to_dict(spec)
    assert parse_job(data) == spec
    import json

    assert parse_job(json.dumps(data)) == spec  # JSON text as well as YAML


def test_the_params_names_of_the_issues_exist() -> None:
    names = {
        "dp-fedavg": {"clip", "sampling_rate", "local_steps", "learning_rate"},
        "dp-fedsgd": {"clip", "local_steps", "batch_sampling_rate", "learning_rate"},
        "dp-fed-ls": {"clip", "sampling_rate", "local_steps", "learning_rate", "sigma_ls"}
        | {"client_sampling"},
        "dp-helmet": {"regularization", "radius", "huber_h", "input_clip", "epochs", "loss"}
        | {"features"},
        "pate-fl": {"queries", "sigma", "teacher_epochs", "student_epochs"},
        "private-knn-fl": {"queries", "k", "sigma"},
    }
    for algorithm, expected in names.items():
        params = job_to_dict(parse_job(job(algorithm)))["params"]
        assert expected <= set(params), algorithm


def test_shorthand_partition_and_yaml_exponents() -> None:
    spec = parse_job(
        "name: j\nalgorithm: dp-fedavg\ndata: {partition: dirichlet}\n"
        "privacy: {delta: 1e-6, target_epsilon: 2}\n"
    )
    assert spec.data.partition.scheme == "dirichlet"
    assert spec.privacy.delta == 1e-6  # PyYAML reads 1e-6 as a string; pydantic converts it


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (job("dp-fedavg", privacy={"target_epsilon": -1.0}), "privacy.target_epsilon: must be > 0"),
        (job("dp-fedavg", privacy={"delta": 1.0}), "privacy.delta: must be < 1"),
        (job("dp-fedavg", privacy={"delta": 0}), "privacy.delta: must be > 0"),
        (job("dp-fedavg", privacy={"honest_fraction": 0}), "privacy.honest_fraction: must be > 0"),
        (
            job("dp-fedavg", privacy={"honest_fraction": 1.5}),
            "privacy.honest_fraction: must be <= 1",
        ),
        (job("dp-fedavg", params={"clip": 0}), "params.clip: must be > 0"),
        (job("dp-fedavg", params={"sampling_rate": 0}), "params.sampling_rate: must be > 0"),
        (job("dp-fedavg", params={"sampling_rate": 1.2}), "params.sampling_rate: must be <= 1"),
        (job("dp-fedavg", rounds=0), "rounds: must be >= 1"),
        (job("dp-fedavg", params={"clip": 1, "clipp": 2}), "params.clipp: unknown field"),
        (job("dp-fedavg", colour="red"), "colour: unknown field"),
        (job("dp-fedavg", privacy={"noise": "laplace"}), "privacy.noise: must be one of"),
        (job("dp-fedavg", privacy={"target_epsilon": "nan"}), "must be a finite number"),
        (job("dp-fedavg", privacy={"unit": "record"}), "privacy.unit: dp-fedavg protects agent"),
        (job("dp-fedsgd", privacy={"unit": "agent"}), "privacy.unit: dp-fedsgd protects record"),
        (job("dp-fedsgd", params={"batch_sampling_rate": 0}), "params.batch_sampling_rate"),
        (job("dp-fedsgd", privacy={"accounting": "exact"}), "privacy.accounting: must be one of"),
        (
            job("dp-fedavg", privacy={"accounting": "sum-dominating"}),
            "privacy.accounting: 'sum-dominating' applies to dp-fedsgd only",
        ),
        (
            job("pate-fl", privacy={"accounting": "sum-dominating"}),
            "privacy.accounting: 'sum-dominating' applies to dp-fedsgd only",
        ),
        (
            job("dp-fedsgd", privacy={"accounting": "sum-dominating"}, secagg={"enabled": False}),
            "privacy.accounting: 'sum-dominating' needs secure aggregation",
        ),
        (
            job("dp-fedsgd", privacy={"accounting": "sum-dominating"}, params={"local_steps": 1}),
            "privacy.accounting: 'sum-dominating' means nothing with params.local_steps = 1",
        ),
        (job("dp-fed-ls", params={"client_sampling": "x"}), "params.client_sampling"),
        (job("dp-fed-ls", params={"sigma_ls": -1}), "params.sigma_ls: must be >= 0"),
        (job("dp-helmet", rounds=3), "rounds: dp-helmet is one-shot: must be 1"),
        (job("dp-helmet", params={"loss": "hinge"}), "params.loss: must be one of"),
        (job("pate-fl", data={"public_fraction": 0.0}), "data.public: pate-fl needs a public pool"),
        (job("pate-fl", params={"sigma": None}), "privacy: set params.sigma"),
        (job("pate-fl", rounds=300), "params.queries: must be >= rounds"),
        (job("private-knn-fl", params={"k": 0}), "params.k: must be >= 1"),
        (job("dp-fedavg", privacy={"target_epsilon": None}), "privacy: set privacy.noise_mult"),
        (job("dp-fedavg", data={"dataset": "imagenet"}), "data.dataset: unknown dataset"),
        (job("dp-fedavg", data={"partition": {"scheme": "x"}}), "data.partition.scheme: unknown"),
        (job("dp-fedavg", data={"test_fraction": 0.5, "public_fraction": 0.5}), "data: public"),
        (job("dp-fedavg", secagg={"corrupt_fraction": 0.6}), "secagg.corrupt_fraction"),
        (
            job("dp-fedavg", secagg={"threat_model": "byzantine"}),
            "secagg.threat_model: must be one of 'semi-honest', 'semi-malicious' or 'malicious'",
        ),
        (job("dp-fedavg", name="has space"), "name: must be 1-64 characters"),
        ({"name": "j", "algorithm": "dp-fedavgg"}, "algorithm: unknown algorithm 'dp-fedavgg'"),
        ({"name": "j"}, "algorithm: required field is missing"),
        ({"algorithm": "dp-fedavg", "privacy": {"target_epsilon": 1}}, "name: required field"),
        ({"name": "j", "algorithm": 3}, "algorithm: must be one of"),
        ("name: j\nalgorithm: [dp-fedavg\n", "invalid YAML at line"),
        ('{"name": "j", ', "invalid JSON at line 1"),
        ("- a\n- b\n", "a job must be a mapping of fields, got list"),
        ("", "got an empty document"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_mistakes_are_named(document: Any, expected: str) -> None:
    assert expected in problems(document)


def test_threat_models_map_onto_the_secagg_solver() -> None:
    from dpfl.secagg import ThreatModel

    for name in ("semi-honest", "semi-malicious", "malicious"):
        spec = parse_job(job("dp-fedavg", secagg={"threat_model": name}))
        assert ThreatModel(spec.secagg.threat_model).value == name


def test_all_problems_are_reported_at_once() -> None:
    error = problems(job("dp-fedavg", params={"clip": -1, "local_steps": 0}))
    assert "params.clip" in error
    assert "params.local_steps" in error


def test_load_job_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: j\nalgorithm: dp-fedavg\nprivacy: {target_epsilon: -2}\n")
    with pytest.raises(JobSpecError, match=r"bad\.yaml: privacy\.target_epsilon: must be > 0"):
        load_job(path)
    with pytest.raises(JobSpecError, match="cannot read job file"):
        load_job(tmp_path / "missing.yaml")


def test_specs_are_frozen() -> None:
    spec = parse_job(job("dp-fedavg"))
    with pytest.raises(ValueError, match="frozen"):
        spec.rounds = 3  # type: ignore[misc]


def test_job_errors_belong_to_the_learning_family() -> None:
    from dpfl.learning.errors import LearningError

    assert issubclass(JobSpecError, LearningError)
    assert issubclass(JobSpecError, ValueError)


def test_default_unit_follows_the_algorithm() -> None:
    assert parse_job(job("dp-fedsgd")).privacy.unit == "record"
    assert parse_job(job("dp-fedavg")).privacy.unit == "agent"
    assert (
        parse_job(
            {"name": "j", "algorithm": "dp-fedsgd", "privacy": None} | MINIMAL["dp-fedsgd"]
        ).privacy.unit
        == "record"
    )


def test_accounting_is_provable_unless_a_fedsgd_job_opts_in() -> None:
    for algorithm in ALGORITHMS:
        assert parse_job(job(algorithm)).privacy.accounting == "provable"
    opted = parse_job(job("dp-fedsgd", privacy={"accounting": "sum-dominating"}))
    assert opted.privacy.accounting == "sum-dominating"
    assert parse_job(job_to_dict(opted)) == opted
