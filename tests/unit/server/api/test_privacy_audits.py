"""``/api/v1/jobs/{id}/privacy-audits``: a job's audits beside the ledger's ε (admin only; the
401 and 403 cases of every credential are in test_auth.py with the other admin routes)."""

from __future__ import annotations

import math
from dataclasses import replace

import httpx
import pytest
from support.api import FinishedJob, bearer

from dpfl.server.store import PrivacyAuditFigures, Store

pytestmark = pytest.mark.anyio


def figures(store: Store, job_id: str, **overrides: object) -> PrivacyAuditFigures:
    base = PrivacyAuditFigures(
        mode="white-box",
        unit="agent",
        relation="add-remove",
        canaries=500,
        guesses=120,
        correct=101,
        confidence=0.95,
        delta=1e-5,
        epsilon_lower=0.8,
        epsilon_upper=max(store.job_epsilons(job_id).values()),
        mu_lower=0.3,
        epsilon_lower_gdp=1.1,
        details={"design": "canary agents", "rounds": 3},
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


async def test_audits_are_listed_oldest_first_with_the_ledgers_epsilon(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    job = finished.job.id
    r = await admin.get(f"/api/v1/jobs/{job}/privacy-audits")
    assert r.status_code == 200
    assert r.json() == []
    first = store.add_privacy_audit(job, figures(store, job))
    second = store.add_privacy_audit(
        job, figures(store, job, mode="black-box", epsilon_upper=math.inf)
    )
    store.add_privacy_audit(finished.pate_job.id, figures(store, finished.pate_job.id))
    body = (await admin.get(f"/api/v1/jobs/{job}/privacy-audits")).json()
    assert [a["id"] for a in body] == [first.id, second.id]
    shown = body[0]
    assert shown["job_id"] == job
    assert shown["epsilon_lower"] == 0.8
    assert shown["epsilon_upper"] == pytest.approx(max(store.job_epsilons(job).values()))
    assert shown["mu_lower"] == 0.3
    assert shown["epsilon_lower_gdp"] == 1.1
    assert (shown["canaries"], shown["guesses"], shown["correct"]) == (500, 120, 101)
    assert shown["details"] == {"design": "canary agents", "rounds": 3}
    assert body[1]["epsilon_upper"] == "Infinity"  # the API's spelling of an unbounded ε


async def test_unknown_and_malformed_job_ids(admin: httpx.AsyncClient) -> None:
    r = await admin.get("/api/v1/jobs/job-nope/privacy-audits")
    assert r.status_code == 404
    assert "job-nope" in r.json()["detail"]
    r = await admin.get("/api/v1/jobs/bad id!/privacy-audits")
    assert r.status_code == 422


async def test_client_token_is_refused_even_for_a_job_it_is_charged_in(
    anon: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    job = finished.job.id
    store.add_privacy_audit(job, figures(store, job))
    me = finished.client_ids[0]
    assert me in store.job_epsilons(job)
    r = await anon.get(f"/api/v1/jobs/{job}/privacy-audits", headers=bearer(finished.api_token(me)))
    assert r.status_code == 403
    assert "admin token" in r.json()["detail"]


async def test_both_sql_backends_serve_audits(
    backend_admin: tuple[httpx.AsyncClient, Store, FinishedJob],
) -> None:
    client, store, finished = backend_admin
    job = finished.job.id
    stored = store.add_privacy_audit(job, figures(store, job))
    body = (await client.get(f"/api/v1/jobs/{job}/privacy-audits")).json()
    assert [a["id"] for a in body] == [stored.id]
    assert body[0]["epsilon_upper"] == pytest.approx(stored.figures.epsilon_upper)
