"""``dpfl-coordinator serve`` with TLS, as an operator starts it (subprocesses, real CLI).

- certificates from ``dpfl-coordinator certs init/agent``; ``serve --tls-cert --tls-key
  --client-ca --require-client-cert`` answers ``/healthz`` over HTTPS to a client trusting the
  CA, and refuses clients that do not trust it and plaintext HTTP;
- ``dpfl-coordinator healthcheck`` (the images' HEALTHCHECK) is healthy against it, and against a
  ``--insecure`` coordinator (plain HTTP, without a TLS handshake logged there as a bad
  request), and unhealthy against a closed port;
- a client without a certificate at the gRPC port leaves no raw gRPC handshake line in the log;
- ``serve`` refuses to start without TLS unless ``--insecure``, refuses ``--insecure`` with TLS,
  and refuses a client CA without ``--require-client-cert`` (and the reverse), each with exit 2
  and a message naming the fix.
"""

from __future__ import annotations

import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dpfl.server.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or _env(),
        check=False,
    )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPFL_")}
    env["DPFL_ADMIN_TOKEN"] = secrets.token_urlsafe(32)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _serving(tmp_path: Path, *flags: str) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    """``serve`` on free ports; yields (process, REST port, [stdout, stderr] filled at exit)."""
    api_port, grpc_port = _free_port(), _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpfl.server.cli.main",
            "serve",
            "--database-url",
            f"sqlite:///{tmp_path / 'c.db'}",
            "--api-port",
            str(api_port),
            "--grpc-port",
            str(grpc_port),
            *flags,
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    output: list[str] = []
    try:
        _wait_listening(api_port, process)
        yield process, api_port, output
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
        output.extend([out, err])
    assert process.returncode == 0, err


def _wait_listening(port: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"serve did not listen on {port} within 30 s")


def _healthz(url: str, *, verify: ssl.SSLContext | bool) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        response = httpx.get(url, verify=verify, timeout=2)
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)  # 503 until the gRPC server's check passes


def test_serve_with_mutual_tls_serves_https_to_clients_trusting_the_ca(tmp_path: Path) -> None:
    pki, agent_dir = tmp_path / "pki", tmp_path / "silo-1"
    made = _cli("certs", "init", "--out", str(pki), "--hostname", "localhost")
    assert made.returncode == 0, made.stderr
    issued = _cli("certs", "agent", "silo-1", "--ca-dir", str(pki), "--out", str(agent_dir))
    assert issued.returncode == 0, issued.stderr
    flags = (
        *("--tls-cert", str(pki / "coordinator.pem"), "--tls-key", str(pki / "coordinator.key")),
        *("--client-ca", str(pki / "ca.pem"), "--require-client-cert"),
    )
    with _serving(tmp_path, *flags) as (_, port, output):
        trusting = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        response = _healthz(f"https://localhost:{port}/healthz", verify=trusting)
        assert response.status_code == 200
        assert response.json()["checks"] == {"grpc": True}
        # a client that does not trust the federation's CA (the system's CAs) is refused
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"https://localhost:{port}/healthz", timeout=2)
        # plaintext HTTP to the HTTPS port gets no answer
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        probe = _cli("healthcheck", "--port", str(port))
        assert probe.returncode == 0, probe.stdout
        assert probe.stdout.startswith(f"healthy: https://127.0.0.1:{port}/healthz")
    out, err = output
    assert f"REST on https://127.0.0.1:{port}" in out
    assert "mutual TLS on gRPC" in out
    assert "PLAINTEXT" not in out + err


def test_a_client_without_a_certificate_at_the_grpc_port_leaves_no_raw_handshake_line(
    tmp_path: Path,
) -> None:
    """``dpfl budget`` pointed at the gRPC port of a mutual-TLS coordinator is refused (and says
    which port to use); the coordinator's log holds no raw OpenSSL line from gRPC's core for it
    (``Handshake failed ... PEER_DID_NOT_RETURN_A_CERTIFICATE``), and its start line names the
    likely cause of such refusals once."""
    pki = tmp_path / "pki"
    assert _cli("certs", "init", "--out", str(pki)).returncode == 0
    grpc_port = _free_port()
    flags = (
        *("--tls-cert", str(pki / "coordinator.pem"), "--tls-key", str(pki / "coordinator.key")),
        *("--client-ca", str(pki / "ca.pem"), "--require-client-cert"),
        *("--grpc-port", str(grpc_port)),
    )
    with _serving(tmp_path, *flags) as (_, port, output):
        assert _healthz(f"https://127.0.0.1:{port}/healthz", verify=False).status_code == 200
        budget = subprocess.run(
            [
                *(sys.executable, "-m", "dpfl.cli.main", "budget"),
                *("--coordinator", f"https://127.0.0.1:{grpc_port}", "--ca", str(pki / "ca.pem")),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**_env(), "DPFL_TOKEN": "dpfl-test-token"},
            check=False,
        )
        assert budget.returncode != 0
        assert "gRPC port" in budget.stderr
        time.sleep(0.5)  # let the server side of the refused handshakes finish
    out, err = output
    assert "Handshake failed" not in out + err
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" not in out + err
    assert "a client without such a certificate at the gRPC port" in out
    assert "use the REST port" in out


def test_insecure_serve_warns_and_the_healthcheck_falls_back_to_http(tmp_path: Path) -> None:
    with _serving(tmp_path, "--insecure") as (_, port, output):
        probe = _cli("healthcheck", "--port", str(port))
        assert probe.returncode == 0, probe.stdout
        assert probe.stdout.startswith(f"healthy: http://127.0.0.1:{port}/healthz")
    out, err = output
    assert "Invalid HTTP request" not in out + err  # the probe never sends TLS to plain HTTP
    assert "--insecure: gRPC and REST serve PLAINTEXT" in err
    assert "PLAINTEXT gRPC and HTTP (--insecure)" in out
    closed = _cli("healthcheck", "--port", str(_free_port()), "--timeout", "1")
    assert closed.returncode == 1
    assert "unhealthy" in closed.stdout


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        ((), "no TLS certificate: pass --tls-cert FILE --tls-key FILE"),
        (("--insecure", "--tls-cert", "{cert}", "--tls-key", "{key}"), "--insecure contradicts"),
        (
            ("--tls-cert", "{cert}", "--tls-key", "{key}", "--client-ca", "{ca}"),
            "also set require_client_cert",
        ),
        (
            ("--tls-cert", "{cert}", "--tls-key", "{key}", "--require-client-cert"),
            "require_client_cert (mTLS) needs tls_client_ca_file",
        ),
        (("--tls-cert", "{cert}"), "tls_cert_file and tls_key_file must be given together"),
        (("--tls-cert", "{cert}", "--tls-key", "{other_key}"), "is not the key of"),
        (
            (
                "--tls-cert",
                "{cert}",
                "--tls-key",
                "{key}",
                "--client-ca",
                "{key}",
                "--require-client-cert",
            ),
            "not a PEM certificate bundle",
        ),
    ],
)
def test_serve_refuses_unsafe_or_inconsistent_transport_settings(
    tmp_path: Path, flags: tuple[str, ...], problem: str
) -> None:
    pki = tmp_path / "pki"
    from dpfl.server import tls

    tls.init_pki(pki, hostnames=("localhost",))
    paths = {
        "cert": pki / "coordinator.pem",
        "key": pki / "coordinator.key",
        "ca": pki / "ca.pem",
        "other_key": pki / "ca.key",
    }
    args = [f.format(**paths) for f in flags]
    done = _cli("serve", "--database-url", f"sqlite:///{tmp_path / 'c.db'}", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert problem in done.stderr
    assert not (tmp_path / "c.db").exists()  # refused before opening the database


def test_serve_names_a_busy_rest_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _cli(
            "serve",
            "--insecure",
            "--database-url",
            f"sqlite:///{tmp_path / 'c.db'}",
            "--api-port",
            str(port),
            "--grpc-port",
            "0",
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot bind the REST API to 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than 127.x (None when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.254.254.254", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_serve_host_binds_every_interface_and_the_default_is_loopback(tmp_path: Path) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    with _serving(tmp_path, "--insecure", "--host", "0.0.0.0") as (_, port, output):
        assert _healthz(f"http://{address}:{port}/healthz", verify=False).status_code == 200
    assert "REST on http://0.0.0.0:" in output[0]
    with _serving(tmp_path, "--insecure") as (_, port, _), pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{address}:{port}/healthz", timeout=2)
