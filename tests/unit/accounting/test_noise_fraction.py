"""``DpEvent.with_noise_fraction``: the event of the noise an agent can verify is in a sum
(docs/accounting.md#what-the-agent-can-verify)."""

from __future__ import annotations

import math

import pytest

from dpfl.accounting import (
    ComposedEvent,
    DataDependentVotingEvent,
    GaussianEvent,
    InvalidEventError,
    NoPrivacyEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    compute_epsilon,
)
from dpfl.accounting.event_protocol import DpEvent

SKELLAM = SkellamEvent(mu=4.0e6, l1_sensitivity=2.0e4, l2_sensitivity=1.0e3, dimension=650)
EVENTS: dict[str, DpEvent] = {
    "gaussian": GaussianEvent(sigma=2.0, sensitivity=1.0),
    "skellam": SKELLAM,
    "voting": VotingEvent(queries=50, sigma=40.0, level="agent"),
    "poisson": PoissonSampledEvent(0.1, GaussianEvent(sigma=1.2)),
    "wor": SampledWithoutReplacementEvent(100, 10, GaussianEvent(sigma=3.0, sensitivity=2.0)),
    "steps": SelfComposedEvent(PoissonSampledEvent(0.05, SKELLAM), 20),
    "composed": ComposedEvent((GaussianEvent(sigma=2.0), SKELLAM)),
}


def test_the_fraction_scales_the_noise_variance() -> None:
    assert GaussianEvent(sigma=2.0).with_noise_fraction(0.25) == GaussianEvent(sigma=1.0)
    scaled = SKELLAM.with_noise_fraction(0.1)
    assert isinstance(scaled, SkellamEvent)
    assert scaled.mu == pytest.approx(4.0e5)
    assert (scaled.l1_sensitivity, scaled.l2_sensitivity, scaled.dimension) == (2.0e4, 1.0e3, 650)
    voting = VotingEvent(queries=5, sigma=10.0, level="instance", k=3).with_noise_fraction(0.01)
    assert voting == VotingEvent(queries=5, sigma=1.0, level="instance", k=3)
    steps = EVENTS["steps"].with_noise_fraction(0.5)
    assert steps == SelfComposedEvent(
        PoissonSampledEvent(0.05, SKELLAM.with_noise_fraction(0.5)), 20
    )
    assert NoPrivacyEvent().with_noise_fraction(0.3) == NoPrivacyEvent()


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_the_whole_noise_is_the_event_and_less_noise_costs_more(name: str) -> None:
    event = EVENTS[name]
    assert event.with_noise_fraction(1.0) == event
    figures = [
        compute_epsilon(event.with_noise_fraction(f), delta=1e-5).epsilon for f in (1.0, 0.5, 0.1)
    ]
    assert figures[0] < figures[1] < figures[2]


def test_one_share_of_n_is_the_event_of_that_share() -> None:
    # N agents each add Sk(μ/N): one share alone is Sk(μ/N) on the same query
    n = 30
    share = SkellamEvent(SKELLAM.mu / n, SKELLAM.l1_sensitivity, SKELLAM.l2_sensitivity, 650)
    alone = SKELLAM.with_noise_fraction(1.0 / n)
    assert isinstance(alone, SkellamEvent)
    assert alone.mu == pytest.approx(share.mu, rel=1e-15)
    # Gaussian shares: σ/√N each
    gaussian = GaussianEvent(sigma=6.0, sensitivity=1.0).with_noise_fraction(1.0 / 36)
    assert isinstance(gaussian, GaussianEvent)
    assert gaussian.sigma == pytest.approx(1.0)


def test_a_data_dependent_vote_becomes_its_guaranteed_bound() -> None:
    event = DataDependentVotingEvent(
        margins=(0.5, 0.9), num_agents=10, num_classes=10, sigma=20.0, s=1.0, level="agent"
    )
    scaled = event.with_noise_fraction(0.25)
    assert scaled == VotingEvent(queries=2, sigma=10.0, level="agent", k=1)
    assert not scaled.is_data_dependent()


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, math.nan, math.inf, "0.5", True])
def test_a_fraction_outside_zero_one_is_refused(fraction: object) -> None:
    with pytest.raises(InvalidEventError, match="fraction"):
        GaussianEvent(sigma=1.0).with_noise_fraction(fraction)  # type: ignore[arg-type]
    with pytest.raises(InvalidEventError, match="fraction"):
        EVENTS["steps"].with_noise_fraction(fraction)  # type: ignore[arg-type]
