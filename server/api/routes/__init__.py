"""One router per resource; each is a thin adapter over :mod:`dpfl.server.api.queries`."""

from __future__ import annotations

from dpfl.server.api.schemas import ErrorPublic

_DESCRIPTIONS = {
    400: "The body is not valid JSON.",
    401: "No bearer token, or an unknown or revoked one.",
    403: "The token may not use this route (a client token outside its own client).",
    404: "No such client, job or model version.",
    409: "Not allowed in the current state.",
    413: "The body is too large.",
    415: "The body's content type is not accepted.",
    422: "A parameter or the body is invalid; `detail` names each problem.",
    503: "Not ready.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, object]]:
    """The OpenAPI ``responses`` entries of these error statuses (all ``ErrorPublic``)."""
    return {s: {"model": ErrorPublic, "description": _DESCRIPTIONS[s]} for s in statuses}
