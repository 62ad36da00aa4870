"""The agent's typed errors (one base, :class:`AgentError`) and the exit codes of ``dpfl-agent``.

Each class carries its ``exit_code`` (AgentError 1, DataSpecError 2, StateDirError 3,
EnrollmentError 4, TransportError and DownloadError 5), so the CLI maps the whole family without an
``isinstance`` ladder and the task loop maps a refusal to its wire ``ErrorCode``. Messages name the
offending value or file and never contain a secret.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AgentError",
    "DataSpecError",
    "DownloadError",
    "EnrollmentError",
    "StateDirError",
    "TransportError",
]


class AgentError(Exception):
    """Root of the agent's errors."""

    #: The exit status ``dpfl-agent`` ends with when this error stops it.
    exit_code: ClassVar[int] = 1


class DataSpecError(AgentError, ValueError):
    """A ``--data`` spec is malformed, names an unknown data set, or its data cannot be loaded."""

    exit_code = 2


class StateDirError(AgentError):
    """The state directory is corrupt, foreign (another coordinator) or cannot be written safely."""

    exit_code = 3


class EnrollmentError(AgentError):
    """Enrolment is needed but impossible (no token given), or the coordinator refused it."""

    exit_code = 4


class TransportError(AgentError):
    """The coordinator is unreachable, or refused this agent's credential."""

    exit_code = 5


class DownloadError(TransportError):
    """A download was refused, or its blob is truncated, too large, or fails its SHA-256 check.

    Attributes:
        status: the name of the gRPC status the coordinator refused it with (``"NOT_FOUND"``:
            no such blob), or ``""`` when the blob itself was bad.
    """

    def __init__(self, message: str, *, status: str = "") -> None:
        super().__init__(message)
        self.status = status
