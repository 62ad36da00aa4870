"""Canaries of DP-FedSGD: canary RECORDS whose clipped, scaled, rounded gradient is a Dirac.

Each canary lives in one real agent's data; in a round its agent takes part in, it is in that
step's Poisson batch with the agent's own rate p, and then adds its integer gradient to the
agent's step sum. With ONE local step the agent's vector is exactly ``I_1 + n_1``, so adding the
canary's integer vector to the round's sum is the same release as training on it (the local
model after the step is never released); with several local steps the canary would also move
the agent's later gradients, which a Dirac added to the sum does not model, so the design
refuses S > 1 (the multi-step case is audited with an explicit construction instead).
Black-box: the final model minus the public initial model at the canaries' coordinates (each
round moves the model by ``−γ·A/(B·N)``, a linear image of the aggregate).
"""

from __future__ import annotations

from dpfl.learning.algorithms.base import Algorithm, AlgorithmError, JobPlan
from dpfl.learning.algorithms.dp_fedsgd import DpFedSgdJob
from dpfl.learning.audit.canaries import ADD_REMOVE, CanaryDesign, charged_amplitude
from dpfl.learning.jobs import JobSpec

__all__ = ["design"]


def design(algorithm: Algorithm, job: JobSpec, plan: JobPlan) -> CanaryDesign:
    """Canary records with a Dirac gradient of the charged per-record sensitivity.

    Raises:
        AlgorithmError: more than one local step.
    """
    if not isinstance(job, DpFedSgdJob):
        raise AlgorithmError(f"the DP-FedSGD canary design cannot audit {job.algorithm}")
    if job.params.local_steps != 1:
        raise AlgorithmError(
            f"Dirac gradient canaries model DP-FedSGD exactly for one local step only; the job "
            f"has local_steps={job.params.local_steps}"
        )
    event = algorithm.bind(job, plan).invitation_events(round_number=1, population=["canary"])[0]
    return CanaryDesign(
        unit="record",
        relation=ADD_REMOVE,
        amplitude=charged_amplitude(event),
        presence_rate=float(job.params.batch_sampling_rate),
        black_box=True,
        description="canary records, Dirac gradient of the clip norm on a coordinate of their own",
    )
