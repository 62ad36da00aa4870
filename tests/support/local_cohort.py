"""Test-only: a cohort of agents in this process for the round driver (``dpfl.learning.rounds``):
every invitee accepts, its vector comes from a callable, and the vectors are summed by the real
secure-aggregation state machines (``dpfl.secagg.simulate``) or, in the plain summation, added as
they would arrive. A malicious-secure setup (``secagg.threat_model: malicious``) runs the variant
with a peer certificate per agent, of one federation CA made for the cohort
(:func:`support.peer_pki.federation_identities`) unless the caller gives them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from dpfl.learning.rounds.driver import Commit
from dpfl.learning.rounds.state import Acceptance, Invitation, RoundAborted, Summed, SumSetup
from dpfl.secagg import ClientIdentity, RandomSource, SimulationAborted, ThreatModel, simulate
from dpfl.secagg.messages import Stage
from dpfl.secagg.server_states import ServerReadyToUnmask

from .peer_pki import federation_identities

__all__ = ["Contribute", "LocalCohort"]

#: An accepted agent's ring vector for the round: (agent id, the invitation, the setup).
Contribute = Callable[[str, Invitation, SumSetup], npt.NDArray[np.uint64]]


class LocalCohort:
    """Agents that all accept; see the module docstring.

    Args:
        contribute: each accepted agent's vector (its own checks and ledger are its business).
        rng: the secure-aggregation randomness of the round.
        dropouts: per stage, indices into the accepted agents that stop answering from it on
            (the plain summation loses them all before its vectors).
        job_id, number: the round's identity in secure aggregation's headers.
        identities: the accepted agents' peer identities in a malicious-secure round (default:
            fresh ones of one federation CA).
    """

    def __init__(
        self,
        contribute: Contribute,
        *,
        rng: RandomSource,
        dropouts: Mapping[Stage, Collection[int]] | None = None,
        job_id: str,
        number: int,
        identities: Sequence[ClientIdentity] | None = None,
    ) -> None:
        self.contribute = contribute
        self.rng = rng
        self.dropouts = dict(dropouts or {})
        self.job_id = job_id
        self.number = number
        self.identities = identities
        self.invitation: Invitation | None = None

    async def invite(self, invitation: Invitation) -> Acceptance:
        self.invitation = invitation
        return Acceptance(invitation.invited)

    async def set_up(self, setup: SumSetup) -> None:
        return None

    async def sum(self, setup: SumSetup, commit: Commit) -> Summed:
        if self.invitation is None:
            raise RuntimeError("a cohort sums after its invitation")
        invitation = self.invitation
        vectors = [self.contribute(a, invitation, setup) for a in setup.accepted]
        if setup.params is None:
            gone = set().union(*self.dropouts.values())
            summed = tuple(a for i, a in enumerate(setup.accepted) if i not in gone)
            await commit(summed)
            total = np.zeros(setup.vector_length, dtype=np.uint64)
            for i, agent_id in enumerate(setup.accepted):
                if agent_id in summed:
                    total = total + vectors[i]  # uint64 wraps mod 2^64
            return Summed(total, summed)
        loop = asyncio.get_running_loop()
        committed: list[tuple[str, ...]] = []

        def before_unmask(ready: ServerReadyToUnmask) -> None:
            participants = tuple(setup.accepted[i] for i in sorted(ready.a3))

            async def charge() -> None:
                await commit(participants)

            # the state machines run in a worker thread; the ledger commits on the loop
            asyncio.run_coroutine_threadsafe(charge(), loop).result()
            committed.append(participants)

        threat = ThreatModel(setup.threat_model or ThreatModel.SEMI_HONEST.value)
        identities = None
        if threat is ThreatModel.MALICIOUS:
            identities = self.identities or federation_identities(len(setup.accepted))
        try:
            outcome = await asyncio.to_thread(
                simulate,
                vectors,
                params=setup.params,
                dropouts=self.dropouts,
                rng=self.rng,
                job_id=self.job_id,
                round=self.number,
                before_unmask=before_unmask,
                threat_model=threat,
                identities=identities,
            )
        except SimulationAborted as exc:
            raise RoundAborted(f"secure aggregation {exc}") from exc
        return Summed(outcome.aggregate, committed[0])
