"""``dpfl audit``'s default number of canaries fits the job it is given (issue 36, item 9):
1000, or one per coordinate of the released vector when it has fewer (digits' logreg: 650),
for record canaries and for agent canaries; too many canaries asked for name the
``--canaries`` that would work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.paths import ROOT

from dpfl.cli.main import main
from dpfl.learning.audit import DEFAULT_CANARIES, canary_capacity

DEMO = ROOT / "examples" / "demo-dpfedavg.yaml"
FEDSGD = """\
name: audit-default
algorithm: dp-fedsgd
data: {dataset: digits, partition: {scheme: iid}}
model: logreg
rounds: 1
privacy: {unit: record, target_epsilon: 4.0, delta: 1.0e-5}
params: {clip: 1.0, local_steps: 1, batch_sampling_rate: 1.0, learning_rate: 0.5}
"""
LOGREG_DIGITS = 64 * 10 + 10  # the released vector: the model's weights and biases


def audit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_capacity_is_one_canary_per_coordinate() -> None:
    assert canary_capacity(LOGREG_DIGITS) == 650
    assert canary_capacity(LOGREG_DIGITS, [3, 3, 7]) == 2
    assert DEFAULT_CANARIES == 1000


def test_record_canaries_default_to_what_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "fedsgd.yaml"
    job.write_text(FEDSGD)
    code, out, err = audit(capsys, str(job), "--agents", "3", "--json")
    assert code == 0, err
    assert json.loads(out)["canaries"] == LOGREG_DIGITS


@pytest.mark.slow
def test_the_demo_job_audits_with_its_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's command, `dpfl audit examples/demo-dpfedavg.yaml --agents 50 --json`, on the
    demo job cut to 2 rounds (the canary design and the vector are the demo's; 10 rounds take
    about 50 s more)."""
    document = yaml.safe_load(DEMO.read_text())
    document["rounds"] = 2
    job = tmp_path / "demo.yaml"
    job.write_text(yaml.safe_dump(document))
    code, out, err = audit(capsys, str(job), "--agents", "50", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["unit"], report["canaries"]) == ("agent", LOGREG_DIGITS)
    assert 0.0 <= report["epsilon_lower"] <= report["epsilon_upper"] <= 4.0


def test_too_many_canaries_name_the_flag_that_works(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = audit(capsys, str(DEMO), "--agents", "50", "--canaries", "1000")
    assert code == 2
    assert "1000 canaries need 1000 distinct coordinates" in err
    assert f"pass --canaries {LOGREG_DIGITS} or fewer" in err
