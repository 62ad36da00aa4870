"""``dpfl budget`` against a live coordinator API (uvicorn on loopback) over a finished job."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.api import FinishedJob, admin_settings, build_finished_job, live_server, make_app
from support.tls_federation import Pki, make_pki

from dpfl.cli.main import main
from dpfl.server.settings import Settings
from dpfl.server.store import Store, open_store

Coordinator = tuple[str, str, Store, FinishedJob]
Capture = pytest.CaptureFixture[str]
ISSUE_5_KEYS = {"client_id", "epsilon", "delta", "budget_epsilon", "remaining_epsilon"}


@pytest.fixture(scope="module")
def coordinator(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Coordinator]:
    """(API URL, admin token, store, finished job), served for the whole module."""
    path = tmp_path_factory.mktemp("budget") / "dpfl.db"
    with open_store(f"sqlite:///{path}") as store:
        finished = build_finished_job(store)
        settings = admin_settings()
        with live_server(make_app(store, settings=settings)) as url:
            yield url, settings.admin_token.get_secret_value(), store, finished


def run(capsys: Capture, *args: str, insecure: bool = True) -> tuple[int, str, str]:
    """``dpfl budget ARGS`` (with ``--insecure``: the module's coordinator is plain http)."""
    code = main(["budget", *args, *(["--insecure"] if insecure else [])])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_of_every_client(coordinator: Coordinator, capsys: Capture) -> None:
    url, token, store, finished = coordinator
    code, out, _ = run(capsys, "--coordinator", url, f"--token={token}", "--json")
    assert code == 0
    clients = {c["id"]: c for c in json.loads(out)}
    assert set(clients) == set(finished.client_ids)
    for client_id, c in clients.items():
        assert c["epsilon"] == pytest.approx(store.client_budget(client_id).epsilon, rel=1e-12)


def test_json_of_one_client_has_the_budget_keys(coordinator: Coordinator, capsys: Capture) -> None:
    url, token, store, finished = coordinator
    client_id = finished.client_ids[0]
    code, out, _ = run(
        capsys, client_id, "--coordinator", url, f"--token={token}", "--delta", "1e-6", "--json"
    )
    assert code == 0
    report = json.loads(out)
    assert ISSUE_5_KEYS | {"events", "by_job"} <= set(report)
    assert report["delta"] == 1e-6
    assert report["epsilon"] == pytest.approx(store.client_budget(client_id, delta=1e-6).epsilon)
    assert set(report["by_job"]) == {finished.job.id, finished.pate_job.id}


def test_tables(coordinator: Coordinator, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    url, token, store, finished = coordinator
    monkeypatch.setenv("COLUMNS", "220")
    code, out, _ = run(capsys, "--coordinator", url.removeprefix("http://"), f"--token={token}")
    assert code == 0
    for client_id in finished.client_ids:
        assert client_id in out
        b = store.client_budget(client_id)
        # both figures on the client's row: the announced cohort's and its own share's
        (row,) = [line for line in out.splitlines() if client_id in line]
        assert f"{b.epsilon:.4f}" in row
        own = "unknown" if b.own_share_epsilon is None else f"{b.own_share_epsilon:.4f}"
        assert own in row
    assert "ε own share: only the client's own noise share" in out
    # the PATE-FL voters' entries carry no f₁: one client of each kind
    known = store.client_budget(finished.client_ids[-1])
    assert known.own_share_epsilon is not None
    code, out, _ = run(capsys, finished.client_ids[-1], "--coordinator", url, f"--token={token}")
    assert code == 0
    (line,) = [line for line in out.splitlines() if "ε own share only" in line]
    assert f"{known.own_share_epsilon:.4f}" in line
    assert "trusting no peer" in line
    client_id = finished.client_ids[0]
    code, out, _ = run(capsys, client_id, "--coordinator", url, f"--token={token}", "--events")
    assert code == 0
    b = store.client_budget(client_id)
    assert f"{b.epsilon:.4f}" in out
    assert f"{b.remaining_epsilon:.4f}" in out
    assert finished.job.id in out
    assert finished.pate_job.id in out
    assert '"kind":"poisson_sampled"' in out
    assert '"kind":"voting"' in out
    assert "3 (attempt 2)" in out  # round 3 was redone: its charge is attempt 2's, spelled out
    (line,) = [line for line in out.splitlines() if "ε own share only" in line]
    assert "unknown: 1 ledger entry was written before" in line


@pytest.mark.parametrize("columns", ["80", "40"])
def test_client_ids_are_printed_whole_on_a_narrow_terminal(
    coordinator: Coordinator, capsys: Capture, monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    """Each id can be copied into `dpfl budget CLIENT_ID`: whole, on one line, never cropped."""
    url, token, store, finished = coordinator
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run(capsys, "--coordinator", url, f"--token={token}")
    assert code == 0
    lines = out.splitlines()
    for client_id in finished.client_ids:
        assert any(client_id in line for line in lines), (client_id, out)
        assert f"{store.client_budget(client_id).epsilon:.4f}" in out
    assert "…" not in out


def test_a_client_token_reads_its_own_budget_only(
    coordinator: Coordinator, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, _, finished = coordinator
    me, other = finished.client_ids[0], finished.client_ids[1]
    monkeypatch.setenv("DPFL_TOKEN", finished.api_token(me))  # the token from the environment
    monkeypatch.setenv("DPFL_COORDINATOR_URL", url)
    code, out, _ = run(capsys, me, "--json")
    assert code == 0
    assert json.loads(out)["client_id"] == me
    code, out, err = run(capsys, other)
    assert (code, out) == (3, "")
    assert "a client token may read only its own client" in err
    code, _, err = run(capsys)
    assert code == 3
    assert "needs the admin token" in err


def test_errors_name_the_problem(coordinator: Coordinator, capsys: Capture) -> None:
    url, token, _, _ = coordinator
    code, _, err = run(capsys, "--coordinator", url, "--token", "wrong-token")
    assert code == 3
    assert "unknown, revoked or invalid token" in err
    assert "wrong-token" not in err
    # a token may start with "-" (URL-safe base64): it is still the token, sent and refused
    code, _, err = run(capsys, "--coordinator", url, "--token", "-wrong-token")
    assert code == 3
    assert "unknown, revoked or invalid token" in err
    code, _, err = run(capsys, "agent-nobody", "--coordinator", url, f"--token={token}")
    assert code == 4
    assert "agent 'agent-nobody' not found" in err
    code, _, err = run(capsys, "--coordinator", url, f"--token={token}", "--delta", "2")
    assert code == 2
    assert "--delta must be in (0, 1)" in err
    code, _, err = run(capsys, "--coordinator", "http://127.0.0.1:9", f"--token={token}")
    assert code == 5
    assert "cannot reach the coordinator at http://127.0.0.1:9/api/v1/clients" in err


def test_missing_settings(capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPFL_TOKEN", raising=False)
    monkeypatch.delenv("DPFL_COORDINATOR_URL", raising=False)
    code, _, err = run(capsys, "--token", "x")
    assert code == 2
    assert "--coordinator" in err
    code, _, err = run(capsys, "--coordinator", "http://127.0.0.1:1")
    assert code == 2
    assert "--token" in err


def test_console_script(coordinator: Coordinator) -> None:
    url, token, store, finished = coordinator
    client_id = finished.client_ids[2]
    script = Path(sys.executable).parent / "dpfl"
    out = subprocess.run(
        [str(script), "budget", client_id, "--coordinator", url, "--json", "--insecure"],
        capture_output=True,
        text=True,
        check=True,
        env={"DPFL_TOKEN": token, "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    report = json.loads(out.stdout)
    assert report["epsilon"] == pytest.approx(store.client_budget(client_id).epsilon)


HttpsCoordinator = tuple[str, Pki, str, str, FinishedJob]


@pytest.fixture(scope="module")
def https_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsCoordinator]:
    """(HTTPS URL, the federation's PKI, admin token, metrics token, finished job)."""
    import secrets

    root = tmp_path_factory.mktemp("budget-tls")
    pki = make_pki(root / "pki")
    admin, metrics = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    with open_store(f"sqlite:///{root / 'dpfl.db'}") as store:
        finished = build_finished_job(store)
        app = make_app(store, settings=Settings(admin_token=admin, metrics_token=metrics))
        with live_server(app, tls=(pki.server_cert, pki.server_key)) as url:
            yield url, pki, admin, metrics, finished


def test_https_with_the_federation_ca(
    https_coordinator: HttpsCoordinator, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every auth case over HTTPS verified with --ca (no SSL_CERT_FILE needed)."""
    url, pki, admin, metrics, finished = https_coordinator
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("DPFL_TOKEN", raising=False)
    ca = ("--ca", str(pki.ca))
    code, out, err = run(
        capsys, "--coordinator", url, *ca, f"--token={admin}", "--json", insecure=False
    )
    assert code == 0, err
    assert {c["id"] for c in json.loads(out)} == set(finished.client_ids)
    no_scheme = url.removeprefix("https://")  # HOST:PORT means https
    code, _, err = run(capsys, "--coordinator", no_scheme, *ca, "--token", admin, insecure=False)
    assert code == 0, err
    code, _, err = run(capsys, "--coordinator", url, *ca, insecure=False)
    assert code == 2
    assert "--token" in err
    code, _, err = run(
        capsys, "--coordinator", url, *ca, "--token", "wrong-" + admin, insecure=False
    )
    assert code == 3
    assert "unknown, revoked or invalid token" in err
    code, _, err = run(capsys, "--coordinator", url, *ca, "--token", metrics, insecure=False)
    assert code == 3
    assert "the metrics token may read only /metrics" in err
    me = finished.client_ids[0]
    code, out, err = run(
        capsys,
        me,
        "--coordinator",
        url,
        *ca,
        "--token",
        finished.api_token(me),
        "--json",
        insecure=False,
    )
    assert code == 0, err
    assert json.loads(out)["client_id"] == me


def test_https_refusals(
    https_coordinator: HttpsCoordinator, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, pki, admin, _, _ = https_coordinator
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    # the system's CAs do not know the federation's CA
    code, _, err = run(capsys, "--coordinator", url, "--token", admin, insecure=False)
    assert code == 5
    assert "CERTIFICATE_VERIFY_FAILED" in err
    # another CA does not verify it either
    other = ("--ca", str(pki.other_ca))
    code, _, err = run(capsys, "--coordinator", url, *other, "--token", admin, insecure=False)
    assert code == 5
    assert "CERTIFICATE_VERIFY_FAILED" in err
    code, _, err = run(capsys, "--coordinator", url, "--token", admin, insecure=True)
    assert code == 2
    assert "--insecure contradicts an https:// coordinator" in err
    missing = ("--ca", str(pki.root / "missing.pem"))
    code, _, err = run(capsys, "--coordinator", url, *missing, "--token", admin, insecure=False)
    assert code == 2
    assert "cannot use the CA file" in err


def test_plaintext_needs_insecure(coordinator: Coordinator, capsys: Capture) -> None:
    url, token, _, _ = coordinator
    code, out, err = run(capsys, "--coordinator", url, f"--token={token}", insecure=False)
    assert (code, out) == (2, "")
    assert "is plaintext: the token would travel unencrypted" in err
    code, _, err = run(
        capsys, "--coordinator", url, "--ca", "ca.pem", f"--token={token}", insecure=False
    )
    assert code == 2
    assert "--ca needs an https:// coordinator" in err
