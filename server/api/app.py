"""The coordinator's REST API and dashboard as a FastAPI app, built by :func:`create_app`.

Nothing is created at import time: the process (``dpfl-coordinator serve``, a test, a
simulation) builds the store, settings, job control and metrics and passes them in; the app keeps
them on ``app.state`` for :mod:`dpfl.server.api.deps`. Routes, their authentication and the JSON
error shape are documented in docs/api.md (the OpenAPI document at ``/api/v1/openapi.json`` lists
them all).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles
from pydantic import JsonValue
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpfl.cmdline import version
from dpfl.server.agents_control import AgentControl
from dpfl.server.api.errors import install_error_handlers
from dpfl.server.api.openapi import build_openapi
from dpfl.server.api.routes import agents as agent_routes
from dpfl.server.api.routes import clients, dashboard, health, models, privacy_audits, rounds
from dpfl.server.api.routes import jobs as job_routes
from dpfl.server.dashboard_link import DashboardSessions
from dpfl.server.jobs_control import JobControl
from dpfl.server.metrics import Metrics
from dpfl.server.settings import Settings
from dpfl.server.store import Store

__all__ = ["API_PREFIX", "CONTENT_SECURITY_POLICY", "create_app"]

API_PREFIX = "/api/v1"
#: Only this origin, ever: the dashboard makes no external request and cannot be framed.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_DESCRIPTION = (
    "Per-client privacy budgets, jobs, rounds and models of a dpfl coordinator. Authenticate "
    "with `Authorization: Bearer <token>`: the admin token may use every route; a client's API "
    "token (issued at enrolment) may read only that client's own record, budget and history."
)


class _SecurityHeaders:
    """Adds the headers every response should carry (a pure ASGI middleware, so streaming
    responses are untouched); API and metrics responses are never cached."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("Referrer-Policy", "no-referrer")
                headers.setdefault("X-Frame-Options", "DENY")
                headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
                if path.startswith(API_PREFIX) or path == "/metrics":
                    headers.setdefault("Cache-Control", "no-store")
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _CoordinatorApp(FastAPI):
    """FastAPI whose OpenAPI document also describes the job document (``build_openapi``)."""

    def openapi(self) -> dict[str, JsonValue]:
        return build_openapi(self)


def create_app(
    *,
    store: Store,
    settings: Settings,
    jobs: JobControl,
    agents: AgentControl | None = None,
    metrics: Metrics | None = None,
    health_checks: Mapping[str, Callable[[], bool]] | None = None,
    grpc_port: int | None = None,
) -> FastAPI:
    """Build the REST API and dashboard over an open store.

    Args:
        store: the coordinator's store (shared with the gRPC side; the app never closes it).
        settings: the coordinator's settings (the admin token is read from them).
        jobs: how ``start``/``stop`` reach the orchestrator (``StoreJobControl`` without one).
        agents: how disabling or revoking an agent reaches the live sessions (default: an
            ``AgentControl`` over the store only; a running coordinator's watch applies it).
        metrics: the process's metrics, fed by the orchestrator (default: a fresh
            ``Metrics(store=store)``, whose privacy gauges still come from the store).
        health_checks: name → callable that is True while that part serves; ``/healthz`` is 503
            naming each failing one. More can be added later to ``app.state.health_checks``
            (the serve command adds the gRPC server's once it listens).
        grpc_port: the coordinator's gRPC port, named by ``/healthz`` in the
            ``X-DPFL-gRPC-Port`` header so that an agent pointed at this port by mistake can
            say which port to use (:mod:`dpfl.cmdline.ports`); None: not named.

    Returns:
        The app; serve it with uvicorn (or drive it with ``httpx.ASGITransport`` in tests).

    Raises:
        TypeError: ``jobs`` lacks ``start``/``stop``.
    """
    if not isinstance(jobs, JobControl):
        raise TypeError(f"jobs must implement JobControl (start, stop), got {type(jobs).__name__}")
    app = _CoordinatorApp(
        title="dpfl coordinator",
        version=version(),
        description=_DESCRIPTION,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # FastAPI's pages load Swagger UI from a CDN: /api/docs serves it locally
        redoc_url=None,
    )
    app.state.store = store
    app.state.settings = settings
    app.state.jobs = jobs
    app.state.agents = agents if agents is not None else AgentControl(store)
    app.state.metrics = metrics if metrics is not None else Metrics(store=store)
    app.state.health_checks = dict(health_checks or {})
    app.state.grpc_port = grpc_port
    app.state.dashboard_sessions = DashboardSessions(settings.admin_token.get_secret_value())
    install_error_handlers(app)
    _mount_routes(app)
    app.add_middleware(_SecurityHeaders)
    return app


def _mount_routes(app: FastAPI) -> None:
    """The REST routes under :data:`API_PREFIX`, the health probe, the dashboard and its
    static files."""
    api = APIRouter(prefix=API_PREFIX)
    for module in (clients, job_routes, rounds, models, agent_routes, privacy_audits):
        api.include_router(module.router)
    api.include_router(agent_routes.audit_router)
    api.include_router(dashboard.session_router)
    app.include_router(api)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
