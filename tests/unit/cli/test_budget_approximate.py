"""``dpfl budget`` marks figures that add up approximate ledger entries (``≈`` and a footnote;
"approximate" beside the method), against a live coordinator whose store holds the finished job
plus a job with discrete Gaussian noise (support.approximate_ledger)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.api import admin_settings, build_finished_job, live_server, make_app
from support.approximate_ledger import ApproximateJob, add_approximate_job

from dpfl.cli.budget import APPROXIMATE_MARK, APPROXIMATE_NOTE
from dpfl.cli.main import main
from dpfl.server.store import open_store

Coordinator = tuple[str, str, ApproximateJob]
Capture = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """(API URL, admin token, the approximate job), served for the whole module."""
    path = tmp_path_factory.mktemp("budget-approximate") / "dpfl.db"
    with open_store(f"sqlite:///{path}") as store:
        finished = build_finished_job(store)
        approx = add_approximate_job(store, finished.client_ids[0], finished.client_ids[2])
        settings = admin_settings()
        with live_server(make_app(store, settings=settings)) as url:
            yield url, settings.admin_token.get_secret_value(), approx


def run(capsys: Capture, url: str, token: str, *args: str) -> str:
    code = main(["budget", *args, "--coordinator", url, f"--token={token}", "--insecure"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")


def line_of(out: str, text: str) -> str:
    (line,) = [line for line in out.splitlines() if text in line]
    return line


def test_the_client_list_marks_the_approximate_total(
    coordinator: Coordinator, capsys: Capture
) -> None:
    url, token, approx = coordinator
    out = run(capsys, url, token)
    assert APPROXIMATE_MARK in line_of(out, approx.mixed)
    assert APPROXIMATE_MARK not in line_of(out, approx.exact)
    assert APPROXIMATE_NOTE in out
    listed = {c["id"]: c["approximate"] for c in json.loads(run(capsys, url, token, "--json"))}
    assert listed[approx.mixed] is True
    assert listed[approx.exact] is False


def test_one_client_marks_the_total_the_job_and_the_event(
    coordinator: Coordinator, capsys: Capture
) -> None:
    url, token, approx = coordinator
    out = run(capsys, url, token, approx.mixed, "--events")
    spent = line_of(out, "ε spent")
    assert APPROXIMATE_MARK in spent
    assert "(pld, approximate)" in spent  # every event of this client has a tight path
    assert APPROXIMATE_NOTE in out
    lines = out.splitlines()
    titles = [i for i, line in enumerate(lines) if line.strip() in ("per job", "events")]
    assert len(titles) == 2
    per_job, events = lines[titles[0] : titles[1]], lines[titles[1] :]
    rows = {line.split()[1]: line for line in per_job if "job-" in line}
    assert len(rows) == 3  # DP-FedAvg, PATE-FL and the approximate job
    for job_id, row in rows.items():
        flagged = job_id == approx.job.id
        assert ("approximate" in row, APPROXIMATE_MARK in row) == (flagged, flagged), row
    event_rows = [line for line in events if '"kind":' in line]
    assert len(event_rows) == 6
    assert sum(APPROXIMATE_MARK in line for line in event_rows) == 1

    report = json.loads(run(capsys, url, token, approx.mixed, "--json"))
    assert report["approximate"] is True
    assert report["by_job"][approx.job.id]["approximate"] is True


def test_a_client_with_exact_entries_only_is_not_marked(
    coordinator: Coordinator, capsys: Capture
) -> None:
    url, token, approx = coordinator
    out = run(capsys, url, token, approx.exact, "--events", "--tight")
    assert APPROXIMATE_MARK not in out
    assert "approximate" not in out
    assert approx.job.id in out
