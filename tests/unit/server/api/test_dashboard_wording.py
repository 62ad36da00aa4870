"""The dashboard's words (issue 36, item 4): "1 job", not "1 jobs"; the ε-over-rounds chart's
x axis explains its tick labels ("r3" is round 3, "r3 #2" its second attempt).

Node runs the real ``app.js`` (tests/support/dashboard_harness.mjs) with ``chart.js`` replaced
by a stub that prints the chart's axis title and its x tick labels, over the API's answers for
the finished job, trimmed to one job and one client. Skipped, saying why, without ``node``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.paths import ROOT

from dpfl.server.api.routes.dashboard import STATIC_DIR

pytestmark = pytest.mark.anyio

HARNESS = ROOT / "tests" / "support" / "dashboard_harness.mjs"
#: prints "title || x axis title || tick, tick, ..." of each chart
CHART_STUB = """\
export function lineChart(container, spec) {
  const xs = [...new Set(spec.series.flatMap((s) => s.points.map((p) => p.x)))];
  const ticks = xs.map((x) => (spec.xTickLabel ? spec.xTickLabel(x) : String(x)));
  const labels = spec.series.flatMap((s) => s.points.map((p) => p.label));
  const parts = [spec.title, spec.xLabel, ticks.join(", "), labels.join(", ")];
  container.textContent = parts.join(" || ");
}
"""


@pytest.fixture
def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.skip("node is not installed: the dashboard's script cannot run without a browser")
    return path


async def test_one_job_is_singular_and_the_round_ticks_are_explained(
    admin: httpx.AsyncClient, node: str, tmp_path: Path
) -> None:
    responses: dict[str, Any] = {}

    async def answer(path: str) -> Any:
        r = await admin.get(f"/api/v1{path}")
        assert r.status_code == 200, r.text
        responses[path] = r.json()
        return responses[path]

    clients = await answer("/clients")
    jobs = await answer("/jobs")
    fedavg = next(j for j in jobs if j["algorithm"] == "dp-fedavg")
    responses["/clients"] = clients[:1]
    responses["/jobs"] = [fedavg]  # one job: the DP-FedAvg one, whose round 3 was redone
    history = await answer(f"/clients/{clients[0]['id']}/history")
    responses[f"/clients/{clients[0]['id']}/history"] = {
        **history,
        "points": [p for p in history["points"] if p["job_id"] == fedavg["id"]],
    }
    for suffix in ("", "/rounds", "/privacy-audits"):
        await answer(f"/jobs/{fedavg['id']}{suffix}")
    shutil.copyfile(STATIC_DIR / "app.js", tmp_path / "app.js")
    (tmp_path / "chart.js").write_text(CHART_STUB)
    (tmp_path / "responses.json").write_text(json.dumps(responses))
    done = subprocess.run(
        [node, str(HARNESS), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["loaded"], shown["status"]
    assert shown["status"] == "1 client, 1 job."
    _title, x_axis, ticks, labels = shown["chart"].split(" || ")
    assert "#" in ticks, ticks  # the redone round 3 is charged as its attempt 2
    assert "r3 = round 3" in x_axis
    assert "r3 #2 = its attempt 2" in x_axis
    assert "round 3 (attempt 2)" in labels  # the tooltips and the data table spell it out
