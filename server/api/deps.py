"""The REST API's dependencies as ``Annotated`` aliases: the app's objects and who is asking.

Authentication (``Authorization: Bearer <token>``):

- the **admin token** of the settings (``DPFL_ADMIN_TOKEN``) may use every route; it is compared
  in constant time (``hmac.compare_digest``);
- the **metrics token** (``DPFL_METRICS_TOKEN``, optional) may read ``/metrics`` and nothing
  else, so that Prometheus need not hold the admin token;
- a **client token** (``dpfl_api_…``, issued at enrolment, see ``Store.authenticate_api_token``)
  may read only its own client record, budget and ε history; anything else is 403;
- a **dashboard session token** (``dpfl_dash_…``, what a one-time dashboard link is exchanged
  for, :mod:`dpfl.server.dashboard_link`) reads what the admin token reads and changes nothing
  (403 on every other method than ``GET`` and ``HEAD``);
- no token, a malformed header, or a token that is neither is 401.

The objects a route needs (store, settings, job control, metrics) live on ``app.state`` of the
app built by :func:`dpfl.server.api.app.create_app`; nothing here is global.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dpfl.server.dashboard_link import DashboardSessions
from dpfl.server.errors import InvalidCredential, PermissionDenied
from dpfl.server.jobs_control import JobControl
from dpfl.server.metrics import Metrics
from dpfl.server.settings import Settings
from dpfl.server.store import Store

__all__ = [
    "ID_PATTERN",
    "AdminDep",
    "ClientId",
    "ClientReaderDep",
    "DashboardSessionsDep",
    "JobId",
    "JobsDep",
    "MetricsDep",
    "MetricsReaderDep",
    "Principal",
    "PrincipalDep",
    "SettingsDep",
    "StoreDep",
    "app_state",
]

#: The store's identifier syntax (``dpfl.server.store.core``): malformed ids are 422, not lookups.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="The admin token (DPFL_ADMIN_TOKEN), or a client's API token (dpfl_api_…) "
    "issued at enrolment, which may read only that client's own record, budget and history.",
)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the administrator, the metrics reader (Prometheus), or one client
    (``client_id``)."""

    role: Literal["admin", "metrics", "client", "dashboard"]
    client_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def reads_all(self) -> bool:
        """The admin, or a dashboard session (which may read, not change, everything)."""
        return self.role in ("admin", "dashboard")


def app_state(name: str) -> Any:
    """The dependency that reads ``app.state.<name>`` (what :func:`create_app` put there)."""

    def read(request: Request) -> Any:
        return getattr(request.app.state, name)

    return Depends(read)


StoreDep = Annotated[Store, app_state("store")]
SettingsDep = Annotated[Settings, app_state("settings")]
JobsDep = Annotated[JobControl, app_state("jobs")]
MetricsDep = Annotated[Metrics, app_state("metrics")]
DashboardSessionsDep = Annotated[DashboardSessions, app_state("dashboard_sessions")]


def authenticate(
    store: StoreDep,
    settings: SettingsDep,
    sessions: DashboardSessionsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller behind the bearer token (a plain ``def``: FastAPI runs it in a worker thread,
    since a client token is looked up in the store).

    Raises:
        InvalidCredential: no bearer token, or an unknown, revoked or foreign one (401).
    """
    if credentials is None or not credentials.credentials:
        raise InvalidCredential("missing bearer token: send 'Authorization: Bearer <token>'")
    token = credentials.credentials
    admin = settings.admin_token.get_secret_value()
    if admin and hmac.compare_digest(token.encode("utf-8"), admin.encode("utf-8")):
        return Principal("admin")
    if settings.metrics_token is not None and hmac.compare_digest(
        token.encode("utf-8"), settings.metrics_token.get_secret_value().encode("utf-8")
    ):
        return Principal("metrics")
    if sessions.is_session(token):
        return Principal("dashboard")
    try:
        agent = store.authenticate_api_token(token)
    except InvalidCredential:
        raise InvalidCredential("unknown, revoked or invalid token") from None
    return Principal("client", agent.id)


PrincipalDep = Annotated[Principal, Depends(authenticate)]


_READS = frozenset({"GET", "HEAD"})


def require_admin(principal: PrincipalDep, request: Request) -> Principal:
    """Raises: PermissionDenied (403) for a client or the metrics token, and for a dashboard
    session on anything but a read."""
    if principal.role == "metrics":
        raise PermissionDenied("the metrics token may read only /metrics")
    if principal.role == "dashboard":
        if request.method in _READS:
            return principal
        raise PermissionDenied(
            "a dashboard session (from a one-time dashboard link) may only read; this route "
            "needs the admin token"
        )
    if not principal.is_admin:
        raise PermissionDenied(
            "this route needs the admin token; a client token may read only its own client "
            f"record, budget and history (/api/v1/clients/{principal.client_id})"
        )
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]


def read_metrics(principal: PrincipalDep) -> Principal:
    """The admin or the metrics token, or a dashboard session. Raises: PermissionDenied (403)
    for a client token."""
    if principal.role in ("admin", "metrics", "dashboard"):
        return principal
    raise PermissionDenied(
        "/metrics needs the metrics token (DPFL_METRICS_TOKEN) or the admin token"
    )


MetricsReaderDep = Annotated[Principal, Depends(read_metrics)]

ClientId = Annotated[str, Path(pattern=ID_PATTERN, description="The client (agent) id.")]
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="The job id.")]


def read_client(client_id: ClientId, principal: PrincipalDep) -> Principal:
    """The admin, or the client itself. Raises: PermissionDenied (403) for another client (also
    when that client does not exist: a client token learns nothing about other ids)."""
    if principal.reads_all or (principal.role == "client" and principal.client_id == client_id):
        return principal
    if principal.role == "metrics":
        raise PermissionDenied("the metrics token may read only /metrics")
    raise PermissionDenied(
        f"a client token may read only its own client ({principal.client_id!r}), "
        "not another client's"
    )


ClientReaderDep = Annotated[Principal, Depends(read_client)]
