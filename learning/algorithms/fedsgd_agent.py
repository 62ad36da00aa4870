"""DP-FedSGD's agent-side checks: the task as the agent reads it, and the claimed event and the
round's encoding against it (the agent trusts neither the coordinator's task nor its arithmetic).

Invariant: a setup passes :func:`check_claim` only if the agent's noise share backs, in the
task's accounting mode (:mod:`~dpfl.learning.algorithms.fedsgd_accounting`), the event the
coordinator charges AND the event the agent records itself
(:func:`~dpfl.learning.algorithms.fedsgd_accounting.agent_event`), and the ring cannot wrap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpfl.accounting import (
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
)
from dpfl.learning.algorithms import common
from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.algorithms.fedsgd_accounting import (
    ACCOUNTINGS,
    CENTRAL,
    SUM_DOMINATING,
    accounting_mode,
)
from dpfl.learning.algorithms.integer_dpsgd import required_ring_bits
from dpfl.secagg.encoding import EncodingConfig

__all__ = ["check_claim", "parse_task"]

_SOURCE = "the encoding (clip C at scale 2^b, per record)"


def parse_task(params: Mapping[str, Any], *, algorithm: str) -> dict[str, Any]:
    """The task's parameters, typed and checked, with its accounting ``mode`` derived and
    ``agent_noise`` (sum-dominating only, else None).

    Raises:
        AlgorithmError: naming ``params.<key>``, or an accounting the task's S and masking do
            not allow.
    """
    p = common.TaskParams(params, algorithm=algorithm)
    task: dict[str, Any] = {
        "model": p.text("model"),
        "clip": p.number("clip", low=0.0),
        "local_steps": p.integer("local_steps", minimum=1),
        "batch_sampling_rate": p.number("batch_sampling_rate", low=0.0, high=1.0),
        "learning_rate": p.number("learning_rate", low=0.0),
        "expected_batch_size": p.number("expected_batch_size", low=0.0),
        "max_local_size": p.integer("max_local_size", minimum=1),
        "dimension": p.integer("dimension", minimum=1),
        "scale_bits": p.integer("scale_bits", minimum=0),
        "noise": p.text("noise", choices=tuple(common.NOISE_KINDS)),
        "secure_aggregation": p.flag("secure_aggregation"),
        "honest_fraction": p.number("honest_fraction", low=0.0, high=1.0),
        "accounting": p.text("accounting", choices=ACCOUNTINGS),
    }
    task["mode"] = accounting_mode(
        accounting=task["accounting"],
        local_steps=task["local_steps"],
        secure_aggregation=task["secure_aggregation"],
    )
    task["agent_noise"] = (
        p.number("agent_noise", low=0.0) if task["mode"] == SUM_DOMINATING else None
    )
    return task


def _claimed_total(event: DpEvent, task: Mapping[str, Any], encoding: EncodingConfig) -> float:
    """The per-step noise the claimed S-fold event was computed with, after checking its shape,
    rate and sensitivities against the task and the encoding."""
    if not isinstance(event, SelfComposedEvent) or event.count != task["local_steps"]:
        raise AlgorithmError(
            f"expected {task['local_steps']} compositions of one step, got {event!r}"
        )
    step = event.event
    rate = task["batch_sampling_rate"]
    if isinstance(step, PoissonSampledEvent):
        if step.sampling_rate != rate:
            raise AlgorithmError(
                f"the event samples records at rate {step.sampling_rate:g}, the task at {rate:g}"
            )
        step = step.event
    elif rate < 1.0:
        raise AlgorithmError("the task samples records but the event does not say so")
    d = task["dimension"]
    l1, l2 = encoding.rounded_l1_bound(d), encoding.rounded_l2_bound(d)
    if task["noise"] == "skellam":
        if not isinstance(step, SkellamEvent):
            raise AlgorithmError(f"Skellam noise but a {type(step).__name__} is claimed")
        if step.dimension != d:
            raise AlgorithmError(f"the event has dimension {step.dimension}, the task {d}")
        common.check_sensitivity("L2", step.l2_sensitivity, l2, source=_SOURCE)
        common.check_sensitivity("L1", step.l1_sensitivity, l1, source=_SOURCE)
        return step.mu
    if not isinstance(step, GaussianEvent):
        raise AlgorithmError(f"Gaussian noise but a {type(step).__name__} is claimed")
    common.check_sensitivity("L2", step.sensitivity, l2, source=_SOURCE)
    return step.sigma


def check_claim(
    task: Mapping[str, Any],
    events: Sequence[DpEvent],
    encoding: EncodingConfig,
    *,
    num_clients: int,
    min_survivors: int,
    honest_fraction: float,
) -> None:
    """Refuse unless the claim is exactly S steps of this task's release and the noise
    delivers it.

    Checks: the setup's honest fraction is the task's, ``1 ≤ min_survivors ≤ num_clients``; the
    encoding's clip and scale are the task's C and b; one event ``SelfComposedEvent(step, S)``
    whose step is Poisson-subsampled at the task's p (bare when p = 1), with the encoding's
    rounded sensitivities for d coordinates; the per-agent per-step noise of the encoding
    reaches the step's noise summed over ``t·min_survivors`` honest agents in the central mode,
    and ALONE in the local and sum-dominating modes (so a task with S > 1 whose claimed event
    rests on split noise is refused: the sum-dominating figure is a claim, never the charged
    event); in the sum-dominating mode it also reaches, alone, the ``agent_noise`` this agent's
    own ledger records; the ring holds S steps of ``num_clients`` agents of M_max records.

    Raises:
        AlgorithmError: naming the mismatch.
    """
    event = common.one_claimed_event(
        events,
        algorithm="dp-fedsgd",
        task_honest_fraction=task["honest_fraction"],
        honest_fraction=honest_fraction,
        num_clients=num_clients,
        min_survivors=min_survivors,
    )
    if encoding.clip != task["clip"] or encoding.scale_bits != task["scale_bits"]:
        raise AlgorithmError(
            f"the encoding (clip {encoding.clip:g}, scale 2^{encoding.scale_bits}) differs "
            f"from the task (clip {task['clip']:g}, scale 2^{task['scale_bits']})"
        )
    total = _claimed_total(event, task, encoding)
    kind = common.NOISE_KINDS[task["noise"]]
    mode = task["mode"]
    try:
        common.check_noise(
            encoding.noise,
            kind=kind,
            total=total,
            secure_aggregation=mode == CENTRAL,
            honest_fraction=honest_fraction,
            min_survivors=min_survivors,
        )
    except AlgorithmError as exc:
        if mode == CENTRAL or not task["secure_aggregation"]:
            raise
        raise AlgorithmError(
            f"{task['local_steps']} local steps are accounted as local DP "
            f"(privacy.accounting: {task['accounting']}): this agent's own noise must carry "
            f"the claimed event alone, but the encoding only gives it a share ({exc})"
        ) from exc
    if mode == SUM_DOMINATING:  # what this agent's own ledger records (agent_event)
        common.check_noise(
            encoding.noise,
            kind=kind,
            total=task["agent_noise"],
            secure_aggregation=False,
            honest_fraction=honest_fraction,
            min_survivors=min_survivors,
        )
    need = required_ring_bits(
        participants=num_clients,
        steps=task["local_steps"],
        max_local_size=task["max_local_size"],
        config=encoding,
    )
    if need > encoding.ring_bits:
        raise AlgorithmError(
            f"the ring would wrap: {num_clients} agents need {need} bits, the encoding has "
            f"{encoding.ring_bits}"
        )
