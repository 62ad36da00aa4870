"""A whole agent process, as ``dpfl-agent run`` starts it: the CLI only parses flags into
:class:`AgentOptions` and calls :func:`run_agent`.

Order of work (each step fails fast with a typed :class:`~dpfl.client.errors.AgentError`, before
anything is sent to the coordinator; cheap checks first): build the channel credentials, load the
policy, parse and load ``--data``, pick the device, lock the state directory, enrol (once) or
reuse the stored credential, open the local ledger, then serve until stopped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from dpfl.client.agent import ConnectionRunner, ensure_enrolled
from dpfl.client.data import parse_data_spec
from dpfl.client.errors import AgentError, TransportError
from dpfl.client.gate import LocalGate
from dpfl.client.local_ledger import LocalLedger
from dpfl.client.peer_identity import load_peer_credentials
from dpfl.client.policy import Policy
from dpfl.client.progress import AgentEvent, EventKind, Observer, null_observer
from dpfl.client.state import Credentials, StateDir
from dpfl.client.summation import PeerCredentials
from dpfl.client.task import TaskLoop
from dpfl.client.transport import Backoff, GrpcTransport
from dpfl.cmdline import version
from dpfl.learning.errors import LearningError

__all__ = [
    "TRAINING_THREAD",
    "AgentOptions",
    "DeviceError",
    "TlsError",
    "TrainingExecutor",
    "channel_credentials",
    "run_agent",
]

log = logging.getLogger("dpfl.agent")

_T = TypeVar("_T")
#: The name of the threads of :class:`TrainingExecutor`.
TRAINING_THREAD = "dpfl-train"


class TrainingExecutor(Executor):
    """Runs each local computation in a daemon thread of its own.

    A stopped agent then exits without waiting for a training step still in flight (asyncio's
    default pool, and any ``ThreadPoolExecutor``, is joined at exit: 6–21 s, or as long as a
    round's training lasts). Abandoning it is safe: the computation only returns a vector, the
    round it belongs to is already left, and what must finish (the local ledger's charge) runs on
    asyncio's default pool, which ``asyncio.run`` still waits for.
    """

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=work, name=TRAINING_THREAD, daemon=True).start()
        return future


class TlsError(TransportError):
    """TLS files that are missing, unreadable or incomplete (a --cert without its --key)."""


class DeviceError(AgentError):
    """The requested training device is not available here."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything ``dpfl-agent run`` is told (see ``dpfl-agent run --help``)."""

    coordinator: str
    state_dir: Path
    data: str
    enrollment_token: str | None = None
    policy: Path | None = None
    name: str | None = None
    device: str = "auto"
    insecure: bool = False
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    peer_ca: Path | None = None
    peer_cert: Path | None = None
    data_dir: Path | None = None
    backoff: Backoff = field(default_factory=Backoff)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read {what} {path}: {exc.strerror}") from None


def channel_credentials(
    *, ca: Path | None, cert: Path | None, key: Path | None, insecure: bool
) -> grpc.ChannelCredentials | None:
    """TLS (``--ca``) or mutual TLS (``--ca --cert --key``) credentials; None for plaintext.

    Raises:
        TlsError: neither TLS nor ``--insecure``, both, a ``--cert`` without ``--key`` (or the
            reverse), a client certificate without ``--ca``, or an unreadable file.
    """
    if (cert is None) != (key is None):
        raise TlsError("--cert and --key go together (the agent's certificate and its key)")
    if ca is None:
        if cert is not None:
            raise TlsError("--cert/--key need --ca (the CA that signed the coordinator)")
        if not insecure:
            raise TlsError(
                "no TLS configured: pass --ca FILE (the federation's CA certificate), or "
                "--insecure to allow plaintext (tests and loopback only)"
            )
        return None
    if insecure:
        raise TlsError("--insecure contradicts --ca: choose TLS or plaintext")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "CA certificate"),
        private_key=_read(key, "private key") if key is not None else None,
        certificate_chain=_read(cert, "certificate") if cert is not None else None,
    )


def _device(choice: str) -> str:
    if choice == "cpu":  # no need to load torch to know that
        return "cpu"
    from dpfl.learning.device import select_device

    try:
        return str(select_device(None if choice == "auto" else choice))
    except LearningError as exc:
        raise DeviceError(str(exc)) from None


def _peer_note(peer: PeerCredentials | None) -> str:
    if peer is None:
        return "no peer identity (malicious-secure rounds refused)"
    fingerprint = peer.authority.fingerprint.hex()[:16]
    return f"peer {peer.signer.identity.name!r} of federation CA {fingerprint}"


async def run_agent(
    options: AgentOptions,
    *,
    stop: asyncio.Event | None = None,
    observer: Observer | None = None,
) -> None:
    """Run an agent until ``stop`` is set.

    Raises:
        AgentError: any of the failures listed in the module docstring (``exit_code`` set),
            or :class:`~dpfl.client.transport.CredentialRejectedError` when the coordinator
            refuses the stored credential.
    """
    observe = observer if observer is not None else null_observer
    credentials = channel_credentials(
        ca=options.ca, cert=options.cert, key=options.key, insecure=options.insecure
    )
    policy = Policy.load(options.policy)
    peer = load_peer_credentials(
        peer_ca=options.peer_ca, peer_cert=options.peer_cert, key=options.key
    )
    source = parse_data_spec(options.data)
    data = source.load(data_dir=options.data_dir, given_as="--data-dir")
    device = _device(options.device)
    if credentials is None:
        log.warning(
            "plaintext connection to %s (--insecure): the credential and the masked updates "
            "travel unencrypted",
            options.coordinator,
        )
    state = StateDir(options.state_dir)
    with state.lock():
        async with GrpcTransport(
            options.coordinator, credentials=credentials, insecure=options.insecure
        ) as transport:
            creds, enrolled = await ensure_enrolled(
                state,
                transport,
                token=options.enrollment_token,
                name=options.name or socket.gethostname(),
                agent_version=version(),
            )
            message = (
                f"{'enrolled' if enrolled else 'enrolment reused'}: agent {creds.agent_id} "
                f"({creds.name}) at {creds.coordinator}; data {source}, {len(data.y)} records; "
                f"device {device}; {_peer_note(peer)}"
            )
            observe(AgentEvent(EventKind.ENROLLED, message=message))
            with LocalLedger.open(state.path) as ledger:
                gate = LocalGate(policy=policy, ledger=ledger, coordinator_id=creds.coordinator_id)
                loop = TaskLoop(
                    agent_id=creds.agent_id,
                    data=data,
                    gate=gate,
                    device=device,
                    observer=observe,
                    executor=TrainingExecutor(),
                    peer=peer,
                )
                await _runner(transport, creds, loop, options.backoff, observe).run(stop=stop)


def _runner(
    transport: GrpcTransport,
    creds: Credentials,
    loop: TaskLoop,
    backoff: Backoff,
    observe: Observer,
) -> ConnectionRunner:
    """The connection that carries ``loop``'s tasks, reconnecting with ``backoff``."""
    return ConnectionRunner(
        connector=transport.connector(agent_id=creds.agent_id, credential=creds.credential),
        loop=loop,
        backoff=backoff,
        observer=observe,
        agent_version=version(),
    )
