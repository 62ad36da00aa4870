"""REST shows each client's two figures: the announced cohort's (``epsilon``) and the one with
only its own noise share (``own_share_epsilon``, docs/accounting.md#what-the-agent-can-verify).

The finished job's DP-FedAvg entries carry f₁ = ``FEDAVG_OWN_FRACTION``; its PATE-FL entries
carry none (as written before the coordinator recorded it). The own-share figure is recomputed
here from the events alone (``with_noise_fraction`` and ``compute_epsilon``), on SQLite and
PostgreSQL; the clients with a PATE-FL entry get null with the reason.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from support.api import FEDAVG_EVENT, FEDAVG_OWN_FRACTION, FinishedJob, bearer

from dpfl.accounting import SelfComposedEvent, compute_epsilon
from dpfl.server.store import Store

pytestmark = pytest.mark.anyio


async def get(client: httpx.AsyncClient, path: str, **headers: str) -> Any:
    r = await client.get(f"/api/v1{path}", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


async def test_each_client_shows_both_figures(
    backend_admin: tuple[httpx.AsyncClient, Store, FinishedJob],
) -> None:
    admin, store, finished = backend_admin
    voters = set(finished.client_ids[:2])  # charged by the PATE-FL job too: f₁ unknown there
    listed = {c["id"]: c for c in await get(admin, "/clients")}
    assert set(listed) == set(finished.client_ids)
    for client_id in finished.client_ids:
        report = await get(admin, f"/clients/{client_id}/budget")
        detail = await get(admin, f"/clients/{client_id}")
        delta = report["delta"]
        rounds = sum(1 for e in report["events"] if e["job_id"] == finished.job.id)
        assert rounds == 3
        for shown in (report, listed[client_id], detail):
            assert shown["epsilon"] == store.client_budget(client_id).epsilon  # unchanged
            if client_id in voters:
                assert shown["own_share_epsilon"] is None
                assert "1 ledger entry was written before" in shown["own_share_unknown"]
                continue
            own = FEDAVG_EVENT.with_noise_fraction(FEDAVG_OWN_FRACTION)
            expected = compute_epsilon(SelfComposedEvent(own, rounds), delta=delta).epsilon
            cohort = compute_epsilon(SelfComposedEvent(FEDAVG_EVENT, rounds), delta=delta)
            assert shown["own_share_epsilon"] == pytest.approx(expected, rel=1e-6)
            assert shown["epsilon"] == pytest.approx(cohort.epsilon, rel=1e-6)
            assert shown["own_share_epsilon"] > shown["epsilon"]
            assert shown["own_share_unknown"] is None
        assert (report["own_share_method"] is None) == (client_id in voters)
        fractions = {e["job_id"]: e["own_noise_fraction"] for e in report["events"]}
        expected_fractions = {finished.job.id: FEDAVG_OWN_FRACTION}
        if client_id in voters:
            expected_fractions[finished.pate_job.id] = None
        assert fractions == expected_fractions


async def test_a_client_reads_its_own_figures_with_its_token(
    anon: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    client_id = finished.client_ids[-1]
    token = bearer(finished.api_token(client_id))
    report = await get(anon, f"/clients/{client_id}/budget?delta=1e-6", **token)
    assert report["delta"] == 1e-6
    assert (
        report["own_share_epsilon"] == store.client_budget(client_id, delta=1e-6).own_share_epsilon
    )


async def test_the_openapi_document_describes_both_figures(anon: httpx.AsyncClient) -> None:
    schemas = (await get(anon, "/openapi.json"))["components"]["schemas"]
    for name in ("ClientSummary", "ClientPublic", "BudgetReport"):
        props = schemas[name]["properties"]
        assert "trusts no peer" in props["own_share_epsilon"]["description"], name
        assert "announced cohort" in props["own_share_epsilon"]["description"], name
        assert "announced cohort" in props["epsilon"]["description"], name
        assert props["own_share_unknown"]["description"], name
    event = schemas["LedgerEventPublic"]["properties"]["own_noise_fraction"]
    assert "own share" in event["description"]
