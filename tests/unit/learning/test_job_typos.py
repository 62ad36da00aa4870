"""A misspelt key of a job document names the closest key known at that place (issue 36, item
8): ``round:`` gets "did you mean 'rounds'?", at every depth, through discriminated unions
(the algorithm, the partition scheme), and only when a known key is close."""

from __future__ import annotations

import pytest

from dpfl.learning.jobs import JobSpecError, parse_job

BASE = "name: typo\nalgorithm: dp-fedavg\nprivacy: {noise_multiplier: 1.0}\n"


def problems(yaml_text: str) -> list[str]:
    with pytest.raises(JobSpecError) as info:
        parse_job(yaml_text)
    return list(info.value.problems)


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ("round: 3\n", "round: unknown field (did you mean 'rounds'?)"),
        ("modle: logreg\n", "modle: unknown field (did you mean 'model'?)"),
        ("params: {clipp: 1.0}\n", "params.clipp: unknown field (did you mean 'clip'?)"),
        ("secagg: {enabeld: true}\n", "secagg.enabeld: unknown field (did you mean 'enabled'?)"),
        (
            "data: {partition: {scheme: shards, clases_per_agent: 3}}\n",
            "data.partition.clases_per_agent: unknown field (did you mean 'classes_per_agent'?)",
        ),
        (
            "data: {dataset: digits, public: {source: train, fracton: 0.1}}\n",
            "data.public.fracton: unknown field (did you mean 'fraction'?)",
        ),
    ],
)
def test_a_typo_names_the_closest_known_key(extra: str, line: str) -> None:
    assert line in problems(BASE + extra)


def test_the_suggestion_is_a_key_of_that_place_only() -> None:
    # 'rounds' is a top-level key: under privacy it is not suggested
    (line,) = problems(BASE.replace("noise_multiplier: 1.0", "noise_multiplier: 1.0, round: 3"))
    assert line.startswith("privacy.round: unknown field")
    assert "rounds" not in line
    (line,) = problems(BASE + "colour: red\n")
    assert line == "colour: unknown field"
    # another algorithm's own parameter is suggested from that algorithm's params
    pate = "name: t\nalgorithm: pate-fl\ndata: {public_fraction: 0.2}\nparams: {sigmaa: 40}\n"
    assert "params.sigmaa: unknown field (did you mean 'sigma'?)" in problems(pate)
