"""``benchmarks/secagg.py`` runs end to end at a tiny size, for each threat model and for the
comparison line (timings are not asserted: the sums are)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.limits import hang_guard
from support.paths import ROOT

ARGV = [sys.executable, str(ROOT / "benchmarks" / "secagg.py"), "--clients", "40", "--dim", "500"]


def _line(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [*ARGV, *args, "--repeat", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=hang_guard(30),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = done.stdout.strip().splitlines()
    out: dict[str, object] = json.loads(line)
    return out


@pytest.mark.parametrize("model", ["semi-honest", "malicious"])
def test_one_model_sums_exactly(model: str) -> None:
    line = _line("--threat-model", model)
    assert line["correct"] is True
    assert line["threat_model"] == model
    assert ("consistency_ms" in line) is (model == "malicious")


def test_the_comparison_line_measures_the_three_protocols_in_one_run() -> None:
    line = _line("--threat-model", "compare")
    assert line["correct"] is True
    models = {"semi-honest", "semi-malicious", "malicious"}
    assert set(line["server_total_s"]) == models  # type: ignore[arg-type]
    # malicious uses the semi-malicious (k, t)
    pairs = line["degree_threshold"]
    assert pairs["malicious"] == pairs["semi-malicious"]  # type: ignore[index]
    for key in ("server_ratio_vs_semi_honest", "client_added_ms_vs_semi_malicious"):
        assert isinstance(line[key], float)
