"""``dpfl audit``: one JSON line with ε_lower beside the ledger's ε; bad input is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpfl.cli.main import main

JOB = """\
name: audit-cli
algorithm: dp-fedsgd
data: {dataset: digits, partition: {scheme: iid}}
model: logreg
rounds: 1
privacy: {unit: record, target_epsilon: 4.0, delta: 1.0e-5}
params: {clip: 1.0, local_steps: 1, batch_sampling_rate: 1.0, learning_rate: 0.5}
"""


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    return path


def test_json_line(job_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", str(job_file), "--agents", "3", "--canaries", "100", "--json"])
    assert code == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    report = json.loads(line)
    assert report["job"] == "audit-cli"
    assert report["mode"] == "white-box"
    assert report["canaries"] == 100
    assert 0.0 <= report["epsilon_lower"] <= report["epsilon_upper"]
    assert report["epsilon_upper"] == pytest.approx(4.0, rel=0.01)


def test_text_output(job_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(job_file), "--agents", "3", "--canaries", "50"]) == 0
    out = capsys.readouterr().out
    assert "ε_lower" in out
    assert "ε_upper" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--canaries", "5000"], "distinct coordinates"),
        (["--confidence", "1.5"], "--confidence"),
        (["--canaries", "1"], "--canaries"),
    ],
)
def test_bad_input_is_named(
    job_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["audit", str(job_file), "--agents", "3", *extra]) == 2
    assert message in capsys.readouterr().err


def test_missing_job_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(tmp_path / "none.yaml"), "--agents", "3"]) == 2
    assert "error:" in capsys.readouterr().err


def test_database_url_stores_the_run_and_its_audit(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpfl.server.store import JobStatus, open_store

    url = f"sqlite:///{tmp_path / 'audits.db'}"
    argv = ["audit", str(job_file), "--agents", "3", "--canaries", "60", "--json"]
    assert main([*argv, "--database-url", url]) == 0
    report = json.loads(capsys.readouterr().out)
    stored = report["stored"]
    assert report["mu_lower"] >= 0.0
    assert report["epsilon_lower_gdp"] >= 0.0
    with open_store(url) as store:
        job = store.get_job(stored["job_id"])
        assert job.status == JobStatus.COMPLETED
        (audit,) = store.list_privacy_audits(job.id)
        assert audit.id == stored["audit_id"]
        assert audit.figures.epsilon_lower == report["epsilon_lower"]
        assert audit.figures.epsilon_upper == stored["epsilon_upper_ledger"]
        assert stored["epsilon_upper_ledger"] == max(store.job_epsilons(job.id).values())


def test_unreachable_database_is_named(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["audit", str(job_file), "--agents", "3", "--canaries", "20"]
    code = main([*argv, "--database-url", f"sqlite:///{tmp_path / 'missing' / 'dir' / 'x.db'}"])
    assert code == 2
    assert "could not store the audit" in capsys.readouterr().err
