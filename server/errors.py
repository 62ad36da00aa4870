"""The coordinator's typed errors and how every transport reports them.

Handlers raise these; the gRPC servicer and the FastAPI routers are thin adapters. Each class
carries its mapping as two class attributes, so an adapter needs no ``isinstance`` ladder::

    grpc.StatusCode[err.grpc_status]      # gRPC
    JSONResponse(status_code=err.http_status, content={"detail": str(err), "code": err.code})

The table of classes and statuses: docs/architecture.md#error-classes-and-statuses. Messages name
the offending object and the problem (``"agent 'a-1' not found"``) and never contain a secret.
"""

from __future__ import annotations

from typing import ClassVar


class ServerError(Exception):
    """Root of the coordinator's errors."""

    #: Name of the ``grpc.StatusCode`` member a gRPC adapter answers with.
    grpc_status: ClassVar[str] = "INTERNAL"
    #: The HTTP status a REST adapter answers with.
    http_status: ClassVar[int] = 500
    #: A stable machine-readable code for JSON error bodies.
    code: ClassVar[str] = "internal"


class ConfigurationError(ServerError):
    """The settings were refused: insecure (a well-known admin token) or inconsistent."""

    grpc_status = "FAILED_PRECONDITION"
    code = "configuration"


class StoreError(ServerError):
    """Root of the errors raised by ``dpfl.server.store``."""

    code = "store"


class InvalidInput(StoreError):  # noqa: N818 (the names read as HTTP-like outcomes)
    """A value the store refuses before touching the database (an empty name, a NaN budget)."""

    grpc_status = "INVALID_ARGUMENT"
    http_status = 422
    code = "invalid_input"


class NotFound(StoreError):  # noqa: N818 (the names read as HTTP-like outcomes)
    """No agent, job, round, model version or token with that key."""

    grpc_status = "NOT_FOUND"
    http_status = 404
    code = "not_found"


class Conflict(StoreError):  # noqa: N818 (the names read as HTTP-like outcomes)
    """The operation contradicts the stored state (e.g. re-committing a round differently)."""

    grpc_status = "FAILED_PRECONDITION"
    http_status = 409
    code = "conflict"


class AlreadyExists(Conflict):
    """A unique key (an id, a name, a round attempt) is already taken."""

    grpc_status = "ALREADY_EXISTS"
    code = "already_exists"


class InvalidTransition(Conflict):
    """A job or round status change that the life cycle does not allow."""

    code = "invalid_transition"


class CannotStart(Conflict):
    """A job that cannot run on the members it would start with (too few agents for its data
    split, a noise that cannot be calibrated for them): refused before it is marked running."""

    code = "cannot_start"


class BudgetExceeded(StoreError):  # noqa: N818 (the names read as HTTP-like outcomes)
    """Charging the events would make at least one client exceed its privacy budget.

    ``clients`` lists the offending client ids, so a caller can drop exactly those.
    """

    grpc_status = "RESOURCE_EXHAUSTED"
    http_status = 409
    code = "budget_exceeded"

    def __init__(self, message: str, *, clients: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.clients = clients


class InvalidCredential(StoreError):  # noqa: N818 (the names read as HTTP-like outcomes)
    """A token or credential that is unknown, revoked, expired, already used or of another agent."""

    grpc_status = "UNAUTHENTICATED"
    http_status = 401
    code = "unauthenticated"


class PermissionDenied(StoreError):  # noqa: N818 (the names read as HTTP-like outcomes)
    """The caller is authenticated but may not access this resource (another client's budget)."""

    grpc_status = "PERMISSION_DENIED"
    http_status = 403
    code = "forbidden"


class LedgerIntegrityError(StoreError):
    """A stored curve or running sum disagrees with the events it was computed from."""

    grpc_status = "DATA_LOSS"
    code = "ledger_integrity"


class StoreUnavailable(StoreError):  # noqa: N818 (the names read as HTTP-like outcomes)
    """The database cannot be reached, or its schema cannot be brought to the current version."""

    grpc_status = "UNAVAILABLE"
    http_status = 503
    code = "unavailable"
