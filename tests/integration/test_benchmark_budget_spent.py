"""``benchmarks/budget_spent.py`` on two cheap utility rows (PATE-FL at agent level, DP-Helmet at
record level): one JSON line per row with the documented fields, the tight figure never above
RDP, the PATE-FL client's charge recomputed from its events with ``dpfl.accounting``, and
docs/accounting.md's lines for both rows what the script prints."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from support.limits import hang_guard
from support.paths import ROOT, data_dir_for_tests

from dpfl.accounting import (
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
    epsilon_from_rdp,
    event_from_json,
    rdp_curve,
)

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "benchmarks" / "budget_spent.py"
ROWS = ("mnist-noniid-pate-fl", "mnist-dp-helmet")
FIELDS = {
    "row": str,
    "series": str,
    "algorithm": str,
    "unit": str,
    "agents": int,
    "delta": float,
    "rounds": int,
    "target_epsilon": float,
    "noise_multiplier": float,
    "rdp_noise_multiplier": float,
    "noise_saved": float,
    "calibrated_epsilon": float,
    "claimed_epsilon": type(None),
    "charges": int,
    "rdp_epsilon": float,
    "tight_epsilon": float,
    "method": str,
    "budget_wasted": float,
    "events": list,
    "wall_s": float,
}


Line = dict[str, object]


def _num(line: Line, name: str) -> float:
    value = line[name]
    assert isinstance(value, int | float), (name, value)
    return float(value)


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Line], Path]:
    """The script's lines for :data:`ROWS`, and the markdown table it wrote."""
    found = data_dir_for_tests()
    if found is None or not (found / "mnist").is_dir():
        pytest.skip(f"no MNIST under {found} (set DPFL_DATA_DIR to the folder holding mnist/)")
    table = tmp_path_factory.mktemp("budget_spent") / "table.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", ",".join(ROWS), "--markdown", str(table)],
        capture_output=True,
        text=True,
        timeout=hang_guard(10),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.strip().splitlines()], table


def test_one_line_per_row_with_every_field_and_tight_at_most_rdp(
    lines: tuple[list[Line], Path],
) -> None:
    parsed, _ = lines
    assert [line["row"] for line in parsed] == list(ROWS)
    for line in parsed:
        assert set(line) == set(FIELDS)
        for name, kind in FIELDS.items():
            assert isinstance(line[name], kind), (name, line[name])
        rdp, tight = _num(line, "rdp_epsilon"), _num(line, "tight_epsilon")
        assert 0 < tight <= rdp
        assert line["budget_wasted"] == pytest.approx(rdp / tight - 1.0, rel=1e-12)
        z, z_rdp = _num(line, "noise_multiplier"), _num(line, "rdp_noise_multiplier")
        assert 0 < z <= z_rdp
        assert line["noise_saved"] == pytest.approx(1.0 - z / z_rdp, rel=1e-12)
        # the charge meets the target its noise was calibrated for
        assert tight <= _num(line, "target_epsilon")
    pate, helmet = parsed
    assert (pate["algorithm"], pate["unit"], pate["rounds"], pate["charges"]) == (
        "pate-fl",
        "agent",
        2,
        2,
    )
    assert pate["method"] == "pld"
    assert _num(pate, "budget_wasted") > 0.05
    assert _num(pate, "noise_saved") > 0.05
    assert (helmet["algorithm"], helmet["unit"], helmet["rounds"], helmet["charges"]) == (
        "dp-helmet",
        "record",
        1,
        1,
    )


def test_the_pate_client_charge_is_recomputed_from_its_events(
    lines: tuple[list[Line], Path],
) -> None:
    """Two rounds of 50 Skellam vote releases (one coordinate moved by u = 2^b, μ = (σu)²/2 at
    the calibrated σ) composed, RDP and tight, by ``dpfl.accounting`` directly."""
    pate = lines[0][0]
    events = pate["events"]
    assert isinstance(events, list)
    assert len(events) == 1
    rounds, event = events[0]["count"], event_from_json(events[0]["event"])
    assert rounds == 2
    assert isinstance(event, SelfComposedEvent)
    assert event.count == 50
    vote = event.event
    assert isinstance(vote, SkellamEvent)
    u = vote.l2_sensitivity
    assert (vote.dimension, vote.l1_sensitivity, math.log2(u) % 1) == (1, u, 0.0)
    sigma = _num(pate, "noise_multiplier")
    assert vote.mu == pytest.approx((sigma * u) ** 2 / 2.0, rel=1e-12)
    whole = SelfComposedEvent(SkellamEvent(vote.mu, u, u, 1), 100)
    delta = _num(pate, "delta")
    rdp = epsilon_from_rdp(100 * rdp_curve(SkellamEvent(vote.mu, u, u, 1)), delta=delta)[0]
    report = compute_epsilon(whole, delta=delta, tight=True)
    assert pate["rdp_epsilon"] == pytest.approx(rdp, rel=1e-9)
    assert report.method == "pld"
    # the ledger's 2 rounds of 50 are the 100 releases the calibration composed
    assert pate["tight_epsilon"] == pytest.approx(report.epsilon, rel=1e-9)
    assert pate["calibrated_epsilon"] == pytest.approx(report.epsilon, rel=1e-9)


def test_the_docs_table_lists_these_rows_as_the_script_prints_them(
    lines: tuple[list[Line], Path],
) -> None:
    _, table = lines
    written = table.read_text(encoding="utf-8").splitlines()
    docs = (ROOT / "docs" / "accounting.md").read_text(encoding="utf-8").splitlines()
    assert len(written) == 2 + len(ROWS)
    for line in written:
        assert line in docs, line
