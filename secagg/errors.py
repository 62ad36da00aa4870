"""The typed errors of :mod:`dpfl.secagg` (one base, ``SecAggError``).

Every error carries an :class:`ErrorCode`: the protocol's own subset of ``dpfl.v1.ErrorCode``
in ``protos/dpfl/v1/agent.proto``, with the same names and numbers, so the gRPC layer maps an
exception to a wire error with ``int(err.code)``. The service's codes (unknown job,
unauthenticated, budget exceeded, policy declined) belong to the coordinator and the agent, not to
the summation protocol, and are not here.

Invariant: no function of this package signals failure by returning ``False`` or ``None``, and none
uses ``assert`` for validation; callers can rely on "no exception" meaning "valid".
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """The protocol's codes: a subset of ``dpfl.v1.ErrorCode`` (same names without the prefix,
    same numbers)."""

    INVALID_ARGUMENT = 1
    STALE_ROUND = 2
    WRONG_STAGE = 3
    PROTOCOL_ABORT = 8
    INTERNAL = 9
    DUPLICATE = 10


class SecAggError(Exception):
    """Base of every error raised by dpfl.secagg."""

    code: ErrorCode = ErrorCode.INTERNAL


class ParameterError(SecAggError, ValueError):
    """A protocol, graph or encoding parameter is out of range or inconsistent."""

    code = ErrorCode.INVALID_ARGUMENT


class EncodingOverflow(ParameterError):  # noqa: N818 (the names of the specification)
    """A ring too small for the values it must hold: the sum could wrap around."""


class InvalidKey(SecAggError, ValueError):  # noqa: N818 (the names of the specification)
    """A public or private key is malformed, of low order, or duplicated."""

    code = ErrorCode.INVALID_ARGUMENT


class InvalidShare(SecAggError, ValueError):  # noqa: N818 (the names of the specification)
    """A Shamir share is malformed, duplicated, or too few shares were given."""

    code = ErrorCode.INVALID_ARGUMENT


class DecryptionError(SecAggError):
    """An authenticated ciphertext failed to verify (tampered, misdelivered, replayed)."""

    code = ErrorCode.INVALID_ARGUMENT


class ProtocolViolation(SecAggError):  # noqa: N818 (the names of the specification)
    """A message breaks the protocol: wrong content, unexpected sender, bad share count."""

    code = ErrorCode.INVALID_ARGUMENT


class StaleMessage(ProtocolViolation):
    """A message of another job, round or session than the current one."""

    code = ErrorCode.STALE_ROUND


class WrongStage(ProtocolViolation):
    """A message of another protocol stage than the one expected now."""

    code = ErrorCode.WRONG_STAGE


class DuplicateMessage(ProtocolViolation):
    """A second message where exactly one is allowed."""

    code = ErrorCode.DUPLICATE


class VerificationFailed(SecAggError):  # noqa: N818 (reads as an outcome, like the others)
    """A malicious-secure check failed: the coordinator's message is not what the roster, the
    seeded graph or the attested survivor set fix (docs/secagg.md#the-malicious-secure-variant)."""

    code = ErrorCode.PROTOCOL_ABORT


class ProtocolAborted(SecAggError):  # noqa: N818 (the names of the specification)
    """The whole protocol aborted (all or nothing): no aggregate exists.

    Raised by the in-process harness; the state machines themselves return an ``Aborted`` state.
    """

    code = ErrorCode.PROTOCOL_ABORT
