"""``dpfl privacy``: every mechanism form, JSON output equal to the library, clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpfl.accounting import (
    GaussianEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    calibrate,
    compute_epsilon,
    event_to_json,
)
from dpfl.cli.main import main

KEYS = {"epsilon", "delta", "method", "order", "rdp_epsilon", "tight_epsilon"}


def _run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    out = capsys.readouterr().out
    document: dict[str, Any] = json.loads(out)
    return document


FORMS = [
    (
        ["--mechanism", "gaussian", "--noise-multiplier", "3.0", "--steps", "10"],
        SelfComposedEvent(GaussianEvent.from_multiplier(3.0), 10),
    ),
    (
        [
            "--mechanism",
            "poisson-gaussian",
            "--sampling-rate",
            "0.01",
            "--noise-multiplier",
            "1.1",
            "--steps",
            "1000",
        ],
        SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent.from_multiplier(1.1)), 1000),
    ),
    (
        [
            "--mechanism",
            "uniform-gaussian",
            "--population",
            "1000",
            "--sample-size",
            "20",
            "--noise-multiplier",
            "2.0",
            "--steps",
            "50",
        ],
        # replace-one: std 2·C against sensitivity 2·C
        SelfComposedEvent(
            SampledWithoutReplacementEvent(1000, 20, GaussianEvent(sigma=2.0, sensitivity=2.0)), 50
        ),
    ),
    (
        ["--mechanism", "pate", "--queries", "200", "--sigma", "40", "--level", "agent"],
        VotingEvent(queries=200, sigma=40.0, level="agent"),
    ),
    (
        ["--mechanism", "pate", "--queries", "200", "--sigma", "40", "--level", "instance"],
        VotingEvent(queries=200, sigma=40.0, level="instance"),
    ),
    (
        [
            "--mechanism",
            "knn",
            "--queries",
            "300",
            "--sigma",
            "10",
            "--k",
            "5",
            "--level",
            "instance",
        ],
        VotingEvent(queries=300, sigma=10.0, level="instance", k=5),
    ),
    (
        [
            "--mechanism",
            "skellam",
            "--mu",
            "5000",
            "--l1-sensitivity",
            "300",
            "--l2-sensitivity",
            "30",
            "--dimension",
            "1000",
            "--steps",
            "20",
        ],
        SelfComposedEvent(
            SkellamEvent(mu=5000.0, l1_sensitivity=300.0, l2_sensitivity=30.0, dimension=1000), 20
        ),
    ),
    (
        [
            "--mechanism",
            "skellam",
            "--mu",
            "5000",
            "--l1-sensitivity",
            "300",
            "--l2-sensitivity",
            "30",
            "--dimension",
            "1000",
            "--sampling-rate",
            "0.1",
        ],
        PoissonSampledEvent(
            0.1, SkellamEvent(mu=5000.0, l1_sensitivity=300.0, l2_sensitivity=30.0, dimension=1000)
        ),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "event"), FORMS, ids=lambda x: x[1] if isinstance(x, list) else ""
)
def test_every_form_prints_the_library_report(
    capsys: pytest.CaptureFixture[str], flags: list[str], event: Any
) -> None:
    document = _run_json(capsys, ["privacy", "epsilon", *flags, "--delta", "1e-5", "--json"])
    assert set(document) == KEYS
    expected = compute_epsilon(event, delta=1e-5).to_json()
    assert document == expected


def test_event_json_form(capsys: pytest.CaptureFixture[str]) -> None:
    event = PoissonSampledEvent(0.02, GaussianEvent(sigma=2.0, sensitivity=1.5))
    document = _run_json(
        capsys,
        [
            "privacy",
            "epsilon",
            "--mechanism",
            "event",
            "--event",
            json.dumps(event_to_json(event)),
            "--delta",
            "1e-6",
            "--json",
        ],
    )
    assert document == compute_epsilon(event, delta=1e-6).to_json()


def test_rdp_only_flag(capsys: pytest.CaptureFixture[str]) -> None:
    document = _run_json(
        capsys,
        [
            "privacy",
            "epsilon",
            "--mechanism",
            "gaussian",
            "--noise-multiplier",
            "2",
            "--delta",
            "1e-5",
            "--rdp-only",
            "--json",
        ],
    )
    assert document["method"] == "rdp"
    assert document["tight_epsilon"] is None


@pytest.mark.slow
def test_calibrate_json(capsys: pytest.CaptureFixture[str]) -> None:
    document = _run_json(
        capsys,
        [
            "privacy",
            "calibrate",
            "--target-epsilon",
            "3",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "0.02",
            "--steps",
            "200",
            "--json",
        ],
    )
    assert set(document) == {"noise_multiplier", "epsilon", "method", "closed_form"}
    expected = calibrate(target_epsilon=3.0, delta=1e-5, sampling_rate=0.02, steps=200)
    assert document["noise_multiplier"] == expected.noise_multiplier
    assert document["epsilon"] <= 3.0
    assert set(document["closed_form"]) == {"fedls_poisson", "fedls_uniform", "simple_gaussian"}


def test_tables_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "privacy",
                "epsilon",
                "--mechanism",
                "pate",
                "--queries",
                "10",
                "--sigma",
                "5",
                "--level",
                "agent",
                "--delta",
                "1e-5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "epsilon" in out
    assert "analytic_gaussian" in out
    assert (
        main(["privacy", "calibrate", "--target-epsilon", "2", "--delta", "1e-5", "--steps", "3"])
        == 0
    )
    out = capsys.readouterr().out
    assert "noise_multiplier" in out
    assert "fedls_poisson" in out


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [
        (
            ["--mechanism", "poisson-gaussian", "--noise-multiplier", "1"],
            2,
            "needs --sampling-rate",
        ),
        (
            ["--mechanism", "gaussian", "--noise-multiplier", "1", "--sampling-rate", "0.1"],
            2,
            "does not take --sampling-rate",
        ),
        (
            ["--mechanism", "knn", "--queries", "3", "--sigma", "1", "--level", "agent"],
            2,
            "needs --k",
        ),
        (["--mechanism", "gaussian", "--noise-multiplier", "-1"], 2, "sigma must be > 0"),
        (
            [
                "--mechanism",
                "poisson-gaussian",
                "--sampling-rate",
                "1.5",
                "--noise-multiplier",
                "1",
            ],
            2,
            "(0, 1]",
        ),
        (["--mechanism", "event", "--event", "{not json"], 2, "not valid JSON"),
        (["--mechanism", "event", "--event", '{"kind": "laplace"}'], 2, "unknown event kind"),
        (
            [
                "--mechanism",
                "event",
                "--event",
                json.dumps(
                    {
                        "kind": "poisson_sampled",
                        "sampling_rate": 0.5,
                        "event": {"kind": "voting", "queries": 1, "sigma": 1.0, "level": "agent"},
                    }
                ),
            ],
            3,
            "VotingEvent",
        ),
        (["--mechanism", "gaussian", "--noise-multiplier", "1", "--steps", "0"], 2, "--steps"),
    ],
)
def test_errors_are_clear(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, fragment: str
) -> None:
    assert main(["privacy", "epsilon", *argv, "--delta", "1e-5", "--json"]) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert fragment in captured.err


def test_bad_delta_and_unreachable_calibration(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "privacy",
                "epsilon",
                "--mechanism",
                "gaussian",
                "--noise-multiplier",
                "1",
                "--delta",
                "2",
            ]
        )
        == 2
    )
    assert "delta" in capsys.readouterr().err
    assert (
        main(
            [
                "privacy",
                "calibrate",
                "--target-epsilon",
                "1e-9",
                "--delta",
                "1e-12",
                "--steps",
                "10",
            ]
        )
        == 4
    )
    assert "no noise multiplier" in capsys.readouterr().err


def test_privacy_without_action_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy"]) == 2
    assert "epsilon" in capsys.readouterr().out


@pytest.mark.slow
def test_console_script_end_to_end() -> None:
    script = Path(sys.executable).parent / "dpfl"
    exe = str(script) if script.exists() else shutil.which("dpfl")
    assert exe, "the dpfl console script is not installed"
    out = subprocess.run(
        [
            exe,
            "privacy",
            "epsilon",
            "--mechanism",
            "poisson-gaussian",
            "--sampling-rate",
            "0.01",
            "--noise-multiplier",
            "1.0",
            "--steps",
            "10000",
            "--delta",
            "1e-5",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    document = json.loads(out.stdout)
    assert document["method"] == "pld"
    assert 6.0 < document["epsilon"] < document["rdp_epsilon"] < 6.8


# (q, z, steps, δ): ε from about 0.005 to 200 at the tight path's reported figure
_PLD_GRID_CASES = [
    (0.001, 4.0, 70, 1e-5),
    (0.001, 2.0, 1000, 1e-6),
    (0.001, 1.0, 1000, 1e-5),
    (0.02, 2.0, 500, 1e-5),
    (0.01, 1.0, 1000, 1e-3),
    (0.3, 1.54, 10, 1e-5),
    (0.01, 1.0, 10000, 1e-5),
    (0.05, 0.8, 500, 1e-5),
    (0.2, 0.7, 300, 1e-5),
    (0.5, 0.4, 100, 1e-5),
]


@pytest.mark.slow
@pytest.mark.parametrize(("q", "z", "steps", "delta"), _PLD_GRID_CASES)
def test_poisson_gaussian_is_within_one_percent_of_a_fine_pessimistic_pld(
    capsys: pytest.CaptureFixture[str], q: float, z: float, steps: int, delta: float
) -> None:
    """Never below a pessimistic PLD on a grid ≤ 1e-4·ε, and within 1 % of it.

    The reference's step is also ≤ 2e-3: a pessimistic PLD is an upper bound at any step, so one
    on a coarser grid than the CLI's own (at large ε, 1e-4·ε is coarse) may legitimately lie above
    the CLI's figure.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    document = _run_json(
        capsys,
        [
            "privacy",
            "epsilon",
            "--mechanism",
            "poisson-gaussian",
            "--sampling-rate",
            str(q),
            "--noise-multiplier",
            str(z),
            "--steps",
            str(steps),
            "--delta",
            str(delta),
            "--json",
        ],
    )
    ours = float(document["epsilon"])
    assert document["method"] == "pld"
    grid = min(1e-4 * ours / 1.02, 2e-3)
    reference = float(
        pld_lib.from_gaussian_mechanism(
            z, sampling_prob=q, pessimistic_estimate=True, value_discretization_interval=grid
        )
        .self_compose(steps)
        .get_epsilon_for_delta(delta)
    )
    assert grid <= 1e-4 * reference  # the reference's grid is fine relative to its own ε
    assert 0.004 <= reference <= 250.0
    assert ours >= reference * (1.0 - 1e-9)
    assert ours <= reference * 1.01
