"""The dashboard: ``/`` serves ``static/index.html``; its scripts and styles live under
``/static``. Public (they contain no data): the page asks for the admin token and reads the API
with it. Every asset is local: the Content-Security-Policy forbids any other origin.

``/api/docs`` is the interactive API reference: Swagger UI 5 (which reads OpenAPI 3.1) from the
``swagger-ui-py`` package, whose two files are served under ``/api/docs/assets`` (nothing is
fetched from a CDN), started by ``static/api-docs.js`` over ``/api/v1/openapi.json``.

``POST /api/v1/dashboard/sessions`` (public, :data:`session_router`) exchanges the one-time code
of a dashboard link (``dpfl-coordinator dashboard-link``; :mod:`dpfl.server.dashboard_link`)
for a read-only dashboard session token; a wrong, expired or used code is a 401."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import swagger_ui
from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from dpfl.server.api.deps import DashboardSessionsDep
from dpfl.server.api.routes import error_responses

router = APIRouter(include_in_schema=False)
#: Under ``/api/v1``: the exchange of a dashboard link's code for a session.
session_router = APIRouter(prefix="/dashboard", tags=["dashboard"])

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
#: Swagger UI's distribution, as installed with the package (no network at run time).
SWAGGER_UI_DIR = Path(swagger_ui.__file__).resolve().parent / "static"
API_DOCS = "/api/docs"
#: The only files of it the page loads, with their media types.
_SWAGGER_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
}


@router.get("/")
def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html; charset=utf-8")


@router.get(API_DOCS)
def api_docs() -> FileResponse:
    return FileResponse(STATIC_DIR / "api-docs.html", media_type="text/html; charset=utf-8")


@router.get(API_DOCS + "/assets/{name}")
def api_docs_asset(name: str) -> FileResponse:
    media = _SWAGGER_ASSETS.get(name)
    if media is None:
        raise HTTPException(404, f"no asset {name!r}")
    return FileResponse(SWAGGER_UI_DIR / name, media_type=media)


class DashboardLinkCode(BaseModel):
    """The body of ``POST /api/v1/dashboard/sessions``."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(
        min_length=1,
        max_length=256,
        description="The one-time code of a dashboard link (the part after '#login=').",
    )


class DashboardSessionPublic(BaseModel):
    """A dashboard session: a bearer token that reads every admin route and changes nothing."""

    model_config = ConfigDict(frozen=True)

    token: str = Field(description="Send as 'Authorization: Bearer <token>' (dpfl_dash_…).")
    expires_at: datetime = Field(description="When the token stops working (ISO 8601 UTC).")
    read_only: bool = Field(
        default=True, description="Always true: POST routes answer such a token 403."
    )


@session_router.post(
    "/sessions", response_model=DashboardSessionPublic, responses=error_responses(400, 401, 422)
)
def redeem_dashboard_link(
    body: DashboardLinkCode, sessions: DashboardSessionsDep
) -> DashboardSessionPublic:
    """Exchange a dashboard link's one-time code for a read-only session token (public: the
    code is the credential). Each code works once, before it expires."""
    session = sessions.redeem(body.code)
    return DashboardSessionPublic(
        token=session.token, expires_at=datetime.fromtimestamp(session.expires_at, UTC)
    )
