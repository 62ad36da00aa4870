"""Canaries of DP-FedAvg and DP-Fed-LS: canary AGENTS whose clipped update is a Dirac vector.

Canary agents join the population and go through the algorithm's own client sampling
(``select``); a sampled canary adds its update to the round's sum. They add no noise: the real
participants' shares already sum to the whole charged noise (``common.per_agent_noise`` with the
real participant count). Poisson sampling is add/remove (an excluded canary agent does not
exist); DP-Fed-LS with fixed-size ``uniform`` sampling is replace-one, so every canary agent is
in the population and an excluded one sends the opposite update. The Laplacian smoothing of
DP-Fed-LS comes after the sum (post-processing), so the white-box view is the sum itself.
Black-box: the final model's parameters minus the public initial model's, at the canaries'
coordinates (the model moves by a linear image of the aggregates; smoothing spreads it).
"""

from __future__ import annotations

from dpfl.learning.algorithms.base import Algorithm, JobPlan
from dpfl.learning.algorithms.dp_fed_ls import DpFedLsJob
from dpfl.learning.audit.canaries import ADD_REMOVE, REPLACE_ONE, CanaryDesign, charged_amplitude
from dpfl.learning.jobs import JobSpec

__all__ = ["design"]


def design(algorithm: Algorithm, job: JobSpec, plan: JobPlan) -> CanaryDesign:
    """Canary agents with a Dirac update of the charged per-agent sensitivity."""
    event = algorithm.bind(job, plan).invitation_events(round_number=1, population=["canary"])[0]
    uniform = isinstance(job, DpFedLsJob) and job.params.client_sampling == "uniform"
    return CanaryDesign(
        unit="agent",
        relation=REPLACE_ONE if uniform else ADD_REMOVE,
        amplitude=charged_amplitude(event),
        presence_rate=1.0,
        black_box=True,
        description="canary agents, Dirac update of the clip norm on a coordinate of their own",
    )
