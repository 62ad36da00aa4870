"""``/api/v1/clients``: who has spent how much privacy, and what remains.

Listing is for the admin; a client token may read its own record, budget and ε history only.
The handlers block on the store, so the routes are plain ``def`` (FastAPI runs them in worker
threads).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from dpfl.server.api import queries
from dpfl.server.api.deps import AdminDep, ClientId, ClientReaderDep, StoreDep
from dpfl.server.api.routes import error_responses
from dpfl.server.api.schemas import (
    BudgetReport,
    ClientPublic,
    ClientSummary,
    EpsilonHistory,
)

router = APIRouter(prefix="/clients", tags=["clients"])

Delta = Annotated[
    float | None,
    Query(
        gt=0,
        lt=1,
        description="δ to report ε at (default: the client's budget δ, else 1e-5).",
    ),
]
_AUTH = error_responses(401, 403, 422)
_ONE = error_responses(401, 403, 404, 422)


@router.get("", response_model=list[ClientSummary], responses=_AUTH)
def list_clients(_: AdminDep, store: StoreDep, delta: Delta = None) -> list[ClientSummary]:
    """Every client with ε spent and remaining (admin only)."""
    return queries.client_summaries(store, delta=delta)


@router.get("/{client_id}", response_model=ClientPublic, responses=_ONE)
def get_client(
    client_id: ClientId, _: ClientReaderDep, store: StoreDep, delta: Delta = None
) -> ClientPublic:
    """One client: its record, spending and jobs."""
    return queries.client_detail(store, client_id, delta=delta)


@router.get("/{client_id}/budget", response_model=BudgetReport, responses=_ONE)
def get_budget(
    client_id: ClientId,
    _: ClientReaderDep,
    store: StoreDep,
    delta: Delta = None,
    tight: Annotated[
        bool,
        Query(description="Also try the tight (PLD) bound; the smaller valid bound is reported."),
    ] = False,
) -> BudgetReport:
    """ε at ``delta``, per job and in total, the events behind it, and the remaining budget."""
    return queries.budget_report(store, client_id, delta=delta, tight=tight)


@router.get("/{client_id}/history", response_model=EpsilonHistory, responses=_ONE)
def get_history(
    client_id: ClientId, _: ClientReaderDep, store: StoreDep, delta: Delta = None
) -> EpsilonHistory:
    """The client's cumulative ε after each of its ledger entries (ε over rounds)."""
    return queries.epsilon_history(store, client_id, delta=delta)
