"""``dpfl-coordinator serve``: the coordinator process (gRPC for agents, REST for people).

Every flag is also a ``DPFL_*`` environment variable or a key of the ``--config`` YAML file
(flags win, then the environment, then the file; see :mod:`dpfl.server.settings`). The admin
token comes from ``DPFL_ADMIN_TOKEN`` (or the file), never from a flag, so it does not show in
process listings. ``GET /healthz`` answers 200 once both servers listen. SIGINT/SIGTERM stop it
gracefully: rounds in flight are aborted (a committed round keeps its charge) and running jobs
resume at the next start.

Secure by default: the command refuses to start without a TLS certificate (``--tls-cert`` and
``--tls-key``: TLS on the gRPC port and HTTPS on the REST port) unless ``--insecure`` says
plaintext explicitly, which logs a warning. ``--client-ca`` with ``--require-client-cert`` turns
on mutual TLS for the agents (docs/deploy.md). Exit codes: 0 stopped by a signal, 1 a server
error, 2 settings refused.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dpfl.cmdline import Subparsers, stop_on_signals
from dpfl.server.errors import ConfigurationError, ServerError

if TYPE_CHECKING:  # settings (pydantic-settings) are imported only by the command that runs
    from dpfl.server.data_access import DataAccess
    from dpfl.server.settings import Settings
    from dpfl.server.store import Store

__all__ = [
    "add_data_arguments",
    "add_store_arguments",
    "check_transport_security",
    "describe_transport",
    "register",
    "resolve_data_access",
    "resolve_database_url",
    "run_on_store",
]

log = logging.getLogger("dpfl.coordinator")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the coordinator (gRPC for agents, REST API and dashboard)",
        description="Run the coordinator: the agents' gRPC service and the REST API/dashboard, "
        "on one event loop sharing one database. Settings come from flags, DPFL_* environment "
        "variables (DPFL_ADMIN_TOKEN is required) and an optional YAML file.",
    )
    parser.add_argument("--config", type=Path, help="YAML file of settings")
    parser.add_argument("--database-url", help="SQLAlchemy URL (DPFL_DATABASE_URL)")
    parser.add_argument(
        "--host",
        metavar="ADDR",
        help="listen address of both servers (default 127.0.0.1, this machine only; 0.0.0.0 "
        "for every interface, as in a container); --grpc-host and --api-host win over it",
    )
    parser.add_argument("--grpc-host", help="gRPC listen address (DPFL_GRPC_HOST)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (DPFL_GRPC_PORT)")
    parser.add_argument("--api-host", help="REST listen address (DPFL_API_HOST)")
    parser.add_argument("--api-port", type=int, help="REST port (DPFL_API_PORT)")
    add_data_arguments(parser)
    tls = parser.add_argument_group(
        "TLS", "required unless --insecure; files as written by 'dpfl-coordinator certs init'"
    )
    _file(tls, "--tls-cert", "the coordinator's PEM certificate, for gRPC and HTTPS", "CERT")
    _file(tls, "--tls-key", "its PEM private key", "KEY")
    _file(tls, "--client-ca", "PEM CA bundle that signs agent certificates", "CLIENT_CA")
    tls.add_argument(
        "--require-client-cert",
        action="store_const",
        const=True,
        help="mutual TLS: refuse agents without a certificate from --client-ca, and bind each "
        "agent to its certificate's CN at enrolment (DPFL_REQUIRE_CLIENT_CERT=true)",
    )
    _file(
        tls,
        "--crl",
        "the client CA's certificate revocation list, checked on every gRPC call and re-read "
        "when it changes ('dpfl-coordinator certs revoke')",
        "CRL",
    )
    tls.add_argument(
        "--insecure",
        action="store_true",
        help="serve plaintext gRPC and HTTP without TLS (tests and trusted loopback only; "
        "logs a warning)",
    )
    parser.add_argument("--log-level", default="info", help="logging level (default: info)")
    parser.set_defaults(func=_serve)


def _file(group: argparse._ArgumentGroup, flag: str, help: str, setting: str) -> None:
    """A PEM file option; ``setting``: the end of its ``DPFL_TLS_*_FILE`` variable."""
    group.add_argument(flag, type=Path, metavar="FILE", help=f"{help} (DPFL_TLS_{setting}_FILE)")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` and ``--data-root``: where the coordinator reads data, and the folders under
    which a job may name files of its host (docs/deploy.md#data-on-the-coordinator)."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="where MNIST, Fashion-MNIST and USPS are read from; jobs may also name files "
        "under it (DPFL_DATA_DIR)",
    )
    parser.add_argument(
        "--data-root",
        type=Path,
        action="append",
        metavar="DIR",
        help="a folder under which jobs may name files of this host (npz:PATH, csv:PATH); "
        "repeatable; default: none (DPFL_DATA_ROOTS, folders separated by ':')",
    )


def _config_values(config: Path | None) -> dict[str, object]:
    if config is None:
        return {}
    import yaml

    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read settings file {config}: {exc}") from exc
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def resolve_data_access(
    data_dir: Path | None, data_roots: list[Path] | None, config: Path | None
) -> DataAccess:
    """The data dir and data roots from the flags, ``DPFL_DATA_DIR`` and ``DPFL_DATA_ROOTS``,
    or the config file (in that order, as the coordinator's settings), without needing the rest
    of the settings.

    Raises:
        ConfigurationError: an unreadable or malformed config file or value.
    """
    from dpfl.server.data_access import DataAccess
    from dpfl.server.settings import parse_data_roots

    environment = DataAccess.from_environment()
    file = _config_values(config)
    chosen_dir = data_dir or environment.data_dir
    if chosen_dir is None and isinstance(file.get("data_dir"), str):
        chosen_dir = Path(str(file["data_dir"]))
    roots: tuple[Path, ...] = tuple(data_roots or ()) or environment.roots
    if not roots and "data_roots" in file:
        value = file["data_roots"]
        if isinstance(value, str):
            roots = parse_data_roots(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            roots = tuple(Path(v) for v in value)
        else:
            raise ConfigurationError(
                f"settings file {config}: data_roots must be a list of folders, got {value!r}"
            )
    return DataAccess(data_dir=chosen_dir, roots=roots)


def resolve_database_url(database_url: str | None, config: Path | None) -> str:
    """The database URL from the flag, ``DPFL_DATABASE_URL``, the config file, or the default
    (without needing the rest of the settings, e.g. the admin token).

    Raises:
        ConfigurationError: an unreadable or malformed config file.
    """
    if database_url:
        return database_url
    env = os.environ.get("DPFL_DATABASE_URL")
    if env:
        return env
    file = _config_values(config).get("database_url")
    if file:
        return str(file)
    from dpfl.server.settings import Settings

    return str(Settings.model_fields["database_url"].default)


def add_store_arguments(parser: argparse.ArgumentParser, *, json: bool = True) -> None:
    """``--config`` and ``--database-url`` (:func:`run_on_store`'s), and ``--json``."""
    parser.add_argument("--config", type=Path, default=None, help="YAML file of settings")
    parser.add_argument("--database-url", default=None, help="SQLAlchemy URL (DPFL_DATABASE_URL)")
    if json:
        parser.add_argument("--json", action="store_true", help="print JSON")


def run_on_store(args: argparse.Namespace, action: Callable[[Store], int], command: str) -> int:
    """``action`` on the store of ``--database-url``/``--config``, closed afterwards. A refusal
    is printed after ``command`` and exits 2 (bad input or configuration), else 1."""
    from dpfl.server.store import open_store

    try:
        store = open_store(resolve_database_url(args.database_url, args.config))
    except ServerError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1 if exc.http_status >= 500 and exc.code != "configuration" else 2
    try:
        return action(store)
    except ServerError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2 if exc.http_status < 500 else 1
    finally:
        store.close()


def check_transport_security(settings: Settings, *, insecure: bool) -> None:
    """Refuse to serve plaintext unless asked explicitly, and refuse a contradictory request.

    Raises:
        ConfigurationError: no TLS certificate and no ``--insecure``, or both.
    """
    if settings.tls_enabled and insecure:
        raise ConfigurationError(
            "--insecure contradicts the TLS settings (tls_cert_file is set): choose TLS or "
            "plaintext"
        )
    if not settings.tls_enabled and not insecure:
        raise ConfigurationError(
            "no TLS certificate: pass --tls-cert FILE --tls-key FILE (DPFL_TLS_CERT_FILE, "
            "DPFL_TLS_KEY_FILE; create them with 'dpfl-coordinator certs init'), or --insecure "
            "to serve plaintext (tests and trusted loopback only)"
        )


def _check_tls_files(settings: Settings) -> None:
    """Read and check the certificate, key and client CA before anything else starts, so that a
    bad file is reported by name and no database is touched."""
    from dpfl.server.grpc import server_credentials

    server_credentials(settings)


#: gRPC's core logs each refused TLS handshake (``dpfl budget`` at the gRPC port) as a raw
#: OpenSSL line no Python hook sees: serve keeps its errors only, and its start line says why.
GRPC_VERBOSITY_ENV, GRPC_VERBOSITY = "GRPC_VERBOSITY", "ERROR"


def describe_transport(settings: Settings) -> str:
    """One line on how agents and people reach this coordinator (printed at start)."""
    if settings.mtls_enabled:
        return (
            f"mutual TLS on gRPC (agent certificates signed by {settings.tls_client_ca_file}, "
            "bound to each agent at enrolment), HTTPS on REST; a client without such a "
            "certificate at the gRPC port (dpfl budget, a browser: use the REST port) is refused "
            f"at the TLS handshake, not logged ({GRPC_VERBOSITY_ENV}=INFO shows gRPC's own lines)"
        )
    if settings.tls_enabled:
        return "TLS on gRPC (agents authenticate by credential only), HTTPS on REST"
    return "PLAINTEXT gRPC and HTTP (--insecure)"


def _serve(args: argparse.Namespace) -> int:
    from dpfl.server.settings import load_settings

    os.environ.setdefault(GRPC_VERBOSITY_ENV, GRPC_VERBOSITY)  # read when gRPC's core starts

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        settings = load_settings(
            args.config,
            database_url=args.database_url,
            grpc_host=args.grpc_host or args.host,
            grpc_port=args.grpc_port,
            api_host=args.api_host or args.host,
            api_port=args.api_port,
            tls_cert_file=args.tls_cert,
            tls_key_file=args.tls_key,
            tls_client_ca_file=args.client_ca,
            require_client_cert=args.require_client_cert,
            tls_crl_file=args.crl,
            data_dir=args.data_dir,
            data_roots=tuple(args.data_root) if args.data_root else None,
        )
        check_transport_security(settings, insecure=args.insecure)
        _check_tls_files(settings)
    except ConfigurationError as exc:
        print(f"dpfl-coordinator serve: {exc}", file=sys.stderr)
        return 2
    if args.insecure:
        log.warning(
            "--insecure: gRPC and REST serve PLAINTEXT on %s:%s and %s:%s; agent credentials, "
            "masked updates and the admin token travel unencrypted (tests and trusted loopback "
            "only)",
            settings.grpc_host,
            settings.grpc_port,
            settings.api_host,
            settings.api_port,
        )
    try:
        asyncio.run(_run(settings))
    except ConfigurationError as exc:
        print(f"dpfl-coordinator serve: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"dpfl-coordinator serve: {exc}", file=sys.stderr)
        return 1
    return 0


async def _run(settings: Settings) -> None:
    from dpfl.server.coordinator import Coordinator

    # the handlers go in first: /healthz answers during start(), and a SIGTERM sent as soon as
    # it does must stop the coordinator gracefully, not kill the process
    stop = stop_on_signals()
    coordinator = Coordinator(settings=settings)
    try:
        await coordinator.start()
        print(
            f"dpfl coordinator {coordinator.coordinator_id}: gRPC on {coordinator.grpc_address}, "
            f"REST on {coordinator.api_url} (database {_redact(settings.database_url)}); "
            f"{describe_transport(settings)}",
            flush=True,
        )
        await stop.wait()
    finally:
        await coordinator.close()


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]
