"""Every ε is an upper bound: over random plans (sampling rate q, noise multiplier z, dimension d,
accepted agents N, survivors s, dropout fraction, adaptive clipping on or off), the round charged
to a population member is never below the true Rényi divergence of what the round releases.

What is released comes from the code: the per-agent share (``per_agent_noise``), the number of
shares in the released sum (the survivors' and those ``restore_dropped_noise`` adds, measured
separately in ``test_dropout_noise.py``), and how far one agent moves the released count
(``read_sum``). The true divergence is computed from the Skellam mass functions
(``support.renyi_reference``), the charge with ``dpfl.accounting`` at the ledger's integer orders.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.renyi_reference import poisson_add_1d, poisson_remove

from dpfl.accounting import ORDERS, PoissonSampledEvent, SkellamEvent, rdp_curve
from dpfl.learning.algorithms.parts.adaptive_clip import (
    AdaptiveClippingPlan,
    count_weight,
    encoding_clip,
    read_sum,
)
from dpfl.learning.algorithms.parts.common import per_agent_noise
from dpfl.mechanisms.noise import NoiseKind
from dpfl.secagg import RoundParameters, ThreatModel

# integer orders of the ledger's grid where the tilted pmf stays inside float range at z ≥ 0.8
CHECKED_ORDERS = (2, 3, 4, 6, 8, 12, 16)
assert all(float(a) in ORDERS for a in CHECKED_ORDERS)


def _released_mu(accepted: int, summed: int, *, mu: float, dropout: float) -> float:
    """The Skellam parameter of the released sum's noise: the share of ``accepted`` agents,
    ``summed`` of them in the secure sum and the others' restored by the coordinator."""
    probe = RoundParameters.choose(
        num_clients=accepted,
        vector_length=8,
        ring_bits=64,
        corrupt_fraction=0.0,
        dropout_fraction=dropout,
        model=ThreatModel.SEMI_HONEST,
    )
    assert probe.min_survivors <= summed <= accepted
    share = per_agent_noise(
        kind=NoiseKind.SKELLAM,
        total=mu,
        secure_aggregation=True,
        honest_fraction=1.0,
        min_survivors=probe.min_survivors,
        participants=accepted,
        dropout_fraction=dropout,
    ).parameter
    restored = accepted - summed
    return (summed + restored) * share


def _min_survivors(accepted: int, dropout: float) -> int:
    return RoundParameters.choose(
        num_clients=accepted,
        vector_length=8,
        ring_bits=64,
        corrupt_fraction=0.0,
        dropout_fraction=dropout,
        model=ThreatModel.SEMI_HONEST,
    ).min_survivors


def _count_move(clip: float, weight: float, expected: float) -> float:
    """How far one agent moves the count the coordinator releases, in agents."""
    plan = AdaptiveClippingPlan(
        update_clip=clip,
        count_weight=weight,
        count_noise=1.0,
        target_quantile=0.5,
        clip_learning_rate=0.2,
    )
    others = np.array([0.0, 3.0 * weight])
    _, without = read_sum(others, plan, round_clip=1.0, expected_participants=expected)
    return max(
        abs(
            read_sum(
                others + np.array([0.0, bit * weight]),
                plan,
                round_clip=1.0,
                expected_participants=expected,
            )[1]
            - without
        )
        for bit in (0.5, -0.5)
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    rate=st.sampled_from([1.0, 0.5, 0.3, 0.1, 0.02]),
    z=st.floats(0.8, 3.0),
    log_dimension=st.floats(0.0, math.log(20_000.0)),
    accepted=st.integers(3, 40),
    dropout=st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.3]),
    survivor_pick=st.floats(0.0, 1.0),
    agent_survives=st.booleans(),
    adaptive=st.booleans(),
    sensitivity=st.integers(3, 30),
)
def test_the_charge_bounds_the_true_divergence_of_the_round(
    rate: float,
    z: float,
    log_dimension: float,
    accepted: int,
    dropout: float,
    survivor_pick: float,
    agent_survives: bool,
    adaptive: bool,
    sensitivity: int,
) -> None:
    dimension = max(2, round(math.exp(log_dimension)))
    mu = (z * sensitivity) ** 2 / 2.0
    # survivors with the agent (s) and the same others without it, where both rounds complete
    floor_with, floor_without = (
        _min_survivors(accepted, dropout),
        _min_survivors(accepted - 1, dropout),
    )
    if agent_survives:
        low, high = max(floor_with, floor_without + 1), accepted
    else:  # the agent accepted and dropped: the same others are summed on both sides
        low, high = max(floor_with, floor_without), accepted - 1
    assume(low <= high)
    summed = low + round(survivor_pick * (high - low))
    summed_without = summed - 1 if agent_survives else summed
    mu_with = _released_mu(accepted, summed, mu=mu, dropout=dropout)
    mu_without = _released_mu(accepted - 1, summed_without, mu=mu, dropout=dropout)
    # the agent's shift, in the charged integer units (Δ₂ = sensitivity)
    if adaptive:
        weight = count_weight(1.0, noise_multiplier=z, count_noise=max(z, 1.0))
        scale = sensitivity / encoding_clip(1.0, weight)
        move = _count_move(1.0, weight, expected=rate * 100.0)
        shifts = [math.floor(scale), math.floor(scale * weight * move)]
    else:
        shifts = [sensitivity]
    if not agent_survives:
        shifts = []
    shifts = [s for s in shifts if s != 0]
    l1 = max(1, sum(shifts))
    inner = SkellamEvent(mu, l1, sensitivity, dimension)
    event = inner if rate == 1.0 else PoissonSampledEvent(rate, inner)
    charged = rdp_curve(event, [float(a) for a in CHECKED_ORDERS])
    for alpha, bound in zip(CHECKED_ORDERS, charged, strict=True):
        true = poisson_remove(alpha, rate, mu_with, mu_without, shifts, dimension)
        assert true <= bound * (1 + 1e-9) + 1e-12, (alpha, true, bound)
        if len(shifts) <= 1 and rate < 1.0 and math.isclose(mu_with, mu_without, rel_tol=1e-12):
            # the other coordinates are the same law on both sides, so one dimension is exact
            added = poisson_add_1d(float(alpha), rate, mu_with, mu_without, sum(shifts))
            assert added <= bound * (1 + 1e-9) + 1e-12, (alpha, added, bound)
