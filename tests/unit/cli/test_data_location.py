"""One data-location rule (issue 36, item 5): ``--data-dir``/``data_dir=``, else
``$DPFL_DATA_DIR``, else an error; a missing folder is a usage error (exit code 2) that names the
folder the way the user gave it, before any agent starts, never an option the user did not pass
(``--data mnist#index=0&...``). The tests' own fallback (``../shared/data``) makes the public
pool tests run under ``make test``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import ROOT, SHARED_DATA

import dpfl
from dpfl.cli.main import main
from dpfl.learning.data.images import locate_data_dir
from dpfl.learning.errors import DatasetError
from dpfl.learning.jobs import parse_job
from dpfl.simulation.data_location import job_file_datasets, locate_job_data

MNIST_JOB: dict[str, Any] = {
    "name": "mnist-data-dir",
    "algorithm": "dp-fedavg",
    "data": {"dataset": "mnist", "public": {"source": "usps", "count": 100}},
    "model": "logreg",
    "rounds": 1,
    "privacy": {"unit": "agent", "noise_multiplier": 1.0},
}


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(MNIST_JOB))
    return path


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPFL_DATA_DIR", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_which_data_sets_a_job_reads_from_files() -> None:
    assert job_file_datasets(parse_job(MNIST_JOB)) == ("mnist", "usps")
    digits = {**MNIST_JOB, "data": {"dataset": "digits", "public_fraction": 0.1}}
    assert job_file_datasets(parse_job(digits)) == ()
    assert locate_job_data(parse_job(digits), "/nowhere", given_as="--data-dir") is None


@pytest.mark.usefixtures("no_env")
@pytest.mark.parametrize("command", ["simulate", "audit"])
def test_no_folder_names_both_ways_and_exits_2(
    command: str, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(capsys, command, str(job_file), "--agents", "3")
    assert code == 2, err
    assert "--data-dir DIR" in err
    assert "DPFL_DATA_DIR" in err
    assert "'mnist', 'usps'" in err
    assert "--data " not in err  # no option the user never passed


@pytest.mark.usefixtures("no_env")
@pytest.mark.parametrize("command", ["simulate", "audit"])
def test_a_missing_data_dir_is_named_as_typed(
    command: str, job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-folder"
    code, err = run(capsys, command, str(job_file), "--agents", "3", "--data-dir", str(missing))
    assert code == 2, err
    assert f"--data-dir {missing}: no such folder" in err
    assert "DPFL_DATA_DIR=" not in err

    (tmp_path / "data" / "mnist").mkdir(parents=True)  # mnist/ but no usps/
    code, err = run(
        capsys, command, str(job_file), "--agents", "3", "--data-dir", str(tmp_path / "data")
    )
    assert code == 2, err
    assert f"--data-dir {tmp_path / 'data'}: it holds no usps/ folder" in err


def test_a_missing_environment_folder_is_named_as_set(
    job_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DPFL_DATA_DIR", str(tmp_path / "gone"))
    code, err = run(capsys, "simulate", str(job_file), "--agents", "3")
    assert code == 2, err
    assert f"DPFL_DATA_DIR={tmp_path / 'gone'}: no such folder" in err
    assert "--data-dir" not in err.split(":")[1]


def test_the_python_api_names_its_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DPFL_DATA_DIR", raising=False)
    with pytest.raises(DatasetError, match=r"data_dir='.*missing': no such folder"):
        dpfl.simulate(MNIST_JOB, 3, data_dir=tmp_path / "missing")
    with pytest.raises(DatasetError, match=r"set DPFL_DATA_DIR to it \(or pass data_dir\)"):
        dpfl.simulate(MNIST_JOB, 3)
    assert "DPFL_DATA_DIR" not in os.environ  # restored after the call


def test_the_flag_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine" / "mnist").mkdir(parents=True)
    (tmp_path / "env").mkdir()
    monkeypatch.setenv("DPFL_DATA_DIR", str(tmp_path / "env"))
    found = locate_data_dir(tmp_path / "mine", given_as="--data-dir", needs=("mnist",))
    assert found.path == tmp_path / "mine"
    assert found.origin == f"--data-dir {tmp_path / 'mine'}"
    from_env = locate_data_dir(None, given_as="--data-dir")
    assert (from_env.path, from_env.origin) == (
        tmp_path / "env",
        f"DPFL_DATA_DIR={tmp_path / 'env'}",
    )


@pytest.mark.slow
def test_make_test_runs_the_public_pool_tests_when_the_data_is_beside_the_repository() -> None:
    """Without ``$DPFL_DATA_DIR`` (as ``make test`` runs), the two MNIST→USPS public pool tests
    find ``../shared/data`` through tests/conftest.py and run instead of skipping."""
    if not (SHARED_DATA / "mnist").is_dir() or not (SHARED_DATA / "usps").is_dir():
        pytest.skip(f"the shared offline data is not at {SHARED_DATA}")
    env = {k: v for k, v in os.environ.items() if k != "DPFL_DATA_DIR"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/unit/learning/test_public_pool.py",
            "-k",
            "usps_pool",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
    assert "skipped" not in done.stdout
