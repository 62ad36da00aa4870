"""The tight path never fails a job (issue 34, item 4).

A plain PATE-FL job (one-hot Skellam votes at agent level, 200 queries, δ = 1e-5, ε = 2) failed
its calibration with an ``IndexError`` from dp_accounting: at σ = 64 votes of 2^10 units,
``mu = 2^31`` and scipy's ``ive(k, 2·mu)`` is NaN (AMOS gives no result from 2^30 on), so every
Skellam mass was dropped, the PLD had no finite mass and composing it indexed an empty array
(one release alone even read ε = 0 off it). The masses now come from the uniform asymptotic
expansion of the Bessel function at large arguments, a NaN mass is refused, and any failure of
the PLD computation falls back to the RDP bound with method ``"rdp_fallback"``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scipy import special

from dpfl.accounting import (
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    TightPathError,
    bessel,
    calibrate_noise_multiplier,
    compute_epsilon,
    gaussian_epsilon,
    tight,
)
from dpfl.accounting.report import RDP_FALLBACK_METHOD
from dpfl.accounting.tight import adaptive_pld_epsilon, skellam_pld, tight_epsilon

#: The failing call of the reported job (vote σ = 64, u = 2^10: mu = (64·2^10)²/2 = 2^31), as
#: ``_pld_epsilon`` received it during the calibration.
UNIT = 1024.0
MU = 2.0**31
QUERIES = 200
DELTA = 1e-5
INTERVAL = 0.0004426306407936617


def _votes(mu: float, queries: int) -> SelfComposedEvent:
    one = SkellamEvent(mu=mu, l1_sensitivity=UNIT, l2_sensitivity=UNIT, dimension=1)
    return SelfComposedEvent(one, queries)


def _gaussian_epsilon(mu: float, queries: int) -> float:
    """ε of the Gaussian with the Skellam's variance 2·mu over the same queries."""
    return gaussian_epsilon(math.sqrt(queries) * UNIT / math.sqrt(2.0 * mu), DELTA)


@pytest.fixture(autouse=True)
def _fresh_pld_cache() -> Iterator[None]:
    skellam_pld.cache_clear()
    tight._skellam_losses.cache_clear()
    yield
    skellam_pld.cache_clear()
    tight._skellam_losses.cache_clear()


def test_the_reported_call_gives_a_tight_figure() -> None:
    """The exact call that raised ``IndexError`` in ``PLDPmf.self_compose``."""
    event = _votes(MU, QUERIES)
    got = tight_epsilon(event, delta=DELTA, value_discretization_interval=INTERVAL)
    gaussian = _gaussian_epsilon(MU, QUERIES)
    assert got.method == "pld"
    # each loss is rounded up by less than one grid step
    assert gaussian <= got.epsilon <= gaussian + QUERIES * INTERVAL
    report = compute_epsilon(event, delta=DELTA)  # the adaptive grid
    assert report.method == "pld"
    assert report.rdp_epsilon is not None
    assert gaussian <= report.epsilon <= 1.01 * gaussian < report.rdp_epsilon


def test_one_release_at_a_large_mu_is_not_read_as_zero() -> None:
    """Before: the PLD of no finite mass gave ε = 0 for one release (below every bound)."""
    report = compute_epsilon(_votes(MU, 1), delta=DELTA)
    gaussian = _gaussian_epsilon(MU, 1)
    assert report.method == "pld"
    assert gaussian <= report.epsilon <= 1.01 * gaussian


@pytest.mark.parametrize("argument", [2.0**15, 2.0**20, 2.0**24, 2.0**28, 2.0**29])
def test_the_asymptotic_bessel_matches_scipy_where_scipy_works(argument: float) -> None:
    orders = np.arange(0, int(16 * math.sqrt(argument)))
    log_ive = bessel.log_ive(orders, argument)
    np.testing.assert_allclose(log_ive, np.log(special.ive(orders, argument)), rtol=0, atol=1e-9)


@pytest.mark.parametrize("argument", [2.0**15, 2.0**31, 2.0**34])
def test_the_skellam_masses_sum_to_one_beyond_scipy(argument: float) -> None:
    half = int(15 * math.sqrt(argument))
    mass = np.exp(bessel.log_ive(np.abs(np.arange(-half, half + 1)), argument))
    assert float(mass.sum()) == pytest.approx(1.0, abs=1e-12)
    assert np.isnan(special.ive(0, 2.0**31))  # the library limit this works around


def test_a_nan_mass_is_refused_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """scipy's own NaN (the switch to the expansion moved out of reach): no PLD is built from
    it, and the figure falls back to RDP instead of failing or reading ε = 0."""
    monkeypatch.setattr(bessel, "_BESSEL_UNIFORM_ARGUMENT", math.inf)
    with pytest.raises(TightPathError, match="not a number"):
        skellam_pld(MU, 1024, INTERVAL)
    for queries in (1, QUERIES):
        report = compute_epsilon(_votes(MU, queries), delta=DELTA)
        assert report.method == RDP_FALLBACK_METHOD
        assert report.tight_epsilon is None
        assert report.epsilon == report.rdp_epsilon
        assert report.tight_error is not None
        assert "not a number" in report.tight_error


def test_a_support_too_large_to_write_out_falls_back_to_rdp() -> None:
    """σ ≈ 1000 votes: 2·14·σ·2^10 ≈ 3·10^7 support points are not written out."""
    event = _votes((1000.0 * UNIT) ** 2 / 2.0, QUERIES)
    with pytest.raises(TightPathError, match="support points"):
        tight_epsilon(event, delta=DELTA)
    report = compute_epsilon(event, delta=DELTA)
    assert (report.method, report.tight_epsilon) == (RDP_FALLBACK_METHOD, None)
    assert report.rdp_epsilon is not None
    assert report.epsilon == report.rdp_epsilon


def _fail_compose(*args: Any, **kwargs: Any) -> Any:
    raise IndexError("list index out of range")


@pytest.mark.parametrize("error", [IndexError, ValueError, OverflowError])
def test_a_library_failure_falls_back_to_rdp(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error("inside dp_accounting")

    monkeypatch.setattr(pld_lib.PrivacyLossDistribution, "self_compose", fail)
    event = _votes(2.0**24, 50)
    with pytest.raises(TightPathError, match=error.__name__) as caught:
        tight_epsilon(event, delta=DELTA)
    assert isinstance(caught.value.__cause__, error)
    report = compute_epsilon(event, delta=DELTA)
    assert (report.method, report.tight_epsilon) == (RDP_FALLBACK_METHOD, None)
    assert report.rdp_epsilon is not None
    assert report.epsilon == report.rdp_epsilon
    assert report.to_json()["method"] == RDP_FALLBACK_METHOD
    # the subsampled Gaussian's PLD goes through the same guard
    sampled = SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent.from_multiplier(1.0)), 100)
    assert compute_epsilon(sampled, delta=DELTA).method == RDP_FALLBACK_METHOD


def test_a_failed_refinement_keeps_the_figures_already_computed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    event = _votes(2.0**24, 50)
    whole = adaptive_pld_epsilon(event, delta=DELTA, epsilon_hint=1.0)
    assert len(whole.tried) >= 2
    real = tight._pld_epsilon
    calls = []

    def first_only(*args: Any) -> float:
        calls.append(args)
        if len(calls) > 1:
            raise TightPathError("dp_accounting failed")
        return real(*args)

    monkeypatch.setattr(tight, "_pld_epsilon", first_only)
    cut = adaptive_pld_epsilon(event, delta=DELTA, epsilon_hint=1.0)
    assert cut.tried == whole.tried[:1]
    assert (cut.interval, cut.epsilon) == whole.tried[0]
    assert cut.epsilon >= whole.epsilon  # an upper bound still, only less tight


def test_calibration_meets_the_target_when_the_library_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    monkeypatch.setattr(pld_lib.PrivacyLossDistribution, "self_compose", _fail_compose)
    _, report = calibrate_noise_multiplier(
        lambda s: _votes((s * UNIT) ** 2 / 2.0, QUERIES), target_epsilon=2.0, delta=DELTA
    )
    assert report.method == RDP_FALLBACK_METHOD
    assert report.epsilon <= 2.0
    assert report.rdp_epsilon == report.epsilon


def test_the_reported_calibration_meets_its_target() -> None:
    """The whole calibration of the reported job's vote event (it never got past σ = 64)."""
    z, report = calibrate_noise_multiplier(
        lambda s: _votes((s * UNIT) ** 2 / 2.0, QUERIES), target_epsilon=2.0, delta=DELTA
    )
    assert report.method == "pld"
    assert report.epsilon <= 2.0
    assert report.rdp_epsilon is not None
    assert report.epsilon < report.rdp_epsilon
    assert 16.0 < z < 64.0


def test_each_kind_of_failure_is_warned_about_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A calibration asks for many ε of nearby events: the same failure at other figures is
    logged at debug after its first warning, a failure of another kind is warned about again,
    and every report keeps its own reason."""
    from dpfl.accounting import report as report_module

    monkeypatch.setattr(report_module, "_warned", set())
    caplog.set_level(logging.DEBUG, logger=report_module.__name__)
    reports = [
        compute_epsilon(_votes((sigma * UNIT) ** 2 / 2.0, QUERIES), delta=DELTA)
        for sigma in (1000.0, 1100.0, 1200.0)
    ]
    reasons = [r.tight_error for r in reports]
    assert all(reason is not None and "support points" in reason for reason in reasons)
    assert len(set(reasons)) == 3  # each names its own figures
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if "tight path" in r.message]
    assert [level for level, _ in logged] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    for (_, message), reason in zip(logged, reasons, strict=True):
        assert reason is not None
        assert reason in message
    # another kind of failure: warned about
    monkeypatch.setattr(
        report_module,
        "tight_epsilon",
        lambda *a, **k: (_ for _ in ()).throw(TightPathError("the library gave up")),
    )
    assert compute_epsilon(_votes(2.0**24, 50), delta=DELTA).tight_error == "the library gave up"
    assert [r.levelno for r in caplog.records if "gave up" in r.message] == [logging.WARNING]


def test_the_set_of_warned_kinds_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpfl.accounting import report as report_module

    monkeypatch.setattr(report_module, "_warned", set())
    for i in range(report_module._WARNED_KINDS + 50):
        report_module._log_fallback(f"failure kind {chr(0x4E00 + i)}")  # no digits: all distinct
    assert len(report_module._warned) == report_module._WARNED_KINDS
