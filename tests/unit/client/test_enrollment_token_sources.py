"""Where ``dpfl-agent run`` takes its one-time enrolment token from: the flag, a file, or
``$DPFL_ENROLLMENT_TOKEN`` (the last two keep it out of process listings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpfl.client.cli.main import main as agent_main
from dpfl.client.cli.run import TOKEN_ENV, EnrollmentTokenError, enrollment_token


def test_precedence_flag_file_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "token"
    file.write_text("  dpfl_enroll_from_file  \n# comment\n")
    monkeypatch.setenv(TOKEN_ENV, "dpfl_enroll_from_env")
    assert enrollment_token("dpfl_enroll_flag", None) == "dpfl_enroll_flag"
    assert enrollment_token(None, file) == "dpfl_enroll_from_file"
    assert enrollment_token(None, None) == "dpfl_enroll_from_env"
    monkeypatch.delenv(TOKEN_ENV)
    assert enrollment_token(None, None) is None


def test_unusable_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n \n")
    with pytest.raises(EnrollmentTokenError, match="is empty"):
        enrollment_token(None, empty)
    with pytest.raises(EnrollmentTokenError, match="cannot read the enrolment token file"):
        enrollment_token(None, tmp_path / "missing")


def test_the_cli_refuses_an_unreadable_token_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = agent_main(
        [
            "run",
            "--coordinator",
            "127.0.0.1:1",
            "--data",
            "digits",
            "--state-dir",
            str(tmp_path / "s"),
            "--insecure",
            "--enrollment-token-file",
            str(tmp_path / "missing"),
        ]
    )
    assert code == 4
    assert "cannot read the enrolment token file" in capsys.readouterr().err


def test_flag_and_file_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        agent_main(
            [
                "run",
                "--coordinator",
                "x:1",
                "--data",
                "digits",
                "--state-dir",
                str(tmp_path),
                "--enrollment-token",
                "a",
                "--enrollment-token-file",
                "b",
            ]
        )
    assert info.value.code == 2
