"""The coordinator's settings: ``DPFL_*`` environment variables, an optional YAML file, defaults.

Precedence, highest first: keyword arguments (command-line flags), environment variables, the YAML
file given to :func:`load_settings`, the defaults below. Nested values use ``__`` in environment
variables (``DPFL_STAGE_DEADLINES__UNMASK=20``).

Invariants:

- no instance is created at import time; the process builds one (``load_settings``) and passes it
  down, so tests never have to undo global state;
- the settings refuse to exist with an insecure admin token (empty, shorter than 16 characters,
  a well-known word such as ``changeme``, or too few distinct characters), naming the fix;
- the TLS certificate and key are given together or not at all, and must exist;
- mutual TLS is on exactly when ``require_client_cert`` is set, which needs the client CA (and a
  client CA without ``require_client_cert`` is refused: gRPC either requires and verifies client
  certificates or does not ask for any, so a CA alone would silently do nothing).

Whether a coordinator without TLS may serve at all is decided by ``dpfl-coordinator serve``
(``--insecure``), not here: simulations and tests build plaintext loopback coordinators
programmatically.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from dpfl.server.errors import ConfigurationError

__all__ = [
    "MIN_ADMIN_TOKEN_LENGTH",
    "WELL_KNOWN_TOKENS",
    "Settings",
    "StageDeadlines",
    "load_settings",
]

#: Shortest admin token accepted; ``secrets.token_urlsafe(32)`` gives 43 characters.
MIN_ADMIN_TOKEN_LENGTH = 16
#: Words that attackers try first; refused alone or repeated ("adminadminadmin...").
WELL_KNOWN_TOKENS = frozenset(
    {
        "changeme",
        "change-me",
        "change_me",
        "changethis",
        "admin",
        "administrator",
        "secret",
        "token",
        "password",
        "passwd",
        "default",
        "dpfl",
        "test",
        "example",
        "letmein",
        "qwerty",
        "123456",
        "1234567890",
    }
)
#: A token with fewer distinct characters than this is not random (hex of 16 bytes has ~14).
_MIN_DISTINCT_CHARS = 8

_GENERATE_HINT = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def _check_admin_token(token: str) -> None:
    if not token:
        raise ValueError(f"must not be empty: set DPFL_ADMIN_TOKEN; {_GENERATE_HINT}")
    if len(token) < MIN_ADMIN_TOKEN_LENGTH:
        raise ValueError(
            f"too short ({len(token)} characters, need at least "
            f"{MIN_ADMIN_TOKEN_LENGTH}); {_GENERATE_HINT}"
        )
    lowered = token.lower()
    # the token with separators removed, and with digits removed too ("Password_Password_1")
    folds = {re.sub(r"[^a-z0-9]", "", lowered), re.sub(r"[^a-z]", "", lowered)} - {""}
    for word in sorted(WELL_KNOWN_TOKENS):
        plain = re.sub(r"[^a-z0-9]", "", word)
        for folded in folds:
            repeats, rest = divmod(len(folded), len(plain))
            if rest == 0 and folded == plain * repeats:
                raise ValueError(f"a well-known value ({plain!r}); {_GENERATE_HINT}")
    if len(set(token)) < _MIN_DISTINCT_CHARS:
        raise ValueError(
            f"only {len(set(token))} distinct characters and cannot be random; {_GENERATE_HINT}"
        )


class StageDeadlines(BaseModel):
    """Seconds the coordinator waits for each round stage before treating silence as dropout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    invitation: float = Field(default=30.0, gt=0)
    download: float = Field(default=120.0, gt=0)
    training: float = Field(default=600.0, gt=0)
    advertise_keys: float = Field(default=30.0, gt=0)
    share_keys: float = Field(default=30.0, gt=0)
    masked_input: float = Field(default=60.0, gt=0)
    unmask: float = Field(default=30.0, gt=0)


_YAML_DATA: ContextVar[dict[str, Any] | None] = ContextVar("dpfl_settings_yaml", default=None)


class _YamlData(PydanticBaseSettingsSource):
    """The values of the YAML file being loaded by :func:`load_settings` (none otherwise)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        data = _YAML_DATA.get() or {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_YAML_DATA.get() or {})


class Settings(BaseSettings):
    """Everything the coordinator process is configured with.

    Build it with :func:`load_settings` (or ``Settings(...)`` in tests); an insecure admin token is
    a validation error, so a coordinator cannot start with one.
    """

    model_config = SettingsConfigDict(
        env_prefix="DPFL_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    database_url: str = Field(
        default="sqlite:///./dpfl.db",
        min_length=1,
        description="SQLAlchemy URL of the store; memory:// for a throw-away in-process store.",
    )
    grpc_host: str = Field(default="127.0.0.1", min_length=1)
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    api_host: str = Field(default="127.0.0.1", min_length=1)
    api_port: int = Field(default=8080, ge=0, le=65535)
    admin_token: SecretStr = Field(
        default=SecretStr(""), description="Bearer token of the REST API's administrator."
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="PEM certificate (chain) of the coordinator, served on both ports.",
    )
    tls_key_file: Path | None = Field(default=None, description="Its PEM private key.")
    tls_client_ca_file: Path | None = Field(
        default=None,
        description="PEM bundle of the CA(s) that sign agent certificates (mutual TLS, gRPC).",
    )
    require_client_cert: bool = Field(
        default=False,
        description="Mutual TLS on the gRPC port: refuse agents without a certificate signed by "
        "tls_client_ca_file, and bind each agent to its certificate's CN at enrolment.",
    )
    tls_crl_file: Path | None = Field(
        default=None,
        description="PEM certificate revocation list of the client CA ('dpfl-coordinator certs "
        "revoke'); checked on every gRPC call and re-read when it changes (mutual TLS).",
    )
    stage_deadlines: StageDeadlines = StageDeadlines()
    default_budget_epsilon: float | None = Field(
        default=10.0,
        gt=0,
        description="ε budget of a client enrolled with a token that carries none; "
        "None: no limit (not recommended).",
    )
    default_budget_delta: float = Field(default=1e-5, gt=0, lt=1)
    budget_data_dependent: bool = Field(
        default=False,
        description="Enforce budgets on data-dependent ε (PATE/kNN) instead of the guaranteed one.",
    )
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024, le=2**31 - 1)
    enrollment_token_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    data_dir: Path | None = Field(
        default=None, description="Where MNIST, Fashion-MNIST and USPS files are read from."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlData(settings_cls), file_secret_settings)

    @field_validator("admin_token")
    @classmethod
    def _secure_admin_token(cls, value: SecretStr) -> SecretStr:
        _check_admin_token(value.get_secret_value())
        return value

    @field_validator("default_budget_epsilon")
    @classmethod
    def _finite_budget(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be finite (use null for no limit)")
        return value

    @model_validator(mode="after")
    def _tls_consistent(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
        if self.require_client_cert and self.tls_client_ca_file is None:
            raise ValueError(
                "require_client_cert (mTLS) needs tls_client_ca_file, the CA that signs the "
                "agents' certificates (ca.pem of 'dpfl-coordinator certs init')"
            )
        if self.tls_client_ca_file is not None and not self.require_client_cert:
            raise ValueError(
                "tls_client_ca_file is only used to require client certificates: also set "
                "require_client_cert (--require-client-cert, DPFL_REQUIRE_CLIENT_CERT=true), "
                "or drop the client CA"
            )
        if self.tls_crl_file is not None and not self.require_client_cert:
            raise ValueError(
                "tls_crl_file revokes client certificates: it needs mutual TLS "
                "(require_client_cert and tls_client_ca_file)"
            )
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "tls_crl_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file: {path}")
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def mtls_enabled(self) -> bool:
        """Whether the gRPC port requires verified client certificates."""
        return self.tls_enabled and self.require_client_cert


def _format(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "settings"
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown setting"
        lines.append(f"  {where}: {message}")
    return "invalid coordinator settings:\n" + "\n".join(lines)


@contextmanager
def _yaml_values(data: dict[str, Any] | None) -> Iterator[None]:
    token = _YAML_DATA.set(data)
    try:
        yield
    finally:
        _YAML_DATA.reset(token)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read settings file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"settings file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"settings file {path} must hold a mapping of settings, not {type(data).__name__}"
        )
    return {str(k): v for k, v in data.items()}


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the coordinator's settings.

    Args:
        config_file: optional YAML file of settings (same names as the fields, lower case).
        **overrides: values that win over everything (e.g. ``--grpc-port`` flags); ``None``
            values are ignored so that unset flags fall through to the environment.

    Returns:
        The validated, frozen settings.

    Raises:
        ConfigurationError: a missing or malformed file, an unknown setting, a bad value or an
            insecure admin token, with one line per problem naming the setting.
    """
    data = _read_yaml(Path(config_file)) if config_file is not None else None
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        with _yaml_values(data):
            return Settings(**given)
    except ValidationError as exc:
        raise ConfigurationError(_format(exc)) from None
