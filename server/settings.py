"""The coordinator's settings: ``DPFL_*`` environment variables, an optional YAML file, defaults.

Precedence: keyword arguments, environment (nested with ``__``), the YAML file of
:func:`load_settings`, defaults. No instance exists at import time. The settings refuse a weak
admin or metrics token (naming the fix), a TLS certificate without its key, and a client CA
without ``require_client_cert`` (gRPC would silently not ask for client certificates);
see docs/deploy.md#how-the-connections-are-secured. Whether plaintext may serve is decided by
``dpfl-coordinator serve --insecure``.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

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
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from dpfl.server.errors import ConfigurationError

__all__ = [
    "MIN_ADMIN_TOKEN_LENGTH",
    "MIN_TOKEN_BITS",
    "WELL_KNOWN_TOKENS",
    "Settings",
    "StageDeadlines",
    "StreamLimits",
    "check_token_strength",
    "estimated_entropy_bits",
    "load_settings",
    "parse_data_roots",
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
#: Least estimated entropy of a token (see :func:`estimated_entropy_bits`).
MIN_TOKEN_BITS = 128
#: Character classes and their sizes: a token's alphabet is the union of the classes it uses.
_CLASSES = (
    (re.compile(r"[a-z]"), 26),
    (re.compile(r"[A-Z]"), 26),
    (re.compile(r"[0-9]"), 10),
    (re.compile(r"[^a-zA-Z0-9]"), 33),
)
#: Keys next to each other on a QWERTY keyboard follow each other in these strings (rows run on
#: into the next row, as in "qwertyuiopasdf").
_KEYBOARD_ROWS = ("1234567890-=", "qwertyuiopasdfghjklzxcvbnm", "qwertyuiop[]", "asdfghjkl;'")

_GENERATE_HINT = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def _walk_step(a: str, b: str) -> bool:
    """Whether ``b`` follows ``a`` predictably: the same, the next or previous code point
    ("abc", "987"), or a neighbouring key ("qwer", "lkj")."""
    a, b = a.lower(), b.lower()
    if abs(ord(a) - ord(b)) <= 1:
        return True
    for row in _KEYBOARD_ROWS:
        i, j = row.find(a), row.find(b)
        if i >= 0 and j >= 0 and abs(i - j) == 1:
            return True
    return False


def _predictable(token: str, i: int) -> bool:
    """Character ``i`` continues a run, sequence or keyboard walk (its two steps in are both
    predictable), or ends a three-character block already seen earlier in the token."""
    if i < 2:
        return False
    if _walk_step(token[i - 2], token[i - 1]) and _walk_step(token[i - 1], token[i]):
        return True
    return token[i - 2 : i + 1] in token[: i + 1 - 1]


def estimated_entropy_bits(token: str) -> float:
    """An upper estimate of the token's entropy: log2 of its alphabet (the union of the character
    classes it uses: lower case 26, upper case 26, digits 10, others 33) per character, except
    that a character continuing a run, a sequence ("abcd", "1234"), a keyboard walk ("qwerty")
    or a repeated block counts one bit. ``secrets.token_urlsafe(32)`` scores about 250 bits;
    ``abcdefghijklmnop`` 23."""
    alphabet = sum(size for pattern, size in _CLASSES if pattern.search(token))
    if alphabet == 0:
        return 0.0
    per_char = math.log2(alphabet)
    return sum(1.0 if _predictable(token, i) else per_char for i in range(len(token)))


def check_token_strength(token: str, variable: str = "DPFL_ADMIN_TOKEN") -> None:
    """Refuse a bearer token an attacker could guess (the rules of the module docstring).

    Raises:
        ValueError: the reason, with how to generate a good token; never the token itself.
    """
    if not token:
        raise ValueError(f"must not be empty: set {variable}; {_GENERATE_HINT}")
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
    predictable = sum(_predictable(token, i) for i in range(len(token)))
    if 2 * predictable >= len(token):
        raise ValueError(
            f"mostly a sequence, keyboard walk or repetition ({predictable} of {len(token)} "
            f"characters follow from the ones before); {_GENERATE_HINT}"
        )
    bits = estimated_entropy_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise ValueError(
            f"too weak: about {bits:.0f} bits of entropy estimated from its alphabet and length, "
            f"need {MIN_TOKEN_BITS}; {_GENERATE_HINT}"
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
    #: the malicious-secure variant's consistency round (each agent signs the survivor set)
    consistency: float = Field(default=30.0, gt=0)
    unmask: float = Field(default=30.0, gt=0)


class StreamLimits(BaseModel):
    """What the coordinator holds for one agent's ``Connect`` stream at most
    (docs/deploy.md#stream-limits).

    An enrolled agent that stops reading its stream, or floods it, must not be able to grow the
    coordinator's memory: past ``outbound_*`` its stream is closed with ``RESOURCE_EXHAUSTED``,
    past ``inbox_*`` its further messages of a round are refused until the round has read the
    waiting ones. An honest agent has a handful of small messages waiting at most. A single
    message is always accepted into an empty queue, whatever its size (``max_message_bytes``
    bounds it).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    outbound_messages: int = Field(
        default=256,
        ge=1,
        description="Messages waiting to be sent to one agent before its stream is closed.",
    )
    outbound_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="Bytes waiting to be sent to one agent before its stream is closed.",
    )
    inbox_messages: int = Field(
        default=64,
        ge=1,
        description="An agent's messages waiting for a round to read them before more are refused.",
    )
    inbox_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="Bytes of an agent's messages waiting for a round to read them before more "
        "are refused.",
    )


_YAML_DATA: ContextVar[dict[str, object] | None] = ContextVar("dpfl_settings_yaml", default=None)


class _YamlData(PydanticBaseSettingsSource):
    """The values of the YAML file being loaded by :func:`load_settings` (none otherwise)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        data = _YAML_DATA.get() or {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, object]:
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
        description="SQLAlchemy URL of the store; sqlite:// for a throw-away store in memory.",
    )
    grpc_host: str = Field(default="127.0.0.1", min_length=1)
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    api_host: str = Field(default="127.0.0.1", min_length=1)
    api_port: int = Field(default=8080, ge=0, le=65535)
    admin_token: SecretStr = Field(
        default=SecretStr(""), description="Bearer token of the REST API's administrator."
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token that may read GET /metrics and nothing else (for Prometheus); "
        "None: /metrics needs the admin token.",
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
    stream_limits: StreamLimits = StreamLimits()
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
        default=None,
        description="Where MNIST, Fashion-MNIST and USPS files are read from; a job may also "
        "name files under it (npz:PATH, csv:PATH).",
    )
    data_roots: Annotated[tuple[Path, ...], NoDecode] = Field(
        default=(),
        description="The folders under which a job may name files of the coordinator's host "
        "(npz:PATH, csv:PATH); none by default, so only the registered data sets and data_dir "
        "are read (DPFL_DATA_ROOTS: folders separated by ':' or a JSON list).",
    )

    @field_validator("data_roots", mode="before")
    @classmethod
    def _split_data_roots(cls, value: Any) -> Any:
        return parse_data_roots(value) if isinstance(value, str) else value

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
        check_token_strength(value.get_secret_value())
        return value

    @field_validator("metrics_token")
    @classmethod
    def _secure_metrics_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            if not value.get_secret_value():
                return None  # DPFL_METRICS_TOKEN= (empty): no metrics token
            check_token_strength(value.get_secret_value(), "DPFL_METRICS_TOKEN")
        return value

    @field_validator("default_budget_epsilon")
    @classmethod
    def _finite_budget(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be finite (use null for no limit)")
        return value

    @model_validator(mode="after")
    def _distinct_tokens(self) -> Settings:
        if self.metrics_token is not None and hmac.compare_digest(
            self.metrics_token.get_secret_value().encode(),
            self.admin_token.get_secret_value().encode(),
        ):
            raise ValueError(
                "metrics_token must differ from admin_token (it is handed to Prometheus and may "
                "read /metrics only)"
            )
        return self

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


def parse_data_roots(value: str) -> tuple[Path, ...]:
    """``DPFL_DATA_ROOTS``: a JSON list of folders, or folders separated by ``os.pathsep``.

    Raises:
        ValueError: a JSON value that is not a list of strings.
    """
    text = value.strip()
    if text.startswith("["):
        items = json.loads(text)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"data_roots: a JSON list of folders, got {value!r}")
        return tuple(Path(i) for i in items if i.strip())
    return tuple(Path(part) for part in text.split(os.pathsep) if part.strip())


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
def _yaml_values(data: dict[str, object] | None) -> Iterator[None]:
    token = _YAML_DATA.set(data)
    try:
        yield
    finally:
        _YAML_DATA.reset(token)


def _read_yaml(path: Path) -> dict[str, object]:
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
