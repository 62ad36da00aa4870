"""``dpfl-coordinator enroll-token --help`` tells how an agent redeems a token the way the agent
recommends (issue 36, item 8): ``--enrollment-token-file FILE`` or ``$DPFL_ENROLLMENT_TOKEN``,
not ``--enrollment-token TOKEN``, which shows the token in process listings (the agent warns)."""

from __future__ import annotations

import pytest

from dpfl.server.cli.main import main


def test_the_help_advertises_the_token_file_not_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["enroll-token", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--enrollment-token-file FILE" in text
    assert "DPFL_ENROLLMENT_TOKEN" in text
    assert "--enrollment-token TOKEN" not in text
