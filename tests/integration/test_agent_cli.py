"""``dpfl-agent run`` / ``status`` as a user runs them: a real process against a gRPC coordinator.

The process enrols with a one-time token, takes part in a real DP-FedAvg round (with a second,
in-process agent), stops cleanly on SIGTERM, and a second run without a token reuses the stored
credential (the token cannot be redeemed twice). Argument errors are checked in process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest
from support.agent_kit import JOB, fedavg_round, publish, start_agent
from support.scripted_coordinator import ScriptedCoordinator, start_grpc

from dpfl.client.cli.main import main as agent_main
from dpfl.client.state import CREDENTIALS_FILE
from dpfl.client.transport import GrpcTransport


def _agent_command(address: str, state: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dpfl.client.cli.main",
        "run",
        "--coordinator",
        address,
        "--data",
        "digits#index=0&agents=2",
        "--state-dir",
        str(state),
        "--insecure",
        "--device",
        "cpu",
        "--name",
        "silo-0",
        *extra,
    ]


class _AgentProcess:
    """A ``dpfl-agent run`` process whose stderr is read as it comes.

    Reading it while the test waits keeps the pipe from filling, and lets a failure show what
    the agent printed: an agent that exits or never connects fails at once with its stderr,
    instead of as a bare timeout.
    """

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.err = bytearray()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, command: list[str], env: dict[str, str]) -> _AgentProcess:
        process = await asyncio.create_subprocess_exec(
            *command, env=env, stderr=asyncio.subprocess.PIPE
        )
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.read(4096):
            self.err += chunk

    def _failure(self, what: str) -> AssertionError:
        return AssertionError(
            f"{what} (exit code {self.process.returncode}); the agent's stderr:\n"
            + self.err.decode(errors="replace")
        )

    async def wait_connected(
        self, coordinator: ScriptedCoordinator, agent_ids: list[str], timeout: float
    ) -> None:
        connected = asyncio.create_task(coordinator.wait_connected(agent_ids, timeout=timeout))
        exited = asyncio.create_task(self.process.wait())
        done, _ = await asyncio.wait({connected, exited}, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if connected not in done:
            connected.cancel()
            await asyncio.wait_for(self._reader, 5)
            raise self._failure(f"the agent exited before {agent_ids} connected")
        if (error := connected.exception()) is not None:
            raise self._failure(str(error))

    def kill(self) -> None:
        """End the process if it still runs (a test that failed half-way leaves no orphan)."""
        if self.process.returncode is None:
            self.process.kill()

    async def stop(self) -> tuple[int, str]:
        """SIGTERM, then the exit code and everything the process wrote on stderr."""
        self.process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.process.wait(), 30)
        await asyncio.wait_for(self._reader, 5)
        return code, self.err.decode(errors="replace")


@pytest.mark.slow  # two agent processes start (about 2 s each) and one trains
def test_run_enrols_trains_stops_and_reuses_its_credential(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def main() -> None:
        setup = fedavg_round(population=2)
        coordinator = ScriptedCoordinator()
        publish(coordinator, setup)
        server, address = await start_grpc(coordinator)
        token = coordinator.issue_token()
        env = {**os.environ, "DPFL_DEVICE": "cpu", "COLUMNS": "200"}
        channel = GrpcTransport(address, insecure=True)
        helper = start_agent(
            agent_id="helper",
            connector=channel.connector(
                agent_id="helper", credential=coordinator.add_agent("helper")
            ),
            state_dir=tmp_path / "helper",
            index=1,
            agents=2,
        )
        started: list[_AgentProcess] = []
        try:
            agent = await _AgentProcess.start(
                _agent_command(address, state, "--enrollment-token", token), env
            )
            started.append(agent)
            await agent.wait_connected(coordinator, ["enrolled-1", "helper"], timeout=90)
            assert coordinator.enrolled == ["silo-0"]
            report = await coordinator.run_round(
                job_id=JOB,
                round=1,
                agents=["enrolled-1", "helper"],
                algorithm=setup.algorithm,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
                timeout=30,
            )
            assert report.aborted == ""
            assert report.survivors == {"enrolled-1", "helper"}
            await asyncio.sleep(0.2)
            code, err = await agent.stop()
            assert code == 0, err
            assert "plaintext" in err
            assert "enrolled" in err
            # second run: no token, the stored credential is used (the token is spent)
            again = await _AgentProcess.start(_agent_command(address, state), env)
            started.append(again)
            coordinator.drop("enrolled-1")
            await asyncio.sleep(0.1)
            await again.wait_connected(coordinator, ["enrolled-1"], timeout=90)
            code, err = await again.stop()
            assert code == 0, err
            assert "enrolment reused" in err
        finally:
            for process in started:
                process.kill()
            await helper.close()
            await channel.close()
            await server.stop(None)

    asyncio.run(asyncio.wait_for(main(), 240))
    assert stat.S_IMODE((state / CREDENTIALS_FILE).stat().st_mode) == 0o600
    assert agent_main(["status", "--state-dir", str(state), "--json"]) == 0


def test_status_reports_the_local_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpfl.accounting import GaussianEvent
    from dpfl.client.local_ledger import LocalLedger
    from dpfl.client.state import Credentials, StateDir

    state = StateDir(tmp_path)
    state.save_credentials(
        Credentials("a-9", "secret", "api", "c:1", "cid", "silo", "2026-01-01T00:00:00+00:00")
    )
    with LocalLedger.open(tmp_path) as ledger:
        ledger.record(job_id="j1", round=1, events=[GaussianEvent(sigma=2.0)])
        ledger.record(job_id="j1", round=2, events=[GaussianEvent(sigma=2.0)])
        ledger.record(job_id="j2", round=1, events=[GaussianEvent(sigma=4.0)])
    assert agent_main(["status", "--state-dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["agent_id"] == "a-9"
    assert data["jobs"]["j1"]["rounds"] == 2
    assert data["jobs"]["j2"]["rounds"] == 1
    assert data["jobs"]["j1"]["epsilon"] > data["jobs"]["j2"]["epsilon"] > 0
    assert data["epsilon_total"] > data["jobs"]["j1"]["epsilon"]
    assert "secret" not in json.dumps(data)
    assert agent_main(["status", "--state-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "j1" in table
    assert "total" in table


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--data", "digits"], 5, "no TLS configured"),
        (["--data", "digits", "--insecure", "--ca", "/nonexistent.pem"], 5, "contradicts"),
        (["--data", "digits", "--cert", "c.pem"], 5, "--cert and --key go together"),
        (["--data", "nope", "--insecure"], 2, "unknown data set"),
        (["--data", "digits#index=3&agents=2", "--insecure"], 2, "index 3 outside"),
        (["--data", "digits", "--insecure"], 4, "--enrollment-token-file FILE"),
    ],
)
def test_run_refuses_bad_arguments_with_exit_codes(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    code: int,
    message: str,
) -> None:
    argv = ["run", "--coordinator", "127.0.0.1:1", "--state-dir", str(tmp_path / "s"), *extra]
    assert agent_main(argv) == code
    assert message in capsys.readouterr().err


def test_not_enrolled_names_the_token_options_that_keep_it_out_of_listings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a token the agent says how to give one: the file or the environment variable,
    not the token on the command line (which it warns against)."""
    argv = ["run", "--coordinator", "127.0.0.1:1", "--state-dir", str(tmp_path / "s")]
    assert agent_main([*argv, "--data", "digits", "--insecure"]) == 4
    err = " ".join(capsys.readouterr().err.split())
    assert "holds no enrolment yet" in err
    assert "--enrollment-token-file FILE or $DPFL_ENROLLMENT_TOKEN" in err
    assert "--enrollment-token TOKEN" not in err


def test_run_refuses_a_corrupt_state_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / CREDENTIALS_FILE).write_text("{broken")
    (tmp_path / CREDENTIALS_FILE).chmod(0o600)
    argv = ["run", "--coordinator", "127.0.0.1:1", "--state-dir", str(tmp_path)]
    assert agent_main([*argv, "--data", "digits", "--insecure"]) == 3
    assert "not valid JSON" in capsys.readouterr().err
    assert agent_main(["status", "--state-dir", str(tmp_path / "missing")]) == 3
