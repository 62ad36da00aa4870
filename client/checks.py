"""What the agent checks before it takes part in a round: the invitation, then the setup.

The agent does not trust the coordinator
(docs/architecture.md#rule-3-budgets-are-enforced-on-both-sides). :func:`parse_invitation`
declines an invitation it cannot account for (:class:`InvitationDeclined`) before the local gate
is asked; :func:`check_setup` refuses a setup whose mode differs from the task's
``secure_aggregation`` flag, whose parameters are malformed, or whose noise does not deliver the
claimed events (``Algorithm.agent_check``), with a :class:`SetupRefused` carrying its wire code.
Both are pure; :mod:`dpfl.client.rounds` turns their refusals into messages
(docs/agent.md#what-the-agent-refuses).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from dpfl.accounting import AccountingError, DpEvent, event_from_json
from dpfl.client.errors import AgentError
from dpfl.client.gate import InvitationReview
from dpfl.client.summation import (
    ModeMismatchError,
    PlainParameters,
    SecureParameters,
    check_mode,
    is_plain_setup,
)
from dpfl.learning.algorithms.base import Algorithm, AnyAgent
from dpfl.learning.errors import LearningError
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import messages as sm
from dpfl.secagg.errors import SecAggError

__all__ = [
    "TASK_ERRORS",
    "InvitationDeclined",
    "SetupRefused",
    "check_setup",
    "parse_invitation",
]

#: Errors an algorithm or the encoding raise on bad input (never a bug in the agent).
TASK_ERRORS = (LearningError, SecAggError, AccountingError, ValueError, TypeError, KeyError)


class InvitationDeclined(AgentError):  # noqa: N818 (reads as the answer it becomes)
    """The invitation cannot be taken part in; the message is the reason sent back."""


class SetupRefused(AgentError):  # noqa: N818 (reads as the answer it becomes)
    """The setup is refused; ``code`` is the ``ErrorCode`` the agent answers with."""

    def __init__(self, code: pb.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_invitation(
    invitation: pb.Invitation, *, job_id: str, algorithms: Callable[[str], Algorithm]
) -> tuple[InvitationReview, AnyAgent]:
    """The invitation as the gate reviews it, and its algorithm's agent side for its task.

    Raises:
        InvitationDeclined: naming what is unsupported or malformed.
    """
    try:
        algorithm = algorithms(invitation.algorithm)
    except LearningError as exc:
        raise InvitationDeclined(f"unsupported algorithm {invitation.algorithm!r}: {exc}") from None
    try:
        task = algorithm.parse_task(invitation.params_json)
        side = algorithm.agent(task)
    except LearningError as exc:
        raise InvitationDeclined(f"the task does not fit {invitation.algorithm}: {exc}") from None
    try:
        raw_events = json.loads(invitation.privacy_events_json)
        if isinstance(raw_events, dict):
            raw_events = [raw_events]
        if not isinstance(raw_events, list):
            raise InvitationDeclined("privacy_events_json must be a JSON array of events")
        claimed: tuple[DpEvent, ...] = tuple(event_from_json(e) for e in raw_events)
    except (ValueError, TypeError, AccountingError) as exc:
        raise InvitationDeclined(f"malformed privacy_events_json: {exc}") from None
    if not claimed:
        raise InvitationDeclined("the invitation claims no privacy events")
    try:
        charge = side.charge(claimed)
    except TASK_ERRORS as exc:
        raise InvitationDeclined(f"the task does not fit {invitation.algorithm}: {exc}") from None
    review = InvitationReview(
        job_id=job_id,
        job_name=invitation.job_name,
        round=invitation.header.round,
        algorithm=invitation.algorithm,
        task=task,
        claimed=claimed,
        charge=charge,
    )
    return review, side


def check_setup(
    request: sm.AdvertiseKeysRequest,
    *,
    review: InvitationReview,
    side: AnyAgent,
    alone_unmasked: bool = True,
) -> tuple[SecureParameters | PlainParameters, float]:
    """The round's validated parameters (masked or plain) and the fraction of the claimed
    noise's variance this agent's own share carries (``AgentSide.check``), or a refusal; see the
    module docstring. Runs before anything is trained or sent.

    A plain setup for ONE agent of a task with secure aggregation (:func:`check_mode`) makes
    ``AgentSide.check`` run with ``min_survivors = 1``: the agent's own noise, over
    ``t·1 ≤ 1`` honest agents, must carry the whole claimed noise, so its vector alone is the
    mechanism its local ledger records.

    Raises:
        SetupRefused: ``POLICY_DECLINED`` for a mode that is not the task's or noise that does
            not back the claim, ``INVALID_ARGUMENT`` for a malformed setup or task.
    """
    try:
        check_mode(review.task, request.setup, alone_unmasked=alone_unmasked)
    except ModeMismatchError as exc:
        raise SetupRefused(pb.ERROR_POLICY_DECLINED, f"setup refused: {exc}") from None
    params: SecureParameters | PlainParameters
    try:
        if is_plain_setup(request.setup):
            params = PlainParameters.from_request(request, job_id=review.job_id, round=review.round)
        else:
            params = SecureParameters.from_setup(request.setup)
    except SecAggError as exc:
        raise SetupRefused(pb.ERROR_INVALID_ARGUMENT, f"setup refused: {exc}") from None
    try:
        # without secure aggregation the task's flag makes the algorithm demand the whole noise
        # from this agent alone and refuse any client-sampling amplification
        own = side.check(
            review.claimed,
            params.encoding,
            num_clients=params.num_clients,
            min_survivors=params.min_survivors,
            honest_fraction=review.task.honest_fraction,
        )
    except TASK_ERRORS as exc:
        raise SetupRefused(
            pb.ERROR_POLICY_DECLINED, f"the setup does not back the claimed privacy: {exc}"
        ) from None
    if isinstance(own, bool) or not isinstance(own, int | float) or not 0.0 < own <= 1.0:
        raise SetupRefused(
            pb.ERROR_POLICY_DECLINED,
            f"setup refused: the {review.algorithm} agent side states no fraction of the claimed "
            f"noise its own share carries (its check returned {own!r}), so the agent cannot "
            "record only the noise it verified",
        )
    return params, float(own)
