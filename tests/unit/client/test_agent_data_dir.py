"""``dpfl-agent run --data-dir DIR``: the agent finds MNIST, Fashion-MNIST and USPS by the one
data-location rule (README, "Data"): ``--data-dir``, else ``$DPFL_DATA_DIR``, else an error
that says both ways, a missing folder named the way it was given (exit code 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpfl.client.cli.main import main as agent_main


def _run(tmp_path: Path, *extra: str) -> int:
    state = tmp_path / "state"
    return agent_main(
        ["run", "--coordinator", "127.0.0.1:1", "--state-dir", str(state), "--insecure", *extra]
    )


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())


def test_a_missing_data_dir_is_named_as_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert _run(tmp_path, "--data", "mnist", "--data-dir", str(missing)) == 2
    assert f"--data-dir {missing}: no such folder" in _err(capsys)


def test_without_a_folder_both_ways_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DPFL_DATA_DIR", raising=False)
    assert _run(tmp_path, "--data", "mnist#index=0&agents=10") == 2
    assert "give it with --data-dir DIR or set DPFL_DATA_DIR=DIR" in _err(capsys)


def test_data_dir_is_read_before_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data loads from --data-dir while $DPFL_DATA_DIR names nothing; the agent then stops
    at enrolment (no token: exit 4), past the data."""
    folder = os.environ.get("DPFL_DATA_DIR", "")
    if not (Path(folder) / "mnist").is_dir():
        pytest.skip(f"no MNIST under DPFL_DATA_DIR={folder!r}")
    monkeypatch.setenv("DPFL_DATA_DIR", str(tmp_path / "elsewhere"))
    assert _run(tmp_path, "--data", "mnist#index=0&agents=100", "--data-dir", folder) == 4
    assert "holds no enrolment yet" in _err(capsys)


def test_digits_needs_no_data_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DPFL_DATA_DIR", raising=False)
    assert _run(tmp_path, "--data", "digits") == 4
    assert "holds no enrolment yet" in _err(capsys)
