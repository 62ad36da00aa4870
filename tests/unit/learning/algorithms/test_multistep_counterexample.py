"""DP-FedSGD with S > 1 local steps: the sum-dominating figure is not a bound (the construction
of ``support.multistep_counterexample``), and what dpfl charges instead covers it.

The first tests check the construction itself; the last ones check that a DP-FedSGD job opting
in to ``privacy.accounting: sum-dominating`` charges (coordinator and agent alike) the own-share
event, whose Rényi divergence covers the counterexample's, and never the claim, which does not.
"""

from __future__ import annotations

import math

import pytest
from support.multistep_counterexample import (
    construction,
    gaussian_rdp_of_the_sum,
    local_run,
    neighbouring_datasets,
    released_sum,
    sensitivity_of_the_sum,
)

from dpfl.accounting import GaussianEvent, SelfComposedEvent, rdp_curve
from dpfl.learning.algorithms.parts.fedsgd_accounting import SUM_DOMINATING, agent_event

ORDERS = (1.5, 2.0, 4.0, 8.0, 32.0)


def test_the_added_record_flips_every_later_gradient() -> None:
    c = construction()
    d, d_prime = neighbouring_datasets(c)
    assert len(d_prime) == len(d) + 1 == 11
    _, models = local_run(c, d)
    _, models_prime = local_run(c, d_prime)
    assert models[1] > 0 > models_prime[1]  # the local model after step 1 changes sign
    # step 1 moves by one clipped record (C); the released sum over both steps by 18·C
    assert released_sum(c, d_prime, steps=1) - released_sum(c, d, steps=1) == pytest.approx(1.0)
    assert sensitivity_of_the_sum(c) == pytest.approx(18.0 * c.clip)
    assert sensitivity_of_the_sum(c) >= 16.0 * c.clip


@pytest.mark.parametrize(("records", "clip"), [(2, 1.0), (10, 0.5), (50, 3.0)])
def test_the_move_grows_with_the_records_by_any_factor(records: int, clip: float) -> None:
    c = construction(records=records, clip=clip)
    assert sensitivity_of_the_sum(c) == pytest.approx((2 * records - 2) * clip)
    # independent of the other agents (they hold the same records on both sides)
    alone = construction(records=records, clip=clip, agents=1)
    assert sensitivity_of_the_sum(alone) == pytest.approx(sensitivity_of_the_sum(c))


def test_the_sum_dominating_figure_under_counts_the_true_divergence() -> None:
    """σ = z·C summed per step (z = 1, 100 agents): the claim charges α in total, the released
    sum's true Rényi divergence is 81·α."""
    c = construction()
    sigma = c.noise_multiplier * c.clip
    claim = SelfComposedEvent(GaussianEvent(sigma=sigma, sensitivity=c.clip), c.steps)
    charged = rdp_curve(claim, ORDERS)
    for alpha, value in zip(ORDERS, charged, strict=True):
        assert value == pytest.approx(alpha)
        truth = gaussian_rdp_of_the_sum(c, alpha)
        assert truth == pytest.approx(81.0 * alpha)
        assert truth > 60.0 * value  # not a bound, by a factor growing with n


def test_the_guaranteed_own_share_event_covers_the_counterexample() -> None:
    """What dpfl charges under the opt-in: the same S steps with the agent's own share alone
    (the split of σ² over the 100 agents), an upper bound on the true divergence."""
    c = construction()
    sigma = c.noise_multiplier * c.clip
    claim = SelfComposedEvent(GaussianEvent(sigma=sigma, sensitivity=c.clip), c.steps)
    own = sigma / math.sqrt(c.agents)
    (guaranteed,) = agent_event((claim,), mode=SUM_DOMINATING, steps=c.steps, agent_noise=own)
    assert guaranteed == SelfComposedEvent(GaussianEvent(sigma=own, sensitivity=c.clip), c.steps)
    for alpha, value in zip(ORDERS, rdp_curve(guaranteed, ORDERS), strict=True):
        assert value >= gaussian_rdp_of_the_sum(c, alpha)  # 100·α ≥ 81·α
