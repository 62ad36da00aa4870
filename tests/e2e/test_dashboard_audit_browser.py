"""The dashboard's job view shows a stored audit's ε lower bound next to the ledger's ε, in a
real browser (Debian's chromium driven by Playwright; skipped with the reason when absent).

The store holds a real audited run: ``run_audit`` on a small DP-FedSGD job, written with
``record_audited_run`` (its rounds through the ledger's commit, then the audit), which is what
``dpfl audit --database-url`` does; a second audit of the same job whose lower bound exceeds the
ledger's ε is shown as a violation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.api import admin_settings, live_server, make_app
from support.browser import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip
from support.paths import ARTIFACTS

from dpfl.learning.audit import run_audit
from dpfl.learning.jobs import parse_job
from dpfl.server.audit_run import record_audited_run
from dpfl.server.store import Store, open_store

pytestmark = pytest.mark.browser

JOB = {
    "name": "audited-fedsgd",
    "algorithm": "dp-fedsgd",
    "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
    "model": "logreg",
    "rounds": 1,
    "privacy": {"unit": "record", "target_epsilon": 4.0, "delta": 1e-5},
    "params": {"clip": 1.0, "local_steps": 1, "batch_sampling_rate": 1.0},
}


@pytest.fixture
def chromium() -> Path:
    return chromium_or_skip(CHROMIUM)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'dpfl.db'}") as store:
        yield store


def test_job_view_shows_the_audit_beside_the_ledgers_epsilon(
    chromium: Path, store: Store, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    job = parse_job(JOB)
    report = run_audit(job, agents=3, canaries=80, seed=b"dpfl-dashboard-audit-seed")
    recorded = record_audited_run(store, job, report)
    job_id = recorded.job.id
    audit = recorded.audit
    leaky = store.add_privacy_audit(
        job_id, replace(audit.figures, epsilon_lower=audit.figures.epsilon_upper + 1.0)
    )
    ledger_max = max(store.job_epsilons(job_id).values())
    settings = admin_settings()
    problems: list[str] = []

    def on_console(message: Any) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    with live_server(make_app(store, settings=settings)) as base, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.new_page()
            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(f"{base}/")
            page.fill("#token", settings.admin_token.get_secret_value())
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("body[data-loaded=true]")
            page.select_option("#job-select", job_id)

            rows = page.locator("#audits-table tbody tr")
            expect(rows).to_have_count(2)
            first = page.locator(f'#audits-table tr[data-audit-id="{audit.id}"]')
            lower = first.locator("td.epsilon-lower")
            assert float(lower.get_attribute("data-epsilon") or "nan") == pytest.approx(
                audit.figures.epsilon_lower, rel=1e-12
            )
            assert lower.inner_text() == f"{audit.figures.epsilon_lower:.3f}"
            upper = first.locator("td.epsilon-upper")
            assert upper.inner_text() == f"{audit.figures.epsilon_upper:.3f}"
            assert audit.figures.epsilon_upper == pytest.approx(ledger_max, rel=1e-12)
            gdp = first.locator("td.epsilon-lower-gdp")
            assert gdp.inner_text() == f"{audit.figures.epsilon_lower_gdp:.3f}"
            expect(first).not_to_have_class("violation")
            expect(page.locator(f'#audits-table tr[data-audit-id="{leaky.id}"]')).to_have_class(
                "violation"
            )
            # the facts: the latest audit's lower bound next to the ledger's ε
            facts = page.locator("#job-facts")
            expect(facts).to_contain_text(f"Max ε in this job (δ = 0.00001){ledger_max:.3f}")
            expect(facts).to_contain_text(
                f"{leaky.figures.epsilon_lower:.3f} ≤ ε {leaky.figures.epsilon_upper:.3f}"
            )
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-audit.png"), full_page=True)
        finally:
            context.close()
    assert problems == []
