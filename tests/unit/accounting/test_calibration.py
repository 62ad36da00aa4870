"""Calibration finds the smallest multiplier meeting the target, and reports the closed forms."""

from __future__ import annotations

import math

import pytest

from dpfl.accounting import (
    CalibrationError,
    InvalidParameterError,
    VotingEvent,
    calibrate,
    calibrate_noise_multiplier,
    compute_epsilon,
    fedls_noise_multiplier,
    sampled_gaussian_shape,
    simple_gaussian_epsilon,
    simple_gaussian_noise_multiplier,
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "q", "steps", "tight"),
    [(2.0, 0.01, 1000, True), (8.0, 0.05, 500, False), (1.0, 1.0, 1, True), (0.5, 1.0, 20, False)],
)
def test_round_trip_meets_the_target_within_one_percent(
    target: float, q: float, steps: int, tight: bool
) -> None:
    result = calibrate(target_epsilon=target, delta=1e-5, sampling_rate=q, steps=steps, tight=tight)
    event = sampled_gaussian_shape(sampling_rate=q, steps=steps)(result.noise_multiplier)
    eps = compute_epsilon(event, delta=1e-5, tight=tight).epsilon
    assert eps == result.epsilon
    assert 0.99 * target <= eps <= target
    # the bracket is 0.1 %: a slightly smaller multiplier misses the target
    below = sampled_gaussian_shape(sampling_rate=q, steps=steps)(result.noise_multiplier / 1.0011)
    assert compute_epsilon(below, delta=1e-5, tight=tight).epsilon > target
    assert result.method == ("rdp" if not tight else result.report.method)


@pytest.mark.slow
def test_result_lists_the_closed_forms_side_by_side() -> None:
    result = calibrate(target_epsilon=3.0, delta=1e-5, sampling_rate=0.02, steps=200)
    document = result.to_json()
    assert set(document) == {"noise_multiplier", "epsilon", "method", "closed_form"}
    assert set(document["closed_form"]) == {"fedls_poisson", "fedls_uniform", "simple_gaussian"}
    for bound in document["closed_form"].values():
        assert bound["noise_multiplier"] > 0
        assert bound["accountant_epsilon"] is not None
    # the exact accountant needs no more noise than any of them here
    assert all(
        b["noise_multiplier"] >= result.noise_multiplier for b in document["closed_form"].values()
    )


def test_fedls_closed_form_is_minimised_over_lambda() -> None:
    tau, steps, eps, delta = 0.1, 100, 2.0, 1e-5
    bound = fedls_noise_multiplier(
        sampling_ratio=tau, steps=steps, epsilon=eps, delta=delta, sampling="poisson"
    )

    def nu(lam: float, c: float) -> float:
        return (tau / eps) * math.sqrt((c * steps / lam) * (math.log(1 / delta) / (1 - lam) + eps))

    grid = min(nu(i / 1000, 8.0) for i in range(1, 1000))
    assert bound.noise_multiplier <= grid + 1e-9
    assert bound.parameter is not None
    assert bound.noise_multiplier == pytest.approx(nu(bound.parameter, 8.0))
    uniform = fedls_noise_multiplier(
        sampling_ratio=tau, steps=steps, epsilon=eps, delta=delta, sampling="uniform"
    )
    assert uniform.noise_multiplier == pytest.approx(
        bound.noise_multiplier * math.sqrt(14 / 8), rel=1e-6
    )


def test_simple_gaussian_bound_and_its_condition() -> None:
    b = simple_gaussian_noise_multiplier(epsilon=0.5, delta=1e-5, compositions=10)
    assert b.noise_multiplier == pytest.approx(math.sqrt(2 * math.log(1.25 * 10 / 1e-5)) * 10 / 0.5)
    assert b.valid is True
    assert (
        simple_gaussian_noise_multiplier(epsilon=20.0, delta=1e-5, compositions=10).valid is False
    )
    assert simple_gaussian_epsilon(
        noise_multiplier=b.noise_multiplier, compositions=10, delta=1e-5
    ) == pytest.approx(0.5)


def test_generic_shape_voting() -> None:
    def make(sigma: float) -> VotingEvent:
        return VotingEvent(queries=500, sigma=sigma, level="instance", k=4)

    sigma, report = calibrate_noise_multiplier(make, target_epsilon=1.5, delta=1e-6)
    assert report.epsilon <= 1.5
    assert report.method == "analytic_gaussian"
    assert compute_epsilon(make(sigma * 0.998), delta=1e-6).epsilon > 1.5


def test_unreachable_target_and_bad_inputs() -> None:
    with pytest.raises(CalibrationError, match="no noise multiplier"):
        calibrate(target_epsilon=1e-9, delta=1e-12, steps=10)
    with pytest.raises(InvalidParameterError):
        calibrate(target_epsilon=-1.0, delta=1e-5)
    with pytest.raises(InvalidParameterError):
        calibrate(target_epsilon=1.0, delta=1e-5, sampling_rate=0.0)
    with pytest.raises(InvalidParameterError):
        calibrate(target_epsilon=1.0, delta=1e-5, steps=0)


def test_huge_target_returns_a_small_multiplier_that_meets_it() -> None:
    result = calibrate(target_epsilon=1e4, delta=1e-5, steps=1)
    assert result.epsilon <= 1e4
    assert result.noise_multiplier < 0.1
