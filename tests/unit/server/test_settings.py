"""Coordinator settings: precedence, nested environment variables, refusal of insecure tokens."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest

from dpfl.server.errors import ConfigurationError
from dpfl.server.settings import (
    MIN_TOKEN_BITS,
    Settings,
    estimated_entropy_bits,
    load_settings,
)

GOOD = secrets.token_urlsafe(32)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("DPFL_") and name not in ("DPFL_TEST_POSTGRES_URL", "DPFL_DATA_DIR"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("DPFL_DATA_DIR", raising=False)


def test_defaults_with_a_good_token() -> None:
    s = load_settings(admin_token=GOOD)
    assert s.database_url == "sqlite:///./dpfl.db"
    assert (s.grpc_port, s.api_port) == (50051, 8080)
    assert s.admin_token.get_secret_value() == GOOD
    assert GOOD not in repr(s)  # secrets never end up in logs
    assert s.default_budget_epsilon == 10.0
    assert s.default_budget_delta == 1e-5
    assert not s.tls_enabled
    assert s.budget_data_dependent is False


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("", "must not be empty"),
        ("changeme", "too short"),
        ("changemechangeme", "well-known value ('changeme')"),
        ("ADMIN-ADMIN-ADMIN-ADMIN", "well-known value ('admin')"),
        ("secretsecretsecret", "well-known value ('secret')"),
        ("tokentokentokentoken", "well-known value ('token')"),
        ("Password_Password_1", "well-known value ('password')"),
        ("aaaaaaaaaaaaaaaaaaaaaaaa", "distinct characters"),
        ("a1b2c3d4e5", "too short"),
        ("abcdefghijklmnop", "sequence, keyboard walk"),
        ("1234567890123456", "sequence, keyboard walk"),
        ("qwertyuiopasdfgh", "sequence, keyboard walk"),
        ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", "keyboard walk"),
        ("poiuytrewqlkjhgfdsamnbvcxz", "keyboard walk"),
        ("Kq7mZp2xWv9r", "too short"),
        ("kq7mzp2xwv9rtb4ny", "bits of entropy"),  # 17 random lower/digits: ~88 bits
        ("k7Mq2Zp9Xw4Rv8Tb3Ny6", "bits of entropy"),  # 20 mixed: ~119 bits
    ],
)
def test_insecure_admin_tokens_are_refused(token: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match="admin_token") as info:
        load_settings(admin_token=token)
    assert problem in str(info.value)
    if token:
        assert token not in str(info.value).replace(problem, "")  # the refused token is not echoed


@pytest.mark.parametrize(
    "make",
    [
        lambda: secrets.token_urlsafe(32),
        lambda: secrets.token_hex(32),
        lambda: secrets.token_hex(24),
    ],
)
def test_generated_tokens_are_accepted(make: Callable[[], str]) -> None:
    for _ in range(200):
        token = make()
        assert estimated_entropy_bits(token) >= MIN_TOKEN_BITS
        load_settings(admin_token=token)


def test_entropy_estimate_counts_the_alphabet_and_discounts_walks() -> None:
    assert estimated_entropy_bits("k7Mq2Zp9") == pytest.approx(8 * math.log2(62))
    assert estimated_entropy_bits("kq7mzp2x") == pytest.approx(8 * math.log2(36))
    assert estimated_entropy_bits("abcdefgh") == pytest.approx(2 * math.log2(26) + 6)


def test_unset_admin_token_is_refused_with_the_variable_name() -> None:
    with pytest.raises(ConfigurationError, match="DPFL_ADMIN_TOKEN"):
        load_settings()


def test_environment_and_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPFL_ADMIN_TOKEN", GOOD)
    monkeypatch.setenv("DPFL_DATABASE_URL", "postgresql+psycopg://db/dpfl")
    monkeypatch.setenv("DPFL_GRPC_PORT", "6000")
    monkeypatch.setenv("DPFL_STAGE_DEADLINES__UNMASK", "5.5")
    monkeypatch.setenv("DPFL_DATA_DIR", "/data")
    s = load_settings()
    assert s.database_url == "postgresql+psycopg://db/dpfl"
    assert s.grpc_port == 6000
    assert s.stage_deadlines.unmask == 5.5
    assert s.stage_deadlines.share_keys == 30.0
    assert s.data_dir == Path("/data")


def test_precedence_flags_over_env_over_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "coordinator.yaml"
    config.write_text(
        f"admin_token: {GOOD}\napi_port: 7000\ngrpc_port: 7001\ndatabase_url: sqlite:///x.db\n"
        "stage_deadlines: {masked_input: 9}\n"
    )
    monkeypatch.setenv("DPFL_GRPC_PORT", "7100")
    s = load_settings(config, database_url="sqlite:///flag.db", api_port=None)
    assert s.database_url == "sqlite:///flag.db"  # flag
    assert s.grpc_port == 7100  # environment over file
    assert s.api_port == 7000  # file over default; a None flag falls through
    assert s.stage_deadlines.masked_input == 9


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("grpc_port: [1\n", "not valid YAML"),
        ("- 1\n", "must hold a mapping"),
        ("grcp_port: 1\n", "grcp_port: unknown setting"),
        ("grpc_port: 70000\n", "grpc_port: Input should be less than or equal to 65535"),
        ("default_budget_delta: 1.5\n", "default_budget_delta"),
        ("default_budget_epsilon: -1\n", "default_budget_epsilon"),
        ("stage_deadlines: {unmask: 0}\n", "stage_deadlines.unmask"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, content: str, problem: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(content)
    with pytest.raises(ConfigurationError) as info:
        load_settings(config, admin_token=GOOD)
    assert problem in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read settings file"):
        load_settings(tmp_path / "nope.yaml", admin_token=GOOD)


def test_tls_paths_come_in_pairs_and_must_exist(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    with pytest.raises(ConfigurationError, match="given together"):
        load_settings(admin_token=GOOD, tls_cert_file=cert)
    with pytest.raises(ConfigurationError, match="no such file"):
        load_settings(admin_token=GOOD, tls_cert_file=cert, tls_key_file=key)
    cert.write_text("x")
    key.write_text("y")
    s = load_settings(admin_token=GOOD, tls_cert_file=cert, tls_key_file=key)
    assert s.tls_enabled
    with pytest.raises(ConfigurationError, match="mTLS"):
        load_settings(admin_token=GOOD, tls_client_ca_file=cert)


def test_mutual_tls_needs_the_client_ca_and_the_explicit_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key, ca = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem"
    for path in (cert, key, ca):
        path.write_text("x")
    pair = {"admin_token": GOOD, "tls_cert_file": cert, "tls_key_file": key}
    assert not load_settings(**pair).mtls_enabled
    with pytest.raises(ConfigurationError, match="also set require_client_cert"):
        load_settings(**pair, tls_client_ca_file=ca)  # a CA alone would silently do nothing
    with pytest.raises(ConfigurationError, match="needs tls_client_ca_file"):
        load_settings(**pair, require_client_cert=True)
    monkeypatch.setenv("DPFL_TLS_CLIENT_CA_FILE", str(ca))
    monkeypatch.setenv("DPFL_REQUIRE_CLIENT_CERT", "true")
    settings = load_settings(**pair)
    assert settings.mtls_enabled
    assert settings.tls_client_ca_file == ca


def test_settings_are_frozen_and_no_instance_exists_at_import() -> None:
    import dpfl.server.settings as module

    assert not any(isinstance(v, Settings) for v in vars(module).values())
    s = Settings(admin_token=GOOD)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="frozen"):
        s.grpc_port = 1  # type: ignore[misc]


def test_the_metrics_token_is_optional_strong_and_not_the_admin_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(admin_token=GOOD).metrics_token is None
    monkeypatch.setenv("DPFL_METRICS_TOKEN", "")
    assert load_settings(admin_token=GOOD).metrics_token is None
    other = secrets.token_urlsafe(32)
    monkeypatch.setenv("DPFL_METRICS_TOKEN", other)
    s = load_settings(admin_token=GOOD)
    assert s.metrics_token is not None
    assert s.metrics_token.get_secret_value() == other
    assert other not in repr(s)
    monkeypatch.setenv("DPFL_METRICS_TOKEN", "qwertyuiopasdfgh")
    with pytest.raises(ConfigurationError, match=r"metrics_token: .*keyboard walk"):
        load_settings(admin_token=GOOD)
    monkeypatch.setenv("DPFL_METRICS_TOKEN", GOOD)
    with pytest.raises(ConfigurationError, match="must differ from admin_token"):
        load_settings(admin_token=GOOD)
