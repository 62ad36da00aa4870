"""How the REST API reports errors: always JSON ``{"detail": "...", "code": "..."}``.

The typed errors of ``dpfl.server.errors`` carry their HTTP status (``http_status``) and a stable
code, so this module is a table lookup, not an ``isinstance`` ladder. A bad job document
(``JobSpecError``) is 422 with one ``problems`` line per mistake (at most
``dpfl.server.documents.MAX_PROBLEMS``); a request that does not match
the route's parameters is 422 with every problem named in ``detail``; a 401 also carries
``WWW-Authenticate: Bearer``. An unexpected exception is logged and answered with a generic 500
that reveals nothing about the internals.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpfl.learning.jobs import JobSpecError
from dpfl.server.documents import DocumentTooLargeError, bounded_problems
from dpfl.server.errors import ServerError

__all__ = ["error_response", "install_error_handlers"]

_log = logging.getLogger("dpfl.server.api")

_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    503: "unavailable",
}


def error_response(
    status: int,
    detail: str,
    *,
    code: str | None = None,
    problems: Sequence[str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The JSON error body every route answers with."""
    body: dict[str, object] = {"detail": detail, "code": code or _CODES.get(status, "error")}
    if problems is not None:
        body["problems"] = list(problems)
    out_headers = dict(headers or {})
    if status == 401:
        out_headers.setdefault("WWW-Authenticate", 'Bearer realm="dpfl"')
    return JSONResponse(body, status_code=status, headers=out_headers or None)


def _where(loc: Sequence[Any]) -> str:
    if not loc:
        return "request"
    kind, rest = str(loc[0]), [str(p) for p in loc[1:]]
    name = ".".join(rest)
    return {
        "query": f"query parameter {name!r}",
        "path": f"path parameter {name!r}",
        "header": f"header {name!r}",
        "body": f"body field {name!r}" if name else "body",
    }.get(kind, ".".join([kind, *rest]))


def _validation_problems(exc: RequestValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        got = err.get("input")
        shown = (
            f" (got {got!r})" if isinstance(got, str | int | float) and len(repr(got)) < 80 else ""
        )
        out.append(f"{_where(err.get('loc', ()))}: {message}{shown}")
    return out


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServerError)
    if exc.http_status >= 500:
        _log.error("%s %s failed: %s", request.method, request.url.path, exc)
    return error_response(exc.http_status, str(exc), code=exc.code)


async def _job_spec_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, JobSpecError)
    problems = bounded_problems(exc.problems)
    detail = "invalid job specification: " + "; ".join(problems)
    if isinstance(exc, DocumentTooLargeError):
        return error_response(413, detail, problems=problems)
    return error_response(422, detail, code="invalid_job", problems=problems)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = _validation_problems(exc)
    return error_response(422, "; ".join(problems), code="invalid_request", problems=problems)


#: The operations of an OpenAPI path item (its other keys are parameters, a summary...).
_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


@functools.lru_cache(maxsize=256)
def _template(path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}/]+\})", path)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


def allowed_methods(request: Request) -> list[str]:
    """Every method the OpenAPI document declares for the request's path, sorted (empty for a
    path it does not describe).

    Starlette's 405 names the methods of the first route whose path matched: ``POST`` alone on
    ``/api/v1/jobs``, whose ``GET`` is another route. ``Allow`` must list them all (RFC 9110,
    15.5.6), and the document is the one list of them.
    """
    paths: dict[str, dict[str, object]] = request.app.openapi().get("paths", {})
    path, root = request.url.path, str(request.scope.get("root_path", ""))
    if root and path.startswith(root):
        path = path[len(root) :]
    methods: set[str] = set()
    for template, item in paths.items():
        if _template(template).fullmatch(path):
            methods.update(m.upper() for m in item if m in _HTTP_METHODS)
    return sorted(methods)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    headers = dict(exc.headers or {})
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.url.path!r}"
    elif exc.status_code == 405:
        detail = f"method {request.method} is not allowed on {request.url.path!r}"
        allowed = allowed_methods(request)
        if allowed:
            headers = {k: v for k, v in headers.items() if k.lower() != "allow"}
            headers["Allow"] = ", ".join(allowed)
    return error_response(exc.status_code, detail, headers=headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    _log.exception("%s %s failed unexpectedly", request.method, request.url.path)
    return error_response(500, "internal server error (see the coordinator's log)", code="internal")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers above on ``app``."""
    app.add_exception_handler(ServerError, _server_error)
    app.add_exception_handler(JobSpecError, _job_spec_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
