"""How a round releases the sample :meth:`Algorithm.select` drew: skipped, the coordinator's noise
alone, or summed (securely from two clients, in the plain transport otherwise).

docs/accounting.md, "Client sampling: every sample is released", proves why. The policy is pure
(the algorithm, the job, its plan and a count), so the coordinator's round engine, the audit's
simulation (:mod:`dpfl.learning.audit.run`) and the test harness release exactly the same
mechanism, and the ledger each of them keeps charges the same rounds.
"""

from __future__ import annotations

import enum

from dpfl.learning.algorithms.base import Algorithm, JobPlan
from dpfl.learning.jobs import JobSpec

__all__ = ["Release", "minimum_accepted", "release_for", "secure_sum"]


class Release(enum.Enum):
    """How an attempt releases its sample."""

    SKIP = "skip"  # nothing sent or charged (only where the charge credits no sampling)
    NOISE_ALONE = "noise_alone"  # the empty sample: M(∅), the coordinator's noise alone
    ROUND = "round"  # invite the sample and sum what the accepting agents send


def release_for(algorithm: Algorithm, spec: JobSpec, plan: JobPlan, *, invited: int) -> Release:
    """How an attempt with ``invited`` sampled clients proceeds: when
    :meth:`Algorithm.releases_every_sample` holds, no sample is skipped."""
    if algorithm.releases_every_sample(spec, plan):
        return Release.ROUND if invited > 0 else Release.NOISE_ALONE
    return Release.ROUND if invited >= minimum_accepted(algorithm, spec, plan) else Release.SKIP


def minimum_accepted(algorithm: Algorithm, spec: JobSpec, plan: JobPlan) -> int:
    """The fewest accepting clients an attempt is summed with: two under secure aggregation
    (its smallest graph), one without it or when every sample is released (a lone agent is
    summed in the plain transport, carrying the whole noise)."""
    if not spec.secagg.enabled or algorithm.releases_every_sample(spec, plan):
        return 1
    return 2


def secure_sum(spec: JobSpec, *, summands: int) -> bool:
    """Whether ``summands`` accepted clients are summed by secure aggregation; otherwise the
    plain transport sums them, each encoding with ``min_survivors = 1``."""
    return spec.secagg.enabled and summands >= 2
