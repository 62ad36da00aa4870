"""How a round releases the sample :meth:`CoordinatorSide.select` drew: skipped, the
coordinator's noise alone, or summed (securely from two clients, in the plain transport
otherwise), and with whose noise: a secure sum is released with the noise shares of every
accepted agent, the dropouts' drawn by the coordinator (:func:`restore_dropped_noise`).

docs/accounting.md, "Client sampling: every sample is released" and "(b) Dropouts", prove why.
The policy is pure (the bound algorithm and a count), so the coordinator's round engine, the
audit's simulation (:mod:`dpfl.learning.audit.run`) and the test harness release exactly the
same mechanism, and the ledger each of them keeps charges the same rounds.
"""

from __future__ import annotations

import enum

import numpy as np
import numpy.typing as npt

from dpfl.learning.algorithms.base import AlgorithmError, AnyCoordinator
from dpfl.learning.jobs import JobSpec
from dpfl.mechanisms.encoding import EncodingConfig, to_ring
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "Release",
    "minimum_accepted",
    "release_for",
    "restore_dropped_noise",
    "secure_sum",
]


class Release(enum.Enum):
    """How an attempt releases its sample."""

    SKIP = "skip"  # nothing sent or charged (only where the charge credits no sampling)
    NOISE_ALONE = "noise_alone"  # the empty sample: M(∅), the coordinator's noise alone
    ROUND = "round"  # invite the sample and sum what the accepting agents send


def release_for(side: AnyCoordinator, *, invited: int) -> Release:
    """How an attempt with ``invited`` sampled clients proceeds: when
    :attr:`CoordinatorSide.releases_every_sample` holds, no sample is skipped."""
    if side.releases_every_sample:
        return Release.ROUND if invited > 0 else Release.NOISE_ALONE
    return Release.ROUND if invited >= minimum_accepted(side) else Release.SKIP


def minimum_accepted(side: AnyCoordinator) -> int:
    """The fewest accepting clients an attempt is summed with: two under secure aggregation
    (its smallest graph), one without it or when every sample is released (a lone agent is
    summed in the plain transport, carrying the whole noise)."""
    if not side.spec.secagg.enabled or side.releases_every_sample:
        return 1
    return 2


def secure_sum(spec: JobSpec, *, summands: int) -> bool:
    """Whether ``summands`` accepted clients are summed by secure aggregation; otherwise the
    plain transport sums them, each encoding with ``min_survivors = 1``."""
    return spec.secagg.enabled and summands >= 2


def restore_dropped_noise(
    total: npt.NDArray[np.uint64],
    encoding: EncodingConfig,
    *,
    accepted: int,
    summed: int,
    stream: RandomStream,
) -> npt.NDArray[np.uint64]:
    """The secure sum of ``summed`` vectors with the noise shares of the ``accepted − summed``
    accepted agents whose vectors it lacks added: one fresh draw of the encoding's per-agent
    noise for each (CSPRNG ``stream``).

    Each share is ``μ/(t·N·(1−δ))`` for the N accepted agents, so the sum of the survivors'
    shares alone moves with N and with who survived: with and without one agent the noise laws
    differ in scale, not only by a shift, a gap that grows with the dimension
    (docs/accounting.md, "(b) Dropouts and the honest fraction"). With the dropped shares
    restored the released noise is N shares, ``μ/(t(1−δ))`` whoever drops out.

    Raises:
        AlgorithmError: a count outside ``0 ≤ summed ≤ accepted``.
    """
    if isinstance(accepted, bool) or isinstance(summed, bool) or not 0 <= summed <= accepted:
        raise AlgorithmError(f"summed {summed!r} must lie in [0, accepted={accepted!r}]")
    noise = np.zeros(total.shape, dtype=np.int64)
    for _ in range(accepted - summed):
        noise += encoding.noise.sample(total.size, stream)
    out: npt.NDArray[np.uint64] = total + to_ring(noise, encoding.ring_bits)  # wraps mod 2^64
    if encoding.ring_bits < 64:
        out &= np.uint64((1 << encoding.ring_bits) - 1)
    return out
