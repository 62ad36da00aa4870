"""The typed state a round passes between its steps (:mod:`dpfl.learning.rounds.driver`)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpfl.accounting import DpEvent
from dpfl.learning.algorithms.base import (
    AnyCoordinator,
    ClientCharge,
    CoordinatorData,
    JobPlan,
    RoundOutcome,
    RoundTask,
)
from dpfl.learning.algorithms.parts.sample_release import Release
from dpfl.learning.jobs import JobSpec
from dpfl.mechanisms import EncodingConfig
from dpfl.secagg import RoundParameters

__all__ = [
    "Acceptance",
    "Commitment",
    "Invitation",
    "RoundAborted",
    "RoundEnd",
    "RoundJob",
    "SumSetup",
    "Summation",
    "Summed",
]


class RoundAborted(Exception):  # noqa: N818 (a round's end, not a bug)
    """The round ends without a release; ``reason`` says why (kept in the round record)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RoundJob:
    """What every round of a job shares: the algorithm bound to the job and its plan."""

    job_id: str
    coordinator: AnyCoordinator
    data: CoordinatorData

    @property
    def spec(self) -> JobSpec:
        return self.coordinator.spec

    @property
    def plan(self) -> JobPlan:
        return self.coordinator.plan


@dataclass(frozen=True, slots=True)
class Invitation:
    """What the invited clients are asked: the task and the privacy events it claims."""

    number: int
    task: RoundTask
    invited: tuple[str, ...]
    events: tuple[DpEvent, ...]


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Who accepted the invitation; ``noiseless``: those of them whose vectors add no noise (an
    audit's canaries; the round's noise is shared by the others)."""

    accepted: tuple[str, ...]
    noiseless: frozenset[str] = frozenset()


class Summation(enum.Enum):
    """How the accepted clients' vectors become one sum."""

    SECURE = "secure"  # secure aggregation (Bell et al.), two clients or more
    PLAIN = "plain"  # each vector read as it arrives: no secure aggregation, or one client
    NOISE_ALONE = "noise_alone"  # no client: the coordinator draws the sum's noise itself


@dataclass(frozen=True, slots=True)
class SumSetup:
    """The summation of a round: its kind, the agents that carry its noise, the encoding they
    use, and for secure aggregation its parameters, which never read the encoding: so here its
    ring must be theirs and n vectors must not wrap it (``ParameterError``, ``EncodingOverflow``).
    """

    kind: Summation
    accepted: tuple[str, ...]
    vector_length: int
    encoding: EncodingConfig
    params: RoundParameters | None = None
    threat_model: str = ""

    def __post_init__(self) -> None:
        if (p := self.params) is not None:
            self.encoding.check_round(ring_bits=p.ring_bits, summands=p.num_clients)

    @property
    def min_survivors(self) -> int:
        return 1 if self.params is None else self.params.min_survivors


@dataclass(frozen=True, slots=True)
class Commitment:
    """What the ledger commits for a round: the charges of ``participants``' sum, (secure
    aggregation) how many dropouts' noise shares the release will carry, and f₁, the fraction
    of the charged noise's variance one agent's share carries (``driver.own_noise_fraction``;
    None only where a caller builds a commitment without a setup)."""

    number: int
    participants: tuple[str, ...]
    charges: Mapping[str, ClientCharge]
    restored_noise_shares: int | None = None
    own_noise_fraction: float | None = None


@dataclass(frozen=True, slots=True)
class Summed:
    """The ring sum of ``summed``' vectors, as the summation revealed it."""

    total: npt.NDArray[np.uint64]
    summed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RoundEnd:
    """How a round ended: skipped (``reason``), or released (``aggregate``, decoded) and
    finished (``outcome``)."""

    release: Release
    reason: str = ""
    accepted: tuple[str, ...] = ()
    summed: tuple[str, ...] = ()
    encoding: EncodingConfig | None = None
    aggregate: npt.NDArray[np.float64] | None = None
    outcome: RoundOutcome | None = None
    finish_seconds: float = 0.0
