"""Monotonicity properties (hypothesis): more noise never costs more; more sampling or steps never
cost less. Checked per order on the curves, and on ε."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.accounting import (
    DataDependentVotingEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    compute_epsilon,
    epsilon_from_rdp,
    gaussian_epsilon,
    guaranteed_event,
    rdp_curve,
)

RATES = st.floats(min_value=1e-4, max_value=1.0)
MULTIPLIERS = st.floats(min_value=0.3, max_value=20.0)
FAST = settings(max_examples=25, deadline=None)


def _sgm(q: float, z: float) -> PoissonSampledEvent:
    return PoissonSampledEvent(q, GaussianEvent.from_multiplier(z))


def _le(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(a <= b * (1 + 1e-9) + 1e-300))


@FAST
@given(q=RATES, z=MULTIPLIERS, factor=st.floats(min_value=1.01, max_value=3.0))
def test_more_noise_never_costs_more(q: float, z: float, factor: float) -> None:
    assert _le(rdp_curve(_sgm(q, z * factor)), rdp_curve(_sgm(q, z)))
    e1 = compute_epsilon(_sgm(q, z), delta=1e-5, tight=False).epsilon
    e2 = compute_epsilon(_sgm(q, z * factor), delta=1e-5, tight=False).epsilon
    assert e2 <= e1 * (1 + 1e-9)


@FAST
@given(q=st.floats(min_value=1e-4, max_value=0.9), z=MULTIPLIERS, factor=st.floats(1.01, 5.0))
def test_higher_rate_never_costs_less(q: float, z: float, factor: float) -> None:
    q2 = min(1.0, q * factor)
    assert _le(rdp_curve(_sgm(q, z)), rdp_curve(_sgm(q2, z)))


@FAST
@given(q=RATES, z=MULTIPLIERS, steps=st.integers(1, 10_000), extra=st.integers(1, 10_000))
def test_more_steps_never_cost_less(q: float, z: float, steps: int, extra: int) -> None:
    a = compute_epsilon(SelfComposedEvent(_sgm(q, z), steps), delta=1e-6, tight=False)
    b = compute_epsilon(SelfComposedEvent(_sgm(q, z), steps + extra), delta=1e-6, tight=False)
    assert a.epsilon <= b.epsilon


@FAST
@given(
    mu=st.floats(min_value=0.5, max_value=1e6),
    factor=st.floats(min_value=1.01, max_value=10.0),
    l2=st.floats(min_value=0.5, max_value=100.0),
    dim=st.integers(1, 10_000),
)
def test_skellam_more_noise_never_costs_more(mu: float, factor: float, l2: float, dim: int) -> None:
    def event(m: float, sens: float) -> SkellamEvent:
        return SkellamEvent(
            mu=m, l1_sensitivity=sens * dim**0.5, l2_sensitivity=sens, dimension=dim
        )

    assert _le(rdp_curve(event(mu * factor, l2)), rdp_curve(event(mu, l2)))
    assert _le(rdp_curve(event(mu, l2)), rdp_curve(event(mu, l2 * factor)))


@FAST
@given(mu=st.floats(min_value=0.05, max_value=30.0), factor=st.floats(min_value=1.0, max_value=3.0))
def test_exact_gaussian_epsilon_grows_with_mu(mu: float, factor: float) -> None:
    # gaussian_epsilon steps up from the root by a relative 1e-12 until the inequality holds, so
    # two values equal up to that step may come out in either order.
    larger = gaussian_epsilon(mu * factor, 1e-5)
    assert gaussian_epsilon(mu, 1e-5) <= larger * (1 + 4e-12) + 1e-12


@FAST
@given(
    margins=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=30),
    sigma=st.floats(min_value=0.2, max_value=50.0),
    n=st.integers(1, 500),
    c=st.integers(2, 100),
    k=st.integers(1, 20),
    level=st.sampled_from(["agent", "instance"]),
)
def test_data_dependent_never_exceeds_the_guarantee(
    margins: list[float], sigma: float, n: int, c: int, k: int, level: str
) -> None:
    event = DataDependentVotingEvent(tuple(margins), n, c, sigma, 1.0 / k, level)  # type: ignore[arg-type]
    dd = rdp_curve(event)
    guaranteed = rdp_curve(guaranteed_event(event))
    assert _le(dd, guaranteed)
    assert np.all(dd >= 0)
    dd_eps = epsilon_from_rdp(dd, delta=1e-5)[0]
    assert dd_eps <= epsilon_from_rdp(guaranteed, delta=1e-5)[0] * (1 + 1e-12)
