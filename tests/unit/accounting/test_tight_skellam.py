"""The PLD of a one-coordinate Skellam release is an upper bound: checked against the exact
hockey-stick divergence summed over the integers, for one release and for two composed, in both
directions; and the event dispatch that uses it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from dpfl.accounting import (
    ComposedEvent,
    GaussianEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
)
from dpfl.accounting.errors import InvalidParameterError
from dpfl.accounting.tight import (
    skellam_pld,
    skellam_tail_bound,
    tight_epsilon,
    tight_method,
)


def _mass(mu: float, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(lo, hi + 1)
    return x, special.ive(np.abs(x), 2.0 * mu)


def _exact_losses(mu: float, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """The privacy loss of Sk(mu) + shift against Sk(mu) at each outcome of the shifted law,
    and its mass (support wide enough that the rest is below 1e-30)."""
    width = int(60 * math.sqrt(2 * mu)) + 60
    x, p = _mass(mu, -width, width)
    q = special.ive(np.abs(x + shift), 2.0 * mu)
    keep = (p > 0) & (q > 0)
    return np.log(p[keep]) - np.log(q[keep]), p[keep]


def _exact_delta(losses: np.ndarray, weights: np.ndarray, epsilon: float) -> float:
    return float(np.sum(weights * np.maximum(0.0, 1.0 - np.exp(epsilon - losses))))


@pytest.mark.parametrize(("mu", "shift"), [(2.0, 1), (3.0, 2), (40.0, 5)])
def test_one_release_pld_bounds_the_exact_hockey_stick(mu: float, shift: int) -> None:
    losses, weights = _exact_losses(mu, shift)
    pld = skellam_pld(mu, shift, 1e-3)
    for epsilon in (0.0, 0.1, 0.5, 1.0, 2.0):
        exact = _exact_delta(losses, weights, epsilon)
        bound = pld.get_delta_for_epsilon(epsilon)
        assert bound >= exact - 1e-15
        assert bound <= exact + 5e-3  # and close: one grid step of loss
    # the reverse pair (Sk(mu) against the shifted law) has the same curve: the PLD is symmetric
    width = int(60 * math.sqrt(2 * mu)) + 60
    x, p = _mass(mu, -width, width)
    shifted = special.ive(np.abs(x - shift), 2.0 * mu)
    keep = (p > 0) & (shifted > 0)
    reverse = np.log(p[keep]) - np.log(shifted[keep])
    for epsilon in (0.1, 1.0):
        assert pld.get_delta_for_epsilon(epsilon) >= _exact_delta(reverse, p[keep], epsilon) - 1e-15


def test_two_composed_releases_pld_bounds_the_exact_hockey_stick() -> None:
    mu, shift = 3.0, 2
    losses, weights = _exact_losses(mu, shift)
    pair = (losses[:, None] + losses[None, :]).ravel()
    mass = (weights[:, None] * weights[None, :]).ravel()
    composed = skellam_pld(mu, shift, 1e-3).self_compose(2)
    for epsilon in (0.2, 1.0, 2.0):
        exact = _exact_delta(pair, mass, epsilon)
        assert exact <= composed.get_delta_for_epsilon(epsilon) <= exact + 1e-2


def test_a_scaled_down_noise_is_caught() -> None:
    """The check above can fail: the PLD of a tenth of the noise is far below the exact
    hockey-stick of the real (smaller-noise) release."""
    losses, weights = _exact_losses(0.3, 2)
    assert skellam_pld(3.0, 2, 1e-3).get_delta_for_epsilon(1.0) < _exact_delta(losses, weights, 1.0)


def test_the_tail_bound_covers_the_exact_tail() -> None:
    for mu, k in ((2.0, 5.0), (10.0, 12.0), (50.0, 40.0)):
        x, p = _mass(mu, -2000, 2000)
        exact = float(p[np.abs(x) >= k].sum())
        assert exact <= skellam_tail_bound(mu, k) <= 1.0
    assert skellam_tail_bound(1.0, 0.0) == 1.0


def test_large_mu_matches_the_gaussian_of_the_same_variance() -> None:
    """At votes' scale (σ ≈ 7.8 votes of 2^10 units) the discrete law is within a fraction of a
    percent of the Gaussian with its variance, and far below the RDP conversion."""
    sigma, unit = 7.7758, 1024.0
    skellam = SkellamEvent(mu=(sigma * unit) ** 2 / 2.0, l1_sensitivity=unit,
                           l2_sensitivity=unit, dimension=1)  # fmt: skip
    event = ComposedEvent((SelfComposedEvent(skellam, 50),) * 2)
    report = compute_epsilon(event, delta=1e-3)
    gaussian = compute_epsilon(
        SelfComposedEvent(GaussianEvent(sigma=sigma * unit, sensitivity=unit), 100), delta=1e-3
    ).epsilon
    assert report.method == "pld"
    assert gaussian <= report.epsilon <= 1.005 * gaussian
    assert report.rdp_epsilon is not None
    assert report.epsilon < 0.92 * report.rdp_epsilon


def test_dispatch_one_coordinate_takes_the_exact_pld() -> None:
    one = SkellamEvent(mu=100.0, l1_sensitivity=3.7, l2_sensitivity=5.0, dimension=1)
    assert tight_method(SelfComposedEvent(one, 4)) == "pld"
    # the shift is the integer part of the smaller bound: 3
    direct = tight_epsilon(one, delta=1e-5, value_discretization_interval=1e-4).epsilon
    three = SkellamEvent(mu=100.0, l1_sensitivity=3.0, l2_sensitivity=3.0, dimension=1)
    assert direct == tight_epsilon(three, delta=1e-5, value_discretization_interval=1e-4).epsilon
    # several coordinates: a dominating Gaussian (test_skellam_domination.py), not this PLD
    many = SkellamEvent(mu=100.0, l1_sensitivity=3.0, l2_sensitivity=3.0, dimension=10)
    assert tight_method(many) == "analytic_gaussian"
    assert compute_epsilon(many, delta=1e-5).epsilon > compute_epsilon(three, delta=1e-5).epsilon
    # a shift below one unit moves nothing
    tiny = SkellamEvent(mu=100.0, l1_sensitivity=0.5, l2_sensitivity=0.5, dimension=1)
    assert tight_epsilon(tiny, delta=1e-5).epsilon == 0.0
    # mixed with Gaussians, both parts are composed in one PLD
    mixed = ComposedEvent((one, GaussianEvent(sigma=4.0, sensitivity=1.0)))
    assert tight_method(mixed) == "pld"
    both = compute_epsilon(mixed, delta=1e-5).epsilon
    assert both > compute_epsilon(one, delta=1e-5).epsilon
    with pytest.raises(InvalidParameterError, match="shift"):
        skellam_pld(10.0, 0, 1e-3)
