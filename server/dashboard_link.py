"""One-time dashboard links: open the dashboard from a script or a headless browser without
typing the admin token, and without ever putting the admin token in a URL.

A link is ``<api url>/#login=<code>``. The code is ``<expiry>.<nonce>.<mac>``: its expiry (Unix
seconds), 16 random bytes and an HMAC-SHA256 over both, keyed by a key derived from the admin
token. Whoever holds the admin token can mint one without asking the coordinator
(``dpfl-coordinator dashboard-link``, ``dpfl demo --serve``); the coordinator checks it without
storing anything beforehand. The code sits in the URL's fragment, which the browser never sends
to a server, so it appears in no access log and no ``Referer``; the dashboard's script sends it
once to ``POST /api/v1/dashboard/sessions`` and removes it from the address bar.

Redeeming a code gives a **dashboard session token** (``dpfl_dash_…``): it reads every admin
route (``GET``) and changes nothing (403 on ``POST``), and it lasts :data:`SESSION_TTL_S`. A
code is accepted once (its nonce is remembered until it expires) and only before its expiry;
a wrong, expired or used code is a 401. Sessions and used nonces live in the coordinator's
memory: a restart signs every dashboard out (and forgets which unexpired codes were used, so
keep links short-lived: :data:`DEFAULT_LINK_TTL_S`, at most :data:`MAX_LINK_TTL_S`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dpfl.server.errors import InvalidCredential

__all__ = [
    "DEFAULT_LINK_TTL_S",
    "LINK_FRAGMENT",
    "MAX_LINK_TTL_S",
    "SESSION_PREFIX",
    "SESSION_TTL_S",
    "DashboardSession",
    "DashboardSessions",
    "dashboard_url",
    "mint_code",
]

#: A link is valid this long by default, and at most :data:`MAX_LINK_TTL_S`.
DEFAULT_LINK_TTL_S = 600.0
MAX_LINK_TTL_S = 3600.0
#: A dashboard session (what a code is exchanged for) lasts this long.
SESSION_TTL_S = 12 * 3600.0
#: The fragment key of the code in a link: ``https://host:8080/#login=CODE``.
LINK_FRAGMENT = "login"
SESSION_PREFIX = "dpfl_dash_"
_KEY_LABEL = b"dpfl dashboard link v1"
_NONCE_BYTES = 16


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _key(admin_token: str) -> bytes:
    """The links' MAC key: derived from the admin token, never the token itself."""
    return hmac.new(admin_token.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()


def _mac(key: bytes, expiry: int, nonce: str) -> str:
    return _b64(hmac.new(key, f"{expiry}.{nonce}".encode("ascii"), hashlib.sha256).digest())


def mint_code(
    admin_token: str, *, ttl_s: float = DEFAULT_LINK_TTL_S, now: float | None = None
) -> str:
    """A one-time code for a dashboard link, valid for ``ttl_s`` seconds.

    Raises:
        ValueError: an empty admin token, or ``ttl_s`` outside (0, :data:`MAX_LINK_TTL_S`].
    """
    if not admin_token:
        raise ValueError("a dashboard link needs the admin token (DPFL_ADMIN_TOKEN)")
    if not 0 < ttl_s <= MAX_LINK_TTL_S:
        raise ValueError(
            f"a dashboard link is valid for at most {MAX_LINK_TTL_S / 60:g} minutes, "
            f"got {ttl_s:g} s"
        )
    expiry = int((time.time() if now is None else now) + ttl_s)
    nonce = _b64(secrets.token_bytes(_NONCE_BYTES))
    return f"{expiry}.{nonce}.{_mac(_key(admin_token), expiry, nonce)}"


def dashboard_url(base_url: str, code: str) -> str:
    """The link: the dashboard at ``base_url`` with the code in the fragment."""
    return f"{base_url.rstrip('/')}/#{LINK_FRAGMENT}={code}"


@dataclass(frozen=True, slots=True)
class DashboardSession:
    """What a code is exchanged for: a bearer token that reads every admin route."""

    token: str
    expires_at: float


class DashboardSessions:
    """The coordinator's side: redeems codes (once each) and recognises session tokens.

    Thread-safe (the REST routes run in worker threads). ``clock`` is ``time.time`` unless a
    test passes another.
    """

    def __init__(self, admin_token: str, *, clock: Callable[[], float] = time.time) -> None:
        self._key = _key(admin_token) if admin_token else None
        self._clock = clock
        self._lock = threading.Lock()
        self._used: dict[str, int] = {}  # nonce → expiry of its code
        self._sessions: dict[str, float] = {}  # token → expiry

    def redeem(self, code: str) -> DashboardSession:
        """Exchange a link's code for a session.

        Raises:
            InvalidCredential: a malformed, forged, expired or already used code (401).
        """
        now = self._clock()
        parts = code.split(".") if isinstance(code, str) else []
        if self._key is None or len(parts) != 3 or not parts[0].isdigit():
            raise InvalidCredential("not a dashboard link code")
        expiry, nonce, mac = int(parts[0]), parts[1], parts[2]
        if not hmac.compare_digest(
            mac.encode("ascii", "replace"), _mac(self._key, expiry, nonce).encode("ascii")
        ):
            raise InvalidCredential(
                "this dashboard link was not issued for this coordinator's admin token"
            )
        if expiry > now + MAX_LINK_TTL_S + 60:
            raise InvalidCredential("this dashboard link's expiry is out of range")
        if now >= expiry:
            raise InvalidCredential(
                "this dashboard link has expired: make a new one with "
                "'dpfl-coordinator dashboard-link'"
            )
        with self._lock:
            self._forget_expired(now)
            if nonce in self._used:
                raise InvalidCredential(
                    "this dashboard link was already used (each link opens one session): make "
                    "a new one with 'dpfl-coordinator dashboard-link'"
                )
            self._used[nonce] = expiry
            session = DashboardSession(
                SESSION_PREFIX + secrets.token_urlsafe(32), now + SESSION_TTL_S
            )
            self._sessions[session.token] = session.expires_at
        return session

    def is_session(self, token: str) -> bool:
        """Whether ``token`` is a live session token (compared by dictionary lookup of a
        256-bit random value, so its timing reveals nothing useful)."""
        if not token.startswith(SESSION_PREFIX):
            return False
        now = self._clock()
        with self._lock:
            expires = self._sessions.get(token)
            if expires is None:
                return False
            if now >= expires:
                del self._sessions[token]
                return False
            return True

    def _forget_expired(self, now: float) -> None:
        for nonce in [n for n, e in self._used.items() if e <= now]:
            del self._used[nonce]
        for token in [t for t, e in self._sessions.items() if e <= now]:
            del self._sessions[token]
