"""The dashboard marks approximate ε (``≈ approximate: not a proven bound``).

No browser here: Node runs the real ``app.js`` over a minimal DOM (tests/support/
dashboard_harness.mjs) with ``chart.js`` replaced by a stub that keeps the chart's title and
description, and ``fetch`` answering with what the API answered for this store. Skipped, saying
why, where ``node`` is not installed. (tests/e2e/test_dashboard_browser.py covers the rest of
the page in a real browser.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.api import FinishedJob
from support.approximate_ledger import ApproximateJob, add_approximate_job
from support.paths import ROOT

from dpfl.server.api.routes.dashboard import STATIC_DIR
from dpfl.server.store import Store

pytestmark = pytest.mark.anyio

HARNESS = ROOT / "tests" / "support" / "dashboard_harness.mjs"
CHART_STUB = """\
export function lineChart(container, spec) {
  container.textContent = `${spec.title} | ${spec.description}`;
}
"""
MARK = "≈ approximate: not a proven bound"


@pytest.fixture
def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.skip("node is not installed: the dashboard's script cannot run without a browser")
    return path


async def render(admin: httpx.AsyncClient, node: str, tmp_path: Path) -> dict[str, Any]:
    """What app.js renders for the API behind ``admin`` (its first client and newest job)."""
    responses: dict[str, Any] = {}

    async def answer(path: str) -> Any:
        r = await admin.get(f"/api/v1{path}")
        assert r.status_code == 200, r.text
        responses[path] = r.json()
        return responses[path]

    clients = await answer("/clients")
    jobs = await answer("/jobs")
    await answer(f"/clients/{clients[0]['id']}/history")
    newest = jobs[-1]["id"]
    for suffix in ("", "/rounds", "/privacy-audits"):
        await answer(f"/jobs/{newest}{suffix}")
    shutil.copyfile(STATIC_DIR / "app.js", tmp_path / "app.js")
    (tmp_path / "chart.js").write_text(CHART_STUB)
    (tmp_path / "responses.json").write_text(json.dumps(responses))
    done = subprocess.run(
        [node, str(HARNESS), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    assert shown["loaded"], shown["status"]
    return shown


async def test_an_approximate_client_job_and_round_are_marked(
    admin: httpx.AsyncClient,
    store: Store,
    finished: FinishedJob,
    node: str,
    tmp_path: Path,
) -> None:
    approx: ApproximateJob = add_approximate_job(
        store, finished.client_ids[0], finished.client_ids[1]
    )
    shown = await render(admin, node, tmp_path)
    rows = {r["id"]: r for r in shown["clients"]}
    assert set(rows) == set(finished.client_ids)
    for client_id, row in rows.items():
        flagged = client_id == approx.mixed
        assert (MARK in row["epsilon"], row["approximate"]) == (flagged, str(flagged).lower())
        assert ("≈" in row["remaining"]) == flagged  # its remaining budget is approximate too
        # the own-share figure adds up the same entries ("unknown": some entry carries no f₁)
        assert ("≈" in row["own_share"]) == (flagged and row["own_share"] != "unknown")
    assert not shown["note_hidden"]
    # the selected client is the approximate one; the selected job is the newest, approximate
    assert MARK in shown["chart"]
    assert MARK in shown["facts"]
    marked = [MARK in item for item in shown["timeline"]]
    assert marked == [False, True]  # round 1 was charged exactly, round 2 approximately


async def test_exact_figures_are_not_marked(
    admin: httpx.AsyncClient, node: str, tmp_path: Path
) -> None:
    shown = await render(admin, node, tmp_path)
    assert shown["clients"]
    assert all(r["approximate"] == "false" and "≈" not in r["epsilon"] for r in shown["clients"])
    assert shown["note_hidden"]
    assert "≈" not in shown["chart"] + shown["facts"] + "".join(shown["timeline"])
