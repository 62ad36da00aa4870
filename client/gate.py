"""The agent's own privacy decisions: accept or decline a round, and charge it before taking part.

The agent enforces its budgets from its own local ledger
(docs/architecture.md#rule-3-budgets-are-enforced-on-both-sides). The task loop asks a
:class:`Gate` twice per round: :meth:`Gate.review` when an invitation arrives (policy and ledger
decide from ``Algorithm.agent_charge``), and :meth:`Gate.charge` right before the input is sent,
committing and re-checking in one transaction so that concurrent jobs cannot overspend together.
Charging before sending keeps the ledger from under-counting; the key and digest rules are in
docs/accounting.md#what-the-agents-local-ledger-records-per-attempt.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from dpfl.accounting import AccountingError, DpEvent
from dpfl.client.errors import AgentError
from dpfl.client.local_ledger import LocalBudgetExceeded, LocalLedger
from dpfl.client.policy import Policy
from dpfl.learning.algorithms.base import TaskParams

__all__ = ["ChargeRefusedError", "Decision", "Gate", "InvitationReview", "LocalGate"]


class ChargeRefusedError(AgentError):
    """The local ledger refused a charge (it would exceed the local budget)."""


@dataclass(frozen=True, slots=True)
class InvitationReview:
    """An invitation as the agent's gate sees it.

    Attributes:
        job_id, job_name, round: which round.
        algorithm: the algorithm tag (``dp-fedavg``...).
        task: the task (the invitation's ``params_json``, parsed by ``Algorithm.parse_task``).
        claimed: the events the coordinator says the round charges this agent.
        charge: the events the agent records (``AgentSide.charge(claimed)``, with only the noise
            the agent can verify once the setup is known: :meth:`Gate.verified`).
        recorded_fraction: the fraction of the claimed noise's variance ``charge`` keeps.
        verified_shares: how many noise shares (this agent's own included) that fraction counts
            on: 1, or t − c in a malicious-secure round (:meth:`Gate.verified`).
    """

    job_id: str
    job_name: str
    round: int
    algorithm: str
    task: TaskParams
    claimed: tuple[DpEvent, ...]
    charge: tuple[DpEvent, ...]
    recorded_fraction: float = 1.0
    verified_shares: int = 1

    @property
    def delta(self) -> float:
        """The job's δ as the task states it."""
        return self.task.delta


@dataclass(frozen=True, slots=True)
class Decision:
    """Accept, or decline with a reason the coordinator and the operator can read."""

    accept: bool
    reason: str = ""

    @classmethod
    def accepted(cls) -> Decision:
        return cls(True)

    @classmethod
    def declined(cls, reason: str) -> Decision:
        return cls(False, reason)


class Gate(Protocol):
    """The local policy and the local ledger, as the task loop uses them."""

    def allowed_algorithms(self) -> Sequence[str]:
        """The algorithms this agent takes part in (announced in ``Hello``)."""
        ...

    def review(self, review: InvitationReview) -> Decision:
        """Accept or decline an invitation. Must not raise on bad content: decline instead."""
        ...

    def alone_unmasked(self) -> bool:
        """Whether a one-agent round of a secure task may be summed unmasked (the agent's own
        noise then carries the whole claim): False when the policy requires masking."""
        ...

    def max_colluding_peers(self) -> int | None:
        """c, the most certified peers the policy assumes may collude with the coordinator
        (None: the policy counts on no peer's noise)."""
        ...

    def verified(
        self,
        review: InvitationReview,
        *,
        own_fraction: float,
        malicious_secure: bool,
        threshold: int,
        degree: int,
        at_most: int | None = None,
    ) -> InvitationReview:
        """``review`` with the charge the agent records once the setup is known: the noise of
        the shares it can verify are in the sum (docs/accounting.md#what-the-agent-can-verify).
        ``review`` is the invitation's (never an already verified one); ``at_most`` caps the
        shares counted (what the protocol's own checks verified, when fewer than the policy's
        figure for the setup).

        Raises:
            ChargeRefusedError: the charge's events cannot be scaled to the verified noise.
        """
        ...

    def charge(
        self, review: InvitationReview, *, attempt: str, session_id: bytes, sent_sha256: bytes
    ) -> None:
        """Commit ``review.charge`` to the local ledger for the contribution about to be sent.

        Args:
            review: the accepted invitation.
            attempt: the agent's own id of this attempt (fresh and random per accepted
                invitation): the ledger key.
            session_id: the coordinator's session id (stored for the operator, never a key).
            sent_sha256: SHA-256 of the exact bytes about to be sent.

        Raises:
            ChargeRefusedError: the charge would exceed a local budget; nothing was recorded.
            LocalLedgerError: ``attempt`` is already recorded for other events or other bytes
                (or the ledger cannot be written). Whatever it raises, nothing may be sent.
        """
        ...


class LocalGate:
    """The :class:`Gate` of a real agent: its :class:`Policy` over its :class:`LocalLedger`.

    Args:
        policy: the local policy.
        ledger: the local ledger (this gate is its only writer in the process).
        coordinator_id: the coordinator's id (from enrolment), checked against the policy's
            ``allowed_coordinators`` and stored with each record.

    ``review`` runs :meth:`Policy.decide` on the events the agent would record. ``charge`` runs
    it again and records with the policy's budgets checked inside the ledger's write
    transaction, so that two jobs accepted at the same time cannot together exceed a budget:
    the second one's charge is refused and it sends nothing. A contribution is keyed by the
    task loop's own random attempt id, not by the coordinator's session id (whose nonce the
    coordinator chooses and might repeat): every attempt that sends is a new row, so a round
    redone by a coordinator, with a new session or the same one, is charged again, in full.
    """

    def __init__(self, *, policy: Policy, ledger: LocalLedger, coordinator_id: str = "") -> None:
        self.policy = policy
        self.ledger = ledger
        self.coordinator_id = coordinator_id
        self._lock = threading.Lock()

    def allowed_algorithms(self) -> Sequence[str]:
        return self.policy.allowed_algorithms

    def alone_unmasked(self) -> bool:
        return not self.policy.require_secure_aggregation

    def max_colluding_peers(self) -> int | None:
        return self.policy.max_colluding_peers

    def verified(
        self,
        review: InvitationReview,
        *,
        own_fraction: float,
        malicious_secure: bool,
        threshold: int,
        degree: int,
        at_most: int | None = None,
    ) -> InvitationReview:
        shares = self.policy.verified_shares(
            malicious_secure=malicious_secure, threshold=threshold, degree=degree
        )
        if at_most is not None:
            shares = max(1, min(shares, at_most))
        fraction = self.policy.recorded_fraction(own_fraction, shares)
        if fraction >= 1.0:
            if shares == review.verified_shares:
                return review
            return replace(review, verified_shares=shares)
        try:
            charge = tuple(e.with_noise_fraction(fraction) for e in review.charge)
        except AccountingError as exc:
            raise ChargeRefusedError(f"cannot record the verified noise: {exc}") from None
        return replace(review, charge=charge, recorded_fraction=fraction, verified_shares=shares)

    def _decide(self, review: InvitationReview) -> Decision:
        task = review.task
        decision = self.policy.decide(
            algorithm=review.algorithm,
            job_id=review.job_id,
            job_name=review.job_name,
            events=review.charge,
            ledger=self.ledger,
            coordinator=self.coordinator_id,
            secure_aggregation=task.secure_aggregation,
            honest_fraction=task.honest_fraction,
            approximate=task.approximate,
            unit=task.unit,
        )
        return Decision(decision.accept, decision.reason)

    def review(self, review: InvitationReview) -> Decision:
        return self._decide(review)

    def charge(
        self, review: InvitationReview, *, attempt: str, session_id: bytes, sent_sha256: bytes
    ) -> None:
        if not attempt:
            raise ChargeRefusedError("a charge needs the agent's attempt id")
        if len(sent_sha256) != 32:
            raise ChargeRefusedError("a charge needs the SHA-256 of the bytes to be sent")
        with self._lock:
            decision = self._decide(review)
            if not decision.accept:
                raise ChargeRefusedError(f"the local ledger refuses the charge: {decision.reason}")
            try:
                # False only for the same events and the same bytes under this attempt: a
                # resend that releases nothing new; another contribution raises
                self.ledger.record(
                    job_id=review.job_id,
                    round=review.round,
                    attempt=attempt,
                    events=review.charge,
                    algorithm=review.algorithm,
                    coordinator=self.coordinator_id,
                    unit=review.task.unit,
                    session_id=session_id.hex(),
                    sent_sha256=sent_sha256.hex(),
                    max_epsilon_job=self.policy.max_epsilon_per_job,
                    max_epsilon_total=self.policy.max_epsilon_total,
                    delta=self.policy.delta,
                )
            except LocalBudgetExceeded as exc:
                raise ChargeRefusedError(f"the local ledger refuses the charge: {exc}") from None
