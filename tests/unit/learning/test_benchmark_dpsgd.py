"""The DP-SGD benchmark runs and prints one JSON line (timings themselves are not asserted)."""

from __future__ import annotations

import json

import pytest
from support.paths import ROOT
from support.scripts import load_script


@pytest.mark.slow
def test_benchmark_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(ROOT / "benchmarks" / "dpsgd.py", "bench_dpsgd")
    module.main(
        ["--batch-sizes", "4,8", "--headline-batch", "8", "--repeats", "1", "--warmup", "0",
         "--modes", "hooks,ew"]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert report["benchmark"] == "dpsgd"
    assert report["parameters"] == 19178
    assert set(report["cpu"]["batches"]) == {"4", "8"}
    assert report["headline"]["ratio"] > 0
    assert report["headline"]["mode"] == "ew"
    assert report["headline"]["batch_size"] == 8
