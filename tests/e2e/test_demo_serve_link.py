"""``dpfl demo --serve`` prints a one-time dashboard link that opens a session (issue 36, item
4): run as a user runs it (a subprocess, 10 agents in-process to keep it short), read the link
from its output, exchange the code once (a second time is 401), read the clients with the
session, then stop the command with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from support.limits import hang_guard

pytestmark = pytest.mark.slow

LINK = re.compile(r"(http://[\w.:\[\]-]+)/#login=(\S+)")


def test_the_demo_prints_a_link_that_opens_one_session() -> None:
    env = {**os.environ, "COLUMNS": "400"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpfl.cli.main",
            "demo",
            "--agents",
            "10",
            "--transport",
            "inproc",
            "--serve",
            "--api-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen: list[str] = []
    try:
        assert process.stdout is not None
        # the job's 10 rounds first (41 s in the suite on 2 cores); a line per event after
        deadline = time.monotonic() + hang_guard(45)
        match = None
        while match is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            seen.append(line)
            match = LINK.search(line)
        assert match is not None, "".join(seen)[-3000:]
        base, code = match.group(1), match.group(2)
        first = httpx.post(f"{base}/api/v1/dashboard/sessions", json={"code": code}, timeout=30)
        assert first.status_code == 200, first.text
        token = first.json()["token"]
        clients = httpx.get(
            f"{base}/api/v1/clients", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert clients.status_code == 200
        assert len(clients.json()) == 10
        again = httpx.post(f"{base}/api/v1/dashboard/sessions", json={"code": code}, timeout=30)
        assert again.status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
