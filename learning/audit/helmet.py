"""Canaries of DP-Helmet: replace-one units (a record, or a whole agent's data) whose effect on
the agent's K models is a Dirac in ONE release (a class block one-vs-rest, the softmax block).

DP-Helmet's charge is replace-one at either level: the per-release sensitivity bounds how far
one agent's averaged model moves when one record (or all its data) is replaced. A canary is
always present; included it moves its block's coordinate by ``+s·h``, excluded by ``−s·h``
(2h ≤ the charged per-release L2 and L1 sensitivities). Record canaries ride in a real
participant's vector; agent canaries are extra agents of the one round. One-vs-rest, a canary
touches one of the K class releases, so it measures at most one K-th of the composed charge: the
audit is sound but not tight for K > 1; the softmax block is one release, measured whole.
White-box only (the released model is the sum itself, so black-box adds nothing here).
"""

from __future__ import annotations

from dpfl.learning.algorithms.base import Algorithm, JobPlan
from dpfl.learning.audit.canaries import REPLACE_ONE, CanaryDesign, charged_amplitude
from dpfl.learning.jobs import JobSpec

__all__ = ["design"]


def design(algorithm: Algorithm, job: JobSpec, plan: JobPlan) -> CanaryDesign:
    """Replace-one Dirac canaries at the job's unit."""
    event = algorithm.bind(job, plan).invitation_events(round_number=1, population=["canary"])[0]
    return CanaryDesign(
        unit=job.privacy.unit,
        relation=REPLACE_ONE,
        amplitude=charged_amplitude(event),
        presence_rate=1.0,
        black_box=False,
        description="replace-one Dirac canaries in one release of the released models",
    )
