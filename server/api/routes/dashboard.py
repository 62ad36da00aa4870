"""The dashboard: ``/`` serves ``static/index.html``; its scripts and styles live under
``/static``. Public (they contain no data): the page asks for the admin token and reads the API
with it. Every asset is local: the Content-Security-Policy forbids any other origin.

``/api/docs`` is the interactive API reference: Swagger UI 5 (which reads OpenAPI 3.1) from the
``swagger-ui-py`` package, whose two files are served under ``/api/docs/assets`` (nothing is
fetched from a CDN), started by ``static/api-docs.js`` over ``/api/v1/openapi.json``."""

from __future__ import annotations

from pathlib import Path

import swagger_ui
from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

router = APIRouter(include_in_schema=False)

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
