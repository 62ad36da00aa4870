"""The dashboard in a real browser: Debian's chromium, driven by Playwright, against a live
uvicorn serving a store that holds a finished job.

The browser is never downloaded: the test launches ``/usr/bin/chromium`` (``make browser``
installs it where apt is available) headless, with a fresh profile and background networking
off, and skips, saying why, when it is absent. The sign-in page shows only sign-in. It signs in
with the admin token once, checks one
table row per client with the ε the store reports (the announced cohort's, and beside it the
own-share figure or "unknown"), the ε-over-rounds and accuracy charts, the
round timeline (dropout, aborted attempt), that the token survives a reload (session storage),
that no request leaves the coordinator's origin and that the console stays clean, and saves a
screenshot under ``tests/artifacts/``. A one-time dashboard link signs in once (a second use
shows why not), and docs/api.md's headless screenshot recipe works over HTTPS with the
federation's own CA, which the browser does not trust.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.api import admin_settings, build_finished_job, live_server, make_app
from support.browser import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip
from support.paths import ARTIFACTS

from dpfl.server.dashboard_link import dashboard_url, mint_code
from dpfl.server.store import Store, open_store
from dpfl.server.tls import init_pki

pytestmark = pytest.mark.browser


@pytest.fixture
def chromium() -> Path:
    return chromium_or_skip(CHROMIUM)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'dpfl.db'}") as store:
        yield store


def _wait_for(condition: Callable[[], bool], page: Any, seconds: float = 10.0) -> None:
    """Let Playwright deliver the page's events until ``condition`` holds."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the browser did not report the expected events"
        page.wait_for_timeout(50)


def test_dashboard_shows_the_finished_job(chromium: Path, store: Store, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    finished = build_finished_job(store)
    settings = admin_settings()
    token = settings.admin_token.get_secret_value()
    requests: list[str] = []
    refused: list[str] = []
    problems: list[str] = []

    def on_console(message: Any) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    with (
        live_server(make_app(store, settings=settings)) as base,
        sync_playwright() as pw,
    ):
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh profile every run
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            context.on("request", lambda request: requests.append(request.url))
            page = context.new_page()
            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on("response", lambda r: refused.append(r.url) if r.status == 401 else None)

            # the sign-in page shows only sign-in: no "Refresh", no "Forget token"
            page.goto(f"{base}/")
            expect(page.locator("#login")).to_be_visible()
            for hidden in ("#session", "#refresh", "#sign-out", "#dashboard"):
                expect(page.locator(hidden)).to_be_hidden()

            # a wrong token is refused with the API's message, and nothing is shown
            page.fill("#token", "not-the-admin-token")
            page.click("#login-form button[type=submit]")
            expect(page.locator("#login-error")).to_contain_text("refused the token")
            expect(page.locator("#dashboard")).to_be_hidden()
            # the page asks for clients and jobs at once and shows the first refusal; the
            # browser logs each refused request, the second one possibly later: wait for both
            # logs before clearing, so that nothing else may fail afterwards
            _wait_for(lambda: len(refused) == 2 and len(problems) == 2, page)
            assert all("status of 401" in p for p in problems), problems
            problems.clear()

            page.fill("#token", token)
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("body[data-loaded=true]")

            # one row per client, with the ε the store reports
            rows = page.locator("#clients-table tbody tr")
            expect(rows).to_have_count(len(finished.client_ids))
            seen = set()
            for i in range(rows.count()):
                row = rows.nth(i)
                client_id = row.get_attribute("data-client-id")
                assert client_id is not None
                seen.add(client_id)
                cell = row.locator("td.epsilon")
                shown = float(cell.get_attribute("data-epsilon") or "nan")
                expected = store.client_budget(client_id)
                assert shown == pytest.approx(expected.epsilon, rel=1e-12)
                assert cell.inner_text() == f"{expected.epsilon:.3f}"
                # beside it, the figure with only the client's own noise share, or "unknown"
                # with the API's reason (the PATE-FL entries carry no f₁)
                own = row.locator("td.own-share")
                if expected.own_share_epsilon is None:
                    assert expected.own_share_unknown
                    assert own.inner_text() == "unknown"
                    assert own.get_attribute("data-epsilon") == ""
                    assert expected.own_share_unknown in (own.get_attribute("title") or "")
                else:
                    assert float(own.get_attribute("data-epsilon") or "nan") == pytest.approx(
                        expected.own_share_epsilon, rel=1e-12
                    )
                    assert own.inner_text() == f"{expected.own_share_epsilon:.3f}"
                    assert expected.own_share_epsilon > expected.epsilon
                remaining = row.locator("td.remaining").inner_text()
                if expected.remaining_epsilon is None:
                    assert remaining == "–"
                else:
                    assert remaining == f"{expected.remaining_epsilon:.3f}"
            assert seen == set(finished.client_ids)
            shown_unknown = page.locator("#clients-table td.own-share.unknown").count()
            assert 0 < shown_unknown < len(finished.client_ids)  # both kinds are on the page
            headers = page.locator("#clients-table thead th").all_inner_texts()
            assert any("announced cohort" in h for h in headers), headers
            assert any("own share only" in h for h in headers), headers

            # ε over rounds of the first client: one point per ledger entry, budget line
            first = finished.client_ids[0]
            page.locator(f'tr[data-client-id="{first}"] button').click()
            chart = page.locator("#eps-chart svg")
            expect(chart).to_have_count(1)
            entries = len(store.ledger_entries(agent_id=first))
            expect(
                page.locator('#eps-chart g[data-series="total ε (all jobs)"] circle')
            ).to_have_count(entries)
            expect(page.locator("#eps-chart svg g.reference")).to_have_count(1)

            # the DP-FedAvg job: accuracy per completed round, the timeline with its dropout
            # and its aborted attempt
            page.select_option("#job-select", finished.job.id)
            timeline = page.locator("#timeline li.round")
            expect(timeline).to_have_count(len(finished.rounds))
            expect(page.locator('#timeline li[data-status="aborted"]')).to_have_count(1)
            expect(page.locator('#timeline li[data-status="aborted"]')).to_contain_text(
                "too few survivors"
            )
            expect(page.locator('#timeline li[data-round="2"]')).to_contain_text(
                "1 dropped at share keys"
            )
            expect(page.locator("#acc-chart circle")).to_have_count(3)

            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            # the token is kept for the tab: a reload shows the dashboard again
            page.reload()
            page.wait_for_selector("body[data-loaded=true]")
            expect(rows).to_have_count(len(finished.client_ids))
            page.click("#sign-out")
            expect(page.locator("#login")).to_be_visible()
        finally:
            context.close()

    assert problems == []
    foreign = [url for url in requests if not url.startswith(base) and not url.startswith("data:")]
    assert foreign == [], f"the dashboard requested other origins: {foreign}"
    assert any(url.startswith(f"{base}/api/v1/clients") for url in requests)


def test_api_docs_render_offline_under_the_csp(chromium: Path, tmp_path: Path) -> None:
    """Swagger UI at /api/docs renders the coordinator's operations with every request to the
    coordinator's own origin and no console error (a CSP violation would be one)."""
    from playwright.sync_api import expect, sync_playwright

    requests: list[str] = []
    problems: list[str] = []

    def on_console(message: Any) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    with (
        open_store(f"sqlite:///{tmp_path / 'docs.db'}") as store,
        live_server(make_app(store, settings=admin_settings())) as base,
        sync_playwright() as pw,
    ):
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            context.on("request", lambda request: requests.append(request.url))
            page = context.new_page()
            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(f"{base}/api/docs")
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("dpfl coordinator")
            expect(
                page.locator(".opblock-summary-path", has_text="/api/v1/jobs").first
            ).to_be_visible()
            expect(page.locator("button.authorize")).to_be_visible()
        finally:
            context.close()
    assert problems == [], requests
    assert requests
    assert all(url.startswith(base) for url in requests), requests


def test_a_one_time_link_signs_in_once(chromium: Path, store: Store, tmp_path: Path) -> None:
    """``#login=CODE`` opens the dashboard signed in and leaves the address bar; the same link
    a second time shows the sign-in page saying that it was already used."""
    from playwright.sync_api import expect, sync_playwright

    finished = build_finished_job(store)
    settings = admin_settings()
    link_code = mint_code(settings.admin_token.get_secret_value())
    with (
        live_server(make_app(store, settings=settings)) as base,
        sync_playwright() as pw,
    ):
        link = dashboard_url(base, link_code)
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            page = context.new_page()
            page.goto(link)
            page.wait_for_selector("body[data-loaded=true]")
            assert "login=" not in page.url
            expect(page.locator("#clients-table tbody tr")).to_have_count(len(finished.client_ids))
            expect(page.locator("#sign-out")).to_be_visible()
            expect(page.locator("#login")).to_be_hidden()

            second = context.new_page()  # session storage is per tab: a fresh sign-in
            second.goto(link)
            expect(second.locator("#login-error")).to_contain_text("already used")
            expect(second.locator("#dashboard")).to_be_hidden()
            expect(second.locator("#sign-out")).to_be_hidden()
        finally:
            context.close()


def _spki_sha256(certificate: Path) -> str:
    """What ``openssl x509 -pubkey | openssl pkey -pubin -outform der | openssl dgst -sha256
    -binary | base64`` prints: chromium's pin of a certificate's public key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(certificate.read_bytes()).public_key()
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode("ascii")


def test_the_headless_screenshot_recipe(chromium: Path, store: Store, tmp_path: Path) -> None:
    """docs/api.md's recipe: ``chromium --headless --screenshot`` of a dashboard link, over
    HTTPS whose certificate comes from the federation's CA, pinned by its public key
    (``--ignore-certificate-errors-spki-list``); ``--dump-dom`` shows the loaded dashboard."""
    finished = build_finished_job(store)
    settings = admin_settings()
    admin = settings.admin_token.get_secret_value()
    init_pki(tmp_path / "pki", hostnames=("localhost", "127.0.0.1"))
    cert, key = tmp_path / "pki" / "coordinator.pem", tmp_path / "pki" / "coordinator.key"
    shot = tmp_path / "dashboard.png"
    with live_server(make_app(store, settings=settings), tls=(cert, key)) as base:
        assert base.startswith("https://")
        recipe = [
            str(chromium),
            "--headless",
            *CHROMIUM_ARGS,
            f"--ignore-certificate-errors-spki-list={_spki_sha256(cert)}",
            "--window-size=1280,1600",
            "--virtual-time-budget=20000",
            f"--user-data-dir={tmp_path / 'profile'}",
        ]
        subprocess.run(
            [*recipe, f"--screenshot={shot}", dashboard_url(base, mint_code(admin))],
            capture_output=True,
            timeout=120,
            check=True,
        )
        dom = subprocess.run(
            [*recipe, "--dump-dom", dashboard_url(base, mint_code(admin))],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    assert shot.read_bytes().startswith(b"\x89PNG")
    assert 'data-loaded="true"' in dom, dom[:2000]
    status = re.search(r'<p id="status"[^>]*>([^<]*)<', dom)
    assert status is not None
    assert status.group(1) == f"{len(finished.client_ids)} clients, 2 jobs."
