"""Probes and metrics: ``/healthz`` (serving), ``/readyz`` (database), ``/metrics`` (Prometheus).

``/healthz`` and ``/readyz`` are public: orchestrators (Kubernetes, compose) probe them without
credentials, and they reveal only up/down. ``/healthz`` answers 200 once this app serves and every
check in ``app.state.health_checks`` (name → ``Callable[[], bool]``) passes; the serve command
registers one for the gRPC server, so 200 means both servers listen. Its ``X-DPFL-gRPC-Port``
header names the coordinator's gRPC port (public, like the port itself), so that an agent
pointed at the REST port by mistake can say which port to use (:mod:`dpfl.cmdline.ports`).

``/metrics`` needs a token: it exposes job ids and the largest ε any client has spent,
operational facts about the participants' privacy that the dashboard also guards. The metrics
token (``DPFL_METRICS_TOKEN``) reads it and nothing else, so Prometheus need not hold the admin
token; Prometheus sends it natively (``authorization: {credentials_file: ...}`` in a scrape
config). Its counters are process-local, as Prometheus expects of a counter: they restart at 0
with the coordinator, and ``rate()``/``increase()`` treat the drop as a reset; the privacy gauges
are read from the store at each scrape and so survive restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import anyio.to_thread
from fastapi import APIRouter, Request, Response

from dpfl.cmdline.ports import GRPC_PORT_HEADER
from dpfl.server.api.deps import MetricsDep, MetricsReaderDep, StoreDep
from dpfl.server.api.errors import error_response
from dpfl.server.api.routes import error_responses
from dpfl.server.api.schemas import HealthPublic
from dpfl.server.errors import ServerError
from dpfl.server.metrics import CONTENT_TYPE

router = APIRouter(tags=["health"])

_UNAVAILABLE = error_responses(503)


def _run_checks(checks: Mapping[str, Callable[[], bool]]) -> dict[str, bool]:
    out = {}
    for name, check in checks.items():
        try:
            out[name] = bool(check())
        except Exception:  # a failing probe is a failed check, never a 500
            out[name] = False
    return out


@router.get("/healthz", response_model=HealthPublic, responses=_UNAVAILABLE)
async def healthz(request: Request, response: Response) -> Response | HealthPublic:
    """200 while this process serves and every registered health check passes (the checks run
    on the event loop, never queued behind store calls in the thread pool: keep them cheap)."""
    results = _run_checks(request.app.state.health_checks)
    failed = sorted(name for name, ok in results.items() if not ok)
    answer: Response | HealthPublic
    if failed:
        answer = error_response(503, f"not serving: {', '.join(failed)}")
    else:
        answer = HealthPublic(status="ok", checks=results)
    grpc_port = getattr(request.app.state, "grpc_port", None)
    if grpc_port:  # for an agent pointed here by mistake (dpfl.cmdline.ports)
        response.headers[GRPC_PORT_HEADER] = str(grpc_port)
        if isinstance(answer, Response):
            answer.headers[GRPC_PORT_HEADER] = str(grpc_port)
    return answer


@router.get("/readyz", response_model=HealthPublic, responses=_UNAVAILABLE)
async def readyz(store: StoreDep) -> Response | HealthPublic:
    """200 when the database answers (``Store.ping``), else 503 naming the problem."""
    try:
        await anyio.to_thread.run_sync(store.ping)
    except ServerError as exc:
        return error_response(503, f"database unreachable: {exc}", code="unavailable")
    except Exception as exc:  # a probe reports any failure as not ready, never as a 500
        return error_response(503, f"database check failed: {type(exc).__name__}")
    return HealthPublic(status="ready", checks={"database": True})


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **error_responses(401, 403),
    },
)
async def metrics(_: MetricsReaderDep, metrics: MetricsDep) -> Response:
    """Prometheus text format (the metrics token or the admin token; see the module
    docstring)."""
    body = await anyio.to_thread.run_sync(metrics.render)
    return Response(content=body, media_type=CONTENT_TYPE)
