"""Every REST figure that adds up an approximate ledger entry carries ``approximate: true``.

The finished job's store gets a DP-FedAvg job with discrete Gaussian noise
(support.approximate_ledger): its first client then holds exact entries (DP-FedAvg, PATE-FL,
round 1) and one approximate entry (round 2); its second client holds exact entries only.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from support.api import FinishedJob
from support.approximate_ledger import ApproximateJob, add_approximate_job

from dpfl.server.store import Store

pytestmark = pytest.mark.anyio

#: The schemas whose figures add ledger entries up, each with its flag(s).
FLAGGED = {
    "ClientSummary": ["approximate"],
    "ClientPublic": ["approximate"],
    "BudgetReport": ["approximate"],
    "JobEpsilonPublic": ["approximate"],
    "EpsilonPoint": ["approximate", "job_approximate"],
    "JobDetail": ["approximate", "epsilons_approximate"],
    "RoundPublic": ["approximate"],
    "LedgerEventPublic": ["approximate"],
}


@pytest.fixture
def approx(store: Store, finished: FinishedJob) -> ApproximateJob:
    return add_approximate_job(store, finished.client_ids[0], finished.client_ids[1])


async def get(client: httpx.AsyncClient, path: str) -> Any:
    r = await client.get(f"/api/v1{path}")
    assert r.status_code == 200, r.text
    return r.json()


async def test_client_totals_list_and_budget(
    admin: httpx.AsyncClient, approx: ApproximateJob, finished: FinishedJob
) -> None:
    listed = {c["id"]: c["approximate"] for c in await get(admin, "/clients")}
    assert listed == {c: c == approx.mixed for c in finished.client_ids}
    assert (await get(admin, f"/clients/{approx.mixed}"))["approximate"] is True
    assert (await get(admin, f"/clients/{approx.exact}"))["approximate"] is False

    for tight in ("false", "true"):
        report = await get(admin, f"/clients/{approx.mixed}/budget?tight={tight}")
        assert report["approximate"] is True
        assert {j: b["approximate"] for j, b in report["by_job"].items()} == {
            finished.job.id: False,
            finished.pate_job.id: False,
            approx.job.id: True,  # one exact and one approximate entry
        }
        assert sum(e["approximate"] for e in report["events"]) == 1
    report = await get(admin, f"/clients/{approx.exact}/budget")
    assert report["approximate"] is False
    assert not any(b["approximate"] for b in report["by_job"].values())
    assert approx.job.id in report["by_job"]


async def test_job_figures_and_rounds(
    admin: httpx.AsyncClient, approx: ApproximateJob, finished: FinishedJob
) -> None:
    job = await get(admin, f"/jobs/{approx.job.id}")
    assert job["epsilons_approximate"] == {approx.mixed: True, approx.exact: False}
    assert set(job["epsilons"]) == set(job["epsilons_approximate"])
    assert job["approximate"] is True
    exact = await get(admin, f"/jobs/{finished.job.id}")
    assert exact["approximate"] is False
    assert exact["epsilons_approximate"] == dict.fromkeys(exact["epsilons"], False)

    rounds = await get(admin, f"/jobs/{approx.job.id}/rounds")
    assert [(r["number"], r["approximate"]) for r in rounds] == [(1, False), (2, True)]
    assert (await get(admin, f"/jobs/{approx.job.id}/rounds?number=2"))[0]["approximate"]
    exact_rounds = await get(admin, f"/jobs/{finished.job.id}/rounds")
    assert not any(r["approximate"] for r in exact_rounds)
    assert any(r["epsilon"] is None for r in exact_rounds)  # the aborted attempt


async def test_history_points_are_flagged_from_the_approximate_entry_on(
    admin: httpx.AsyncClient, approx: ApproximateJob, store: Store
) -> None:
    points = (await get(admin, f"/clients/{approx.mixed}/history"))["points"]
    tainted = next(e.id for e in store.ledger_entries(agent_id=approx.mixed) if e.approximate)
    assert [p["approximate"] for p in points] == [p["entry_id"] >= tainted for p in points]
    assert [p["job_approximate"] for p in points] == [
        p["entry_id"] >= tainted and p["job_id"] == approx.job.id for p in points
    ]
    points = (await get(admin, f"/clients/{approx.exact}/history"))["points"]
    assert not any(p["approximate"] or p["job_approximate"] for p in points)


async def test_a_client_token_sees_its_own_flag(
    anon: httpx.AsyncClient, approx: ApproximateJob, finished: FinishedJob
) -> None:
    headers = {"Authorization": f"Bearer {finished.api_token(approx.mixed)}"}
    r = await anon.get(f"/api/v1/clients/{approx.mixed}/budget", headers=headers)
    assert r.status_code == 200
    assert r.json()["approximate"] is True


async def test_the_openapi_document_types_every_flag(anon: httpx.AsyncClient) -> None:
    schemas = (await anon.get("/api/v1/openapi.json")).json()["components"]["schemas"]
    for name, flags in FLAGGED.items():
        for flag in flags:
            prop = schemas[name]["properties"][flag]
            assert flag in schemas[name]["required"], (name, flag)
            if flag == "epsilons_approximate":
                assert prop["additionalProperties"] == {"type": "boolean"}
            else:
                assert prop["type"] == "boolean", (name, flag)
            assert "proven" in prop["description"] or "approximate" in prop["description"]


async def test_metrics_count_the_clients_with_an_approximate_total(
    admin: httpx.AsyncClient, store: Store, finished: FinishedJob
) -> None:
    line = "dpfl_clients_approximate 0.0"
    assert line in (await admin.get("/metrics")).text.splitlines()
    add_approximate_job(store, finished.client_ids[0], finished.client_ids[1])
    assert "dpfl_clients_approximate 1.0" in (await admin.get("/metrics")).text.splitlines()
