"""One-time dashboard links (issue 36, item 4): a code minted from the admin token is exchanged
once, before it expires, for a read-only dashboard session; a wrong, forged, expired or used code
is a 401; the admin token never appears in the link; ``dpfl-coordinator dashboard-link`` prints
a link the app accepts."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from support.api import FinishedJob, bearer

from dpfl.server.cli.main import main as coordinator_main
from dpfl.server.dashboard_link import (
    LINK_FRAGMENT,
    MAX_LINK_TTL_S,
    SESSION_TTL_S,
    DashboardSessions,
    dashboard_url,
    mint_code,
)
from dpfl.server.errors import InvalidCredential

from .test_auth import admin_routes

SESSIONS = "/api/v1/dashboard/sessions"


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the exchange, without HTTP ----------------------------------------------------------------


def test_a_code_opens_one_session_and_never_holds_the_admin_token() -> None:
    token = "an-admin-token-" + "x" * 20
    clock = Clock()
    sessions = DashboardSessions(token, clock=clock)
    code = mint_code(token, now=clock.now)
    assert token not in code
    assert token not in dashboard_url("https://coord:8080/", code)
    assert dashboard_url("https://coord:8080/", code) == f"https://coord:8080/#login={code}"
    session = sessions.redeem(code)
    assert session.token.startswith("dpfl_dash_")
    assert session.expires_at == clock.now + SESSION_TTL_S
    assert sessions.is_session(session.token)
    with pytest.raises(InvalidCredential, match="already used"):
        sessions.redeem(code)


def test_an_expired_code_and_an_expired_session_are_refused() -> None:
    token = "an-admin-token-" + "y" * 20
    clock = Clock()
    sessions = DashboardSessions(token, clock=clock)
    code = mint_code(token, ttl_s=60, now=clock.now)
    live = sessions.redeem(mint_code(token, ttl_s=60, now=clock.now))
    clock.now += 60
    with pytest.raises(InvalidCredential, match="expired"):
        sessions.redeem(code)
    assert sessions.is_session(live.token)
    clock.now += SESSION_TTL_S
    assert not sessions.is_session(live.token)


@pytest.mark.parametrize(
    "code",
    ["", "garbage", "1.2", "x.y.z", "99999999999.abc.def", "1000600.nonce.not-the-mac"],
)
def test_malformed_and_forged_codes_are_refused(code: str) -> None:
    sessions = DashboardSessions("an-admin-token-" + "z" * 20, clock=Clock())
    with pytest.raises(InvalidCredential):
        sessions.redeem(code)


def test_a_code_of_another_admin_token_is_refused() -> None:
    clock = Clock()
    sessions = DashboardSessions("an-admin-token-" + "a" * 20, clock=clock)
    with pytest.raises(InvalidCredential, match="not issued for this coordinator"):
        sessions.redeem(mint_code("another-token-" + "b" * 20, now=clock.now))


def test_link_lifetimes_are_bounded() -> None:
    with pytest.raises(ValueError, match="at most 60 minutes"):
        mint_code("t" * 32, ttl_s=MAX_LINK_TTL_S + 1)
    with pytest.raises(ValueError, match="admin token"):
        mint_code("")


# -- over HTTP ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_session_reads_every_admin_route_and_changes_nothing(
    anon: httpx.AsyncClient, admin_token: str, finished: FinishedJob
) -> None:
    response = await anon.post(SESSIONS, json={"code": mint_code(admin_token)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["read_only"] is True
    assert body["token"].startswith("dpfl_dash_")
    session = bearer(body["token"])
    for method, path in admin_routes(finished):
        answer = await anon.request(method, path, headers=session)
        if method == "GET":
            assert answer.status_code in (200, 404), (path, answer.text)
        else:
            assert answer.status_code == 403, (method, path, answer.text)
            assert "may only read" in answer.json()["detail"]
    own = await anon.get(f"/api/v1/clients/{finished.client_ids[0]}/budget", headers=session)
    assert own.status_code == 200


@pytest.mark.anyio
async def test_wrong_used_and_expired_codes_answer_401(
    anon: httpx.AsyncClient, app: FastAPI, admin_token: str
) -> None:
    wrong = await anon.post(SESSIONS, json={"code": mint_code("not-the-admin-token-1234567")})
    assert wrong.status_code == 401
    assert wrong.json()["code"] == "unauthenticated"
    assert wrong.headers["www-authenticate"].startswith("Bearer")

    code = mint_code(admin_token)
    assert (await anon.post(SESSIONS, json={"code": code})).status_code == 200
    again = await anon.post(SESSIONS, json={"code": code})
    assert again.status_code == 401
    assert "already used" in again.json()["detail"]

    clock = Clock()
    app.state.dashboard_sessions = DashboardSessions(admin_token, clock=clock)
    stale = mint_code(admin_token, ttl_s=30, now=clock.now)
    clock.now += 31
    expired = await anon.post(SESSIONS, json={"code": stale})
    assert expired.status_code == 401
    assert "expired" in expired.json()["detail"]

    assert (await anon.post(SESSIONS, json={})).status_code == 422
    assert (await anon.post(SESSIONS, json={"code": code, "token": admin_token})).status_code == 422


@pytest.mark.anyio
async def test_a_made_up_session_token_is_401(anon: httpx.AsyncClient) -> None:
    answer = await anon.get("/api/v1/clients", headers=bearer("dpfl_dash_" + "A" * 43))
    assert answer.status_code == 401


# -- the command --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_command_prints_a_link_the_coordinator_accepts(
    anon: httpx.AsyncClient,
    admin_token: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("DPFL_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPFL_ADMIN_TOKEN", admin_token)
    monkeypatch.setenv("DPFL_API_PORT", "18080")
    assert coordinator_main(["dashboard-link"]) == 0
    out = capsys.readouterr().out.strip()
    match = re.fullmatch(rf"http://127\.0\.0\.1:18080/#{LINK_FRAGMENT}=(\S+)", out)
    assert match, out
    assert admin_token not in out
    answer = await anon.post(SESSIONS, json={"code": match.group(1)})
    assert answer.status_code == 200, answer.text

    assert coordinator_main(["dashboard-link", "--url", "https://coord.example:8443/"]) == 0
    assert capsys.readouterr().out.startswith("https://coord.example:8443/#login=")
    assert coordinator_main(["dashboard-link", "--ttl", "2h"]) == 2
    assert "at most 60 minutes" in capsys.readouterr().err
    assert coordinator_main(["dashboard-link", "--url", "coord:8080"]) == 2
    monkeypatch.delenv("DPFL_ADMIN_TOKEN")
    assert coordinator_main(["dashboard-link"]) == 2
    assert "admin_token" in capsys.readouterr().err.lower()
