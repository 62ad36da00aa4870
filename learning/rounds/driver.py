"""The round driver: one round's steps over typed state, whatever carries the messages.

release policy → task → invite → setup (and f₁, the fraction of the charged noise one agent's
share carries, by the agents' own check: :func:`own_noise_fraction`) → sum, with the ledger
committed inside the sum before it becomes computable (ledger rule 1,
docs/architecture.md#the-round-driver) → the dropouts' noise
restored (secure aggregation) → decode → ``finish_round``. The round's charge is computed once,
before the invitation announces it, and committed as announced. The coordinator runs it over its
agents' streams, the audit and the test harness in one process; each supplies a :class:`Cohort`
(the transport) and a :class:`Ledger`. Sampling stays with the caller, which knows earlier
attempts of the round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from dpfl.accounting import AccountingError, DpEvent, event_from_json, event_to_json
from dpfl.learning.algorithms.base import CoordinatorState, RoundCharge, RoundTask
from dpfl.learning.algorithms.parts.sample_release import (
    Release,
    minimum_accepted,
    release_for,
    restore_dropped_noise,
    secure_sum,
)
from dpfl.learning.errors import LearningError
from dpfl.learning.rounds.state import (
    Acceptance,
    Commitment,
    Invitation,
    RoundAborted,
    RoundEnd,
    RoundJob,
    Summation,
    Summed,
    SumSetup,
)
from dpfl.mechanisms import decode, encode
from dpfl.secagg import RoundParameters, ThreatModel
from dpfl.secagg.errors import SecAggError
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "Cohort",
    "Commit",
    "Ledger",
    "NoiseStreams",
    "choose_setup",
    "own_noise_fraction",
    "run_round",
]

#: Commits the round's ledger for the given participants; a summation calls it exactly once,
#: before anything that makes the sum computable. Raises :class:`RoundAborted` when refused.
Commit = Callable[[Sequence[str]], Awaitable[None]]
#: The CSPRNG stream of one purpose of the round: ``"noise-alone"`` or ``"dropped-noise"``.
NoiseStreams = Callable[[str], RandomStream]


class Cohort(Protocol):
    """The invited clients as a transport reaches them."""

    async def invite(self, invitation: Invitation) -> Acceptance:
        """Send the invitation; who accepted."""
        ...

    async def set_up(self, setup: SumSetup) -> None:
        """Note the round's summation before any client learns it (the round record)."""
        ...

    async def sum(self, setup: SumSetup, commit: Commit) -> Summed:
        """Sum the accepted clients' vectors (secure or plain), calling ``commit`` first."""
        ...


class Ledger(Protocol):
    """Where charges become durable."""

    async def commit(self, commitment: Commitment) -> None:
        """Commit, or raise :class:`RoundAborted` (a budget refused): then nothing is released."""
        ...


async def run_round(
    job: RoundJob,
    *,
    number: int,
    state: CoordinatorState,
    population: Sequence[str],
    invited: Sequence[str],
    cohort: Cohort,
    ledger: Ledger,
    noise: NoiseStreams,
) -> RoundEnd:
    """Release the sample ``invited`` of ``population`` as round ``number`` from ``state``.

    Raises:
        RoundAborted: the round ends unreleased (what was committed stays committed).
    """
    side = job.coordinator
    release = release_for(side, invited=len(invited))
    if release is Release.SKIP:
        minimum = minimum_accepted(side)
        return RoundEnd(
            release, f"{len(invited)} clients sampled, a round needs {minimum}: skipped"
        )
    task = side.round_task(state, round_number=number)
    charge = side.round_charge(round_number=number, population=population)
    answer = Acceptance(())  # the empty sample: nobody to invite
    if release is Release.ROUND:
        answer = await cohort.invite(Invitation(number, task, tuple(invited), charge.events))
        minimum = minimum_accepted(side)
        if len(answer.accepted) < minimum:
            raise RoundAborted(
                f"{len(answer.accepted)} of {len(invited)} invited clients accepted, "
                f"a round needs {minimum}"
            )
    carriers = [a for a in answer.accepted if a not in answer.noiseless]
    setup = choose_setup(job, task, carriers)
    own = own_noise_fraction(job, task, charge.events, setup)
    await cohort.set_up(setup)
    summed = await _sum(number, charge, setup, answer, cohort, ledger, noise, own)
    started = time.monotonic()
    aggregate = decode(summed.total, config=setup.encoding)
    outcome = await asyncio.to_thread(
        side.finish_round,
        state,
        job.data,
        round_number=number,
        aggregate=aggregate,
        survivors=len(summed.summed),
    )
    seconds = time.monotonic() - started
    return RoundEnd(
        release, "", answer.accepted, summed.summed, setup.encoding, aggregate, outcome, seconds
    )


def choose_setup(job: RoundJob, task: RoundTask, accepted: Sequence[str]) -> SumSetup:
    """Secure aggregation from two accepted clients (parameters for the job's threat model and
    fractions), else the plain summation, where each agent encodes with ``min_survivors = 1``
    (a lone agent of a released sample then carries the whole sum's noise); with none, the noise
    alone, drawn by the coordinator (where no sample is ever skipped, the empty sample's
    :meth:`~CoordinatorSide.noise_alone_encoding`; else one agent's whole noise).

    Raises:
        RoundAborted: no secure-aggregation parameters fit.
    """
    side, n, length = job.coordinator, len(accepted), task.vector_length
    spec = side.spec
    if n == 0:
        if side.releases_every_sample:
            alone = side.noise_alone_encoding(task)
        else:
            alone = side.encoding(task, participants=1, min_survivors=1)
        return SumSetup(Summation.NOISE_ALONE, (), length, alone)

    def encoding(min_survivors: int) -> SumSetup:
        enc = side.encoding(task, participants=n, min_survivors=min_survivors)
        return SumSetup(Summation.PLAIN, tuple(accepted), length, enc)

    if not secure_sum(spec, summands=n):
        return encoding(1)
    threat = spec.secagg.threat_model
    try:
        probe = RoundParameters.choose(
            num_clients=n,
            vector_length=length,
            ring_bits=64,
            corrupt_fraction=spec.secagg.corrupt_fraction,
            dropout_fraction=spec.secagg.dropout_fraction,
            model=ThreatModel(threat),  # the job schema admits exactly secagg's values
        )
        enc = encoding(probe.min_survivors).encoding
        params = dataclasses.replace(probe, ring_bits=enc.ring_bits)
        # the encoding beside the parameters: its ring, and no wrap over n summands
        return SumSetup(Summation.SECURE, tuple(accepted), length, enc, params, threat)
    except SecAggError as exc:
        raise RoundAborted(f"no secure-aggregation parameters for {n} clients: {exc}") from exc


def own_noise_fraction(
    job: RoundJob, task: RoundTask, events: Sequence[DpEvent], setup: SumSetup
) -> float:
    """f₁: the fraction of the charged noise's variance that ONE agent's share carries in this
    setup, computed exactly as each agent computes it (``AgentSide.check`` on the task and the
    events as the invitation carries them, with the setup's encoding, ``num_clients`` and
    ``min_survivors``). 1 where an agent's own noise carries the whole charge (a plain round,
    DP-FedSGD's local accounting); a round of noise alone counts as one agent's whole noise.
    The ledger keeps it with every entry of the round
    (docs/accounting.md#what-the-agent-can-verify).

    Raises:
        RoundAborted: the setup does not pass the agents' own check (they would refuse it).
    """
    if setup.kind is Summation.SECURE and setup.params is not None:
        clients, survivors = setup.params.num_clients, setup.params.min_survivors
    elif setup.kind is Summation.PLAIN:
        clients, survivors = len(setup.accepted), 1
    else:
        clients = survivors = 1
    algorithm = job.coordinator.algorithm
    try:
        agent = algorithm.agent(algorithm.parse_task(task.params.to_json()))
        claimed = tuple(event_from_json(event_to_json(e)) for e in events)
        return agent.check(
            claimed,
            setup.encoding,
            num_clients=clients,
            min_survivors=survivors,
            honest_fraction=task.params.honest_fraction,
        )
    except (LearningError, AccountingError, ValueError) as exc:
        raise RoundAborted(f"the setup fails the agents' own check of the claim: {exc}") from exc


async def _sum(
    number: int,
    charge: RoundCharge,
    setup: SumSetup,
    answer: Acceptance,
    cohort: Cohort,
    ledger: Ledger,
    noise: NoiseStreams,
    own: float,
) -> Summed:
    """The summation with the commit inside it; the result as it is released."""
    committed: list[Commitment] = []

    def carriers(agents: Sequence[str]) -> int:
        return sum(1 for a in agents if a not in answer.noiseless)

    async def commit(participants: Sequence[str]) -> None:
        if committed:
            raise RuntimeError("a round commits its ledger once")
        charges = charge.charges(list(participants))
        # secure aggregation: fixed with the ledger, how many dropouts' noise shares it carries
        restored = len(setup.accepted) - carriers(participants)
        secure = setup.kind is Summation.SECURE
        commitment = Commitment(
            number, tuple(participants), charges, restored if secure else None, own
        )
        await ledger.commit(commitment)
        committed.append(commitment)

    if answer.accepted:
        summed = await cohort.sum(setup, commit)
    else:
        await commit(())
        summed = Summed(np.zeros(setup.vector_length, dtype=np.uint64), ())
    if not committed:
        raise RuntimeError("the summation released a sum without committing the ledger")
    total = summed.total
    if setup.kind is Summation.NOISE_ALONE:
        # M(∅): the sum's noise drawn by the coordinator (CSPRNG), charged like any round
        zeros = np.zeros(setup.vector_length)
        total = total + encode(zeros, config=setup.encoding, stream=noise("noise-alone"))
    elif setup.kind is Summation.SECURE:
        if summed.summed != committed[0].participants:
            raise RuntimeError("a secure sum is released over exactly the committed participants")
        # the dropouts' noise shares, so that the released noise does not depend on who
        # survived (docs/accounting.md, "(b) Dropouts and the honest fraction")
        total = restore_dropped_noise(
            total,
            setup.encoding,
            accepted=len(setup.accepted),
            summed=carriers(summed.summed),
            stream=noise("dropped-noise"),
        )
    return Summed(_in_ring(total, setup.encoding.ring_bits), summed.summed)


def _in_ring(total: npt.NDArray[np.uint64], ring_bits: int) -> npt.NDArray[np.uint64]:
    if ring_bits < 64:
        return total & np.uint64((1 << ring_bits) - 1)
    return total
