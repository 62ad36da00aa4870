"""Canaries for white-box and black-box audits: what one canary adds to a round's sum.

A canary is one unit of the job's protected kind whose contribution is a Dirac vector at its own
coordinate, with an amplitude read off the event the round charges, so "canary in / canary out"
is a neighbouring pair of the charged relation and the audit's lower bound applies to the charged
ε. Its score uses only the released aggregates. Details: docs/audit.md#canaries-learningaudit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpfl.accounting import (
    ComposedEvent,
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
)
from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "ADD_REMOVE",
    "REPLACE_ONE",
    "CanaryDesign",
    "CanarySet",
    "TooManyCanariesError",
    "charged_amplitude",
]

ADD_REMOVE = "add-remove"
REPLACE_ONE = "replace-one"


def charged_amplitude(event: DpEvent) -> int:
    """The largest integer Dirac amplitude within the charged event's per-unit sensitivity.

    Walks composition and sampling wrappers down to the Skellam or Gaussian release.

    Raises:
        AlgorithmError: an event without a Skellam/Gaussian release (nothing to read).
    """
    inner = event
    while True:
        if isinstance(
            inner, SelfComposedEvent | PoissonSampledEvent | SampledWithoutReplacementEvent
        ):
            inner = inner.event
        elif isinstance(inner, ComposedEvent) and inner.events:
            inner = inner.events[0]
        else:
            break
    if isinstance(inner, SkellamEvent):
        return math.floor(min(inner.l1_sensitivity, inner.l2_sensitivity))
    if isinstance(inner, GaussianEvent):
        return math.floor(inner.sensitivity)
    raise AlgorithmError(
        f"cannot read a canary amplitude from a {type(inner).__name__}: the audit needs a "
        "Skellam or Gaussian release"
    )


class TooManyCanariesError(AlgorithmError):
    """More canaries than distinct coordinates to put them on; ``available`` is how many fit."""

    def __init__(self, count: int, available: int) -> None:
        super().__init__(
            f"{count} canaries need {count} distinct coordinates; {available} are available "
            f"(audit with at most {available} canaries)"
        )
        self.count = count
        self.available = available


@dataclass(frozen=True, slots=True)
class CanaryDesign:
    """How an algorithm family's canaries enter a round.

    Attributes:
        unit: "record" (canaries ride in a real agent's contribution) or "agent" (canary agents
            join the population and go through the algorithm's own client selection).
        relation: :data:`ADD_REMOVE` or :data:`REPLACE_ONE`.
        amplitude: A, in ring units (:func:`charged_amplitude`).
        presence_rate: for record canaries, the probability that a canary of a participating
            agent is in that round's sum (the agent's own record sampling rate; 1 otherwise).
        black_box: the final model alone carries the canaries' coordinates (a model update that
            is a linear image of the aggregates), so a black-box audit is possible.
        description: one line for reports and docs.
    """

    unit: str
    relation: str
    amplitude: int
    presence_rate: float
    black_box: bool
    description: str


@dataclass(frozen=True)
class CanarySet:
    """m canaries: coordinate, sign, inclusion bit (Bernoulli(1/2) from a CSPRNG), and, for
    record canaries, the index of the real agent holding each one."""

    coordinates: npt.NDArray[np.int64]
    signs: npt.NDArray[np.int64]
    included: npt.NDArray[np.bool_]
    hosts: npt.NDArray[np.int64]

    @classmethod
    def draw(
        cls,
        *,
        count: int,
        dimension: int,
        agents: int,
        stream: RandomStream,
        allowed: npt.NDArray[np.int64] | None = None,
    ) -> CanarySet:
        """Draw ``count`` canaries on distinct coordinates of a ``dimension``-long sum (among
        ``allowed`` ones when given: a public choice, e.g. coordinates no real data touches).

        Raises:
            TooManyCanariesError: more canaries than coordinates.
            AlgorithmError: fewer than two canaries, or coordinates outside the vector.
        """
        pool = (
            np.arange(dimension, dtype=np.int64)
            if allowed is None
            else np.unique(np.asarray(allowed, dtype=np.int64))
        )
        if pool.size and (pool[0] < 0 or pool[-1] >= dimension):
            raise AlgorithmError(f"canary coordinates must lie in [0, {dimension})")
        if count < 2:
            raise AlgorithmError(f"an audit needs at least 2 canaries, got {count}")
        if count > pool.size:
            raise TooManyCanariesError(count, int(pool.size))
        coordinates = pool[np.argsort(stream.uint64(int(pool.size)), kind="stable")[:count]]
        bits = stream.below(2, 2 * count)
        return cls(
            coordinates=coordinates.astype(np.int64),
            signs=np.where(bits[:count] == 1, 1, -1).astype(np.int64),
            included=bits[count:] == 1,
            hosts=stream.below(max(1, agents), count).astype(np.int64),
        )

    @property
    def count(self) -> int:
        return int(self.coordinates.size)
