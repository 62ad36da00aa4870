"""A white-box audit of the multi-step counterexample (``support.multistep_counterexample``)
proves more leakage than DP-FedSGD's sum-dominating accounting would charge for S = 2 local
steps; the same audit of one local step stays below that step's charge."""

from __future__ import annotations

import numpy as np
from support.multistep_counterexample import construction, neighbouring_datasets, released_sum

from dpfl.accounting import GaussianEvent, SelfComposedEvent, compute_epsilon
from dpfl.accounting.audit import epsilon_lower_from_scores

DELTA = 1e-5
CANARIES = 2000


def _audit(steps: int, z: float, seed: int) -> tuple[float, float]:
    """ε_lower of m independent copies of the construction (one canary record each, included
    with probability 1/2), scored from the released sums, and the sum-dominating charge."""
    c = construction(noise_multiplier=z)
    d, d_prime = neighbouring_datasets(c)
    without, with_ = released_sum(c, d, steps=steps), released_sum(c, d_prime, steps=steps)
    rng = np.random.default_rng(seed)
    included = rng.random(CANARIES) < 0.5
    sigma = z * c.clip
    noise = rng.normal(0.0, np.sqrt(steps) * sigma, size=CANARIES)
    released = np.where(included, with_, without) + noise
    # the auditor knows the public baseline (every agent's data without the canary)
    scores = (released - without) * np.sign(with_ - without)
    bound = epsilon_lower_from_scores(
        scores, included, delta=DELTA, confidence=0.95, guess_counts=[CANARIES // 20, CANARIES]
    )
    charge = SelfComposedEvent(GaussianEvent(sigma=sigma, sensitivity=c.clip), steps)
    return bound.epsilon_lower, compute_epsilon(charge, delta=DELTA).epsilon


def test_two_local_steps_leak_more_than_the_sum_dominating_charge() -> None:
    lower, charged = _audit(steps=2, z=4.0, seed=1)
    assert lower > charged, (lower, charged)


def test_one_local_step_is_audited_below_its_charge() -> None:
    lower, charged = _audit(steps=1, z=4.0, seed=1)
    assert lower <= charged, (lower, charged)
