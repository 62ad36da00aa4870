"""``dpfl simulate``'s summary: a claimed figure that is not a bound is printed apart from the
charged ε, named as such, and carried in the JSON line under its own keys."""

from __future__ import annotations

from rich.console import Console

from dpfl.cli.sim_report import summary
from dpfl.learning.algorithms.parts.fedsgd_accounting import CLAIM_LABEL
from dpfl.simulation import SimulationResult
from dpfl.simulation.result import Invitations, StopReason


def _result(**extra: object) -> SimulationResult:
    fields: dict[str, object] = {
        "job": "sgd",
        "job_id": "job-1",
        "algorithm": "dp-fedsgd",
        "status": "completed",
        "rounds_completed": 2,
        "accuracy": 0.8,
        "epsilon": {"agent-a": 31.5, "agent-b": 31.5},
        "delta": 1e-5,
        "noise_multiplier": 1.1,
        "wall_s": 1.0,
    }
    return SimulationResult(**{**fields, **extra})  # type: ignore[arg-type]


def test_the_claim_is_printed_apart_and_named() -> None:
    console = Console(record=True, width=400)
    summary(console, _result(claimed_epsilon=4.0, claim=CLAIM_LABEL))
    text = console.export_text()
    assert "max 31.500" in text  # the charged ε
    assert "claimed ε 4.000 (not a bound, not charged" in text
    assert "NOT a proven bound" in text
    line = _result(claimed_epsilon=4.0, claim=CLAIM_LABEL).to_dict()
    assert (line["claimed_epsilon"], line["claim"]) == (4.0, CLAIM_LABEL)
    assert line["epsilon"] == {"agent-a": 31.5, "agent-b": 31.5}


def test_no_claim_no_line() -> None:
    console = Console(record=True, width=400)
    summary(console, _result())
    assert "claimed" not in console.export_text()
    assert _result().to_dict()["claimed_epsilon"] is None


def test_declines_and_the_stop_reason_are_printed_with_the_flag_to_change() -> None:
    console = Console(record=True, width=400)
    result = _result(
        status="failed",
        rounds_planned=4,
        invitations=Invitations(
            sent=10,
            accepted=6,
            declined=4,
            declined_by_rule={"max_epsilon_total": 4},
            example={"max_epsilon_total": "max_epsilon_total: total ε would reach 31 > 30"},
        ),
        stop=StopReason("budget_exhausted", "no client of the population can afford another"),
    )
    summary(console, result)
    text = console.export_text()
    assert "invitations: 10 sent, 6 accepted, 4 declined, 0 unanswered" in text
    assert "declined 4× by max_epsilon_total (agents' local policy; --agent-max-epsilon-total)" in (
        text
    )
    assert "stopped early (budget_exhausted) after 2 of 4 rounds" in text
    assert "--budget-epsilon" in text
    line = result.to_dict()
    assert line["invitations"]["declined_by_rule"] == {"max_epsilon_total": 4}
    assert line["stop_reason"]["kind"] == "budget_exhausted"


def test_identical_epsilons_share_one_row() -> None:
    """The demo's 100 clients all spent ε 3.999: one row, not a hundred (issue 36, item 8)."""
    console = Console(record=True, width=120)
    epsilon = {f"agent-{i:03d}": 3.9990475 for i in range(100)}
    summary(console, _result(epsilon=epsilon, algorithm="dp-fedavg"))
    text = console.export_text()
    assert "100 clients (agent-000 … agent-099)" in text
    assert text.count("3.999") == 3  # the row, and the max and min of the line below
    assert len(text.splitlines()) < 15
    assert _result(epsilon=epsilon).to_dict()["epsilon"] == epsilon  # --json: every client


def test_distinct_epsilons_are_listed_largest_first_up_to_a_limit() -> None:
    console = Console(record=True, width=120)
    epsilon = {f"agent-{i:02d}": i / 10 for i in range(30)}
    summary(console, _result(epsilon=epsilon))
    lines = console.export_text().splitlines()
    rows = [line for line in lines if "agent-" in line or "more clients" in line]
    assert "agent-29" in rows[0]
    assert len(rows) == 21
    assert "10 more clients (--json lists each)" in rows[-1]
    assert "0.000 – 0.900" in rows[-1]
