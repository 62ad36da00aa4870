"""Canaries of PATE-FL and Private-kNN-FL: votes on one (query, class) cell of the histogram.

The released sum is the noisy vote histogram of the round's query batch (ring units). Agent
level is add/remove: a canary agent joins the population and, when present, votes ``s·A`` on its
own cell (A within one agent's per-query vote sensitivity). Instance level is replace-one: a
canary record of a real voter moves its cell by ``+s·h`` or ``−s·h`` (2h within the per-query
sensitivity; for Private-kNN-FL that is the √2·u/k of one swapped neighbour). A canary uses one
query of the Q composed ones, so the audit is sound but not tight for Q > 1. White-box only:
the final model is a student trained on argmax labels, far from any canary's cell.
"""

from __future__ import annotations

from dpfl.learning.algorithms.base import Algorithm, JobPlan
from dpfl.learning.audit.canaries import (
    ADD_REMOVE,
    REPLACE_ONE,
    CanaryDesign,
    charged_amplitude,
)
from dpfl.learning.jobs import JobSpec

__all__ = ["design"]


def design(algorithm: Algorithm, job: JobSpec, plan: JobPlan) -> CanaryDesign:
    """Vote canaries at the job's level."""
    event = algorithm.bind(job, plan).invitation_events(round_number=1, population=["canary"])[0]
    agent = job.privacy.unit == "agent"
    return CanaryDesign(
        unit="agent" if agent else "record",
        relation=ADD_REMOVE if agent else REPLACE_ONE,
        amplitude=charged_amplitude(event),
        presence_rate=1.0,
        black_box=False,
        description="votes on a (query, class) cell of their own",
    )
