"""Which privacy event a DP-FedSGD round charges, and who adds how much noise for it.

The event is always S compositions of one Poisson-subsampled step; what differs is whose noise μ
stands for (:func:`shares_noise`): **central** (S = 1 under secure aggregation: the step is taken
at the public global model, so the sum is one subsampled mechanism and shares are split),
**local** (S > 1 by default, or no secure aggregation: each agent adds the whole μ and its own
run is charged), or **sum-dominating** (an operator opt-in whose figure is not a bound for S > 1,
kept only as the labelled claim :data:`CLAIM_LABEL`; each agent's own share is charged,
:func:`agent_event`). Why: docs/accounting.md#c-dp-fedsgd-with-several-local-steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Literal

from dpfl.accounting import (
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
)
from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.algorithms.parts import common
from dpfl.mechanisms.noise import NoiseKind

__all__ = [
    "ACCOUNTINGS",
    "CENTRAL",
    "CLAIM_LABEL",
    "LOCAL",
    "SUM_DOMINATING",
    "accounting_mode",
    "agent_event",
    "agent_noise_floor",
    "shares_noise",
]

#: The job's ``privacy.accounting`` values (and the task's ``accounting`` parameter).
ACCOUNTINGS = ("provable", "sum-dominating")
AccountingMode = Literal["central", "local", "sum-dominating"]
CENTRAL: Final = "central"
LOCAL: Final = "local"
SUM_DOMINATING: Final = "sum-dominating"

#: How every view names the sum-dominating figure: a claim, never a bound.
CLAIM_LABEL = (
    "claim of the multi-step DP-FedSGD recipe (the honest agents' summed noise): NOT a proven "
    "bound for local_steps > 1, never charged or budgeted; the guaranteed epsilon is each "
    "agent's own-noise charge"
)


def accounting_mode(
    *, accounting: str, local_steps: int, secure_aggregation: bool
) -> AccountingMode:
    """The round's accounting mode (module docstring) from the job's choice, S and masking.

    Both sides derive it with this one function: the coordinator from the job, the agent from
    the task it was sent.

    Raises:
        AlgorithmError: an unknown choice, or ``sum-dominating`` where it means nothing (no
            secure aggregation, or S = 1).
    """
    if accounting not in ACCOUNTINGS:
        raise AlgorithmError(f"accounting must be one of {list(ACCOUNTINGS)}, got {accounting!r}")
    if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
        raise AlgorithmError(f"local_steps must be an integer >= 1, got {local_steps!r}")
    if accounting == SUM_DOMINATING and (not secure_aggregation or local_steps == 1):
        raise AlgorithmError(
            "the sum-dominating accounting needs secure aggregation and local_steps > 1 "
            f"(got secure_aggregation={secure_aggregation}, local_steps={local_steps})"
        )
    if not secure_aggregation:
        return LOCAL
    if local_steps == 1:
        return CENTRAL
    return LOCAL if accounting == "provable" else SUM_DOMINATING


def shares_noise(mode: str) -> bool:
    """Whether the event's noise is split over the honest agents (central, sum-dominating) or
    added whole by every agent (local)."""
    return mode != LOCAL


def agent_noise_floor(
    *,
    kind: NoiseKind,
    total: float,
    honest_fraction: float,
    population: int,
    dropout_fraction: float,
) -> float:
    """The smallest per-agent share a sum-dominating round gives: the split of ``total`` over
    the plan's whole population (``common.per_agent_noise`` with N = population and its
    survivor floor ⌈N(1−δ)⌉); any smaller set of participants gets a larger share.

    Raises:
        AlgorithmError: bad arguments (see ``common.per_agent_noise``).
    """
    survivors = max(1, math.ceil(population * (1.0 - dropout_fraction)))
    return common.per_agent_noise(
        kind=kind,
        total=total,
        secure_aggregation=True,
        honest_fraction=honest_fraction,
        min_survivors=survivors,
        participants=population,
        dropout_fraction=dropout_fraction,
    ).parameter


def agent_event(
    events: Sequence[DpEvent], *, mode: str, steps: int, agent_noise: float | None
) -> tuple[DpEvent, ...]:
    """The guaranteed event of a round whose step event is ``events`` (module docstring): as is
    in the central and local modes; in the sum-dominating mode the same S steps with μ replaced
    by ``agent_noise``, the agent's own share. The coordinator charges and announces it, and the
    agent records it.

    Raises:
        AlgorithmError: not one S-fold step event, or a sum-dominating task without
            ``agent_noise``.
    """
    if len(events) != 1:
        raise AlgorithmError(f"a dp-fedsgd round charges one event, {len(events)} claimed")
    (event,) = events
    if not isinstance(event, SelfComposedEvent) or event.count != steps:
        raise AlgorithmError(f"expected {steps} compositions of one step, got {event!r}")
    if mode != SUM_DOMINATING:
        return (event,)
    if agent_noise is None:
        raise AlgorithmError("a sum-dominating task must state params.agent_noise")
    step = event.event
    rate = step.sampling_rate if isinstance(step, PoissonSampledEvent) else None
    inner = step.event if isinstance(step, PoissonSampledEvent) else step
    own: DpEvent
    if isinstance(inner, SkellamEvent):
        own = SkellamEvent(
            mu=agent_noise,
            l1_sensitivity=inner.l1_sensitivity,
            l2_sensitivity=inner.l2_sensitivity,
            dimension=inner.dimension,
        )
    elif isinstance(inner, GaussianEvent):
        own = GaussianEvent(sigma=agent_noise, sensitivity=inner.sensitivity)
    else:
        raise AlgorithmError(f"a dp-fedsgd step is Skellam or Gaussian, got {inner!r}")
    return (SelfComposedEvent(PoissonSampledEvent(rate, own) if rate is not None else own, steps),)
