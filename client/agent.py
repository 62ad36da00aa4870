"""The agent's outer loop: enrol once, then keep one task stream open, reconnecting as needed.

- :func:`ensure_enrolled` returns the credentials stored in the state directory, or redeems the
  enrollment token once and stores what the coordinator answers (``agent.json``, mode 0600).
  Later runs need no token; a directory enrolled with another coordinator address is refused.
- :class:`ConnectionRunner` opens a link with the :class:`~dpfl.client.transport.Connector`, lets
  the :class:`~dpfl.client.task.TaskLoop` serve it until it ends, and reconnects after
  :class:`~dpfl.client.transport.Backoff` (exponential, jittered; reset after a link that carried
  messages or stayed up longer than the longest backoff). A refused credential stops it: no
  amount of retrying fixes a revoked agent.

The same runner serves a real deployment (gRPC) and an in-process simulation (a connector over
the coordinator's handlers); only the connector differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

from dpfl.client.errors import EnrollmentError, TransportError
from dpfl.client.progress import AgentEvent, EventKind, Observer, null_observer
from dpfl.client.state import Credentials, StateDir, now_utc
from dpfl.client.task import TaskLoop
from dpfl.client.transport import (
    Backoff,
    Connector,
    CredentialRejectedError,
    GrpcTransport,
)

__all__ = ["ConnectionRunner", "ensure_enrolled"]


async def ensure_enrolled(
    state: StateDir,
    transport: GrpcTransport,
    *,
    token: str | None,
    name: str,
    agent_version: str = "",
) -> tuple[Credentials, bool]:
    """The agent's credentials, enrolling first when the state directory has none.

    Returns:
        (credentials, whether this call enrolled).

    Raises:
        StateDirError: a corrupt or foreign state directory, or one enrolled with another
            coordinator address.
        EnrollmentError: not enrolled and no token given, or the coordinator refused the token.
        TransportError: the coordinator cannot be reached.
    """
    stored = state.load_credentials()
    if stored is not None:
        state.check_coordinator(stored, transport.address)
        return stored, False
    if not token:
        raise EnrollmentError(
            f"{state.path} holds no enrolment yet: give the one-time token of "
            "'dpfl-coordinator enroll-token' on the first run, with --enrollment-token-file FILE "
            "or $DPFL_ENROLLMENT_TOKEN"
        )
    response = await transport.enroll(token=token, name=name, agent_version=agent_version)
    credentials = Credentials(
        agent_id=response.agent_id,
        credential=response.credential,
        api_token=response.api_token,
        coordinator=transport.address,
        coordinator_id=response.coordinator_id,
        name=name,
        enrolled_at=now_utc(),
    )
    state.save_credentials(credentials)
    return credentials, True


class ConnectionRunner:
    """Keeps one task stream open for a :class:`TaskLoop`; see the module docstring.

    Args:
        connector: opens links to the coordinator.
        loop: the task loop serving each link.
        backoff: delays between attempts.
        observer: receives CONNECTING / CONNECTED / DISCONNECTED events.
        agent_version: announced in ``Hello``.
        rng: jitter source (tests pass a seeded ``random.Random``).
    """

    def __init__(
        self,
        *,
        connector: Connector,
        loop: TaskLoop,
        backoff: Backoff | None = None,
        observer: Observer | None = None,
        agent_version: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self.connector = connector
        self.loop = loop
        self.backoff = backoff if backoff is not None else Backoff()
        self.observer = observer if observer is not None else null_observer
        self.agent_version = agent_version
        self.rng = rng if rng is not None else random.Random()
        #: links opened so far (tests and simulations read it)
        self.connections = 0

    def _emit(self, kind: EventKind, message: str, **data: object) -> None:
        with contextlib.suppress(Exception):
            self.observer(AgentEvent(kind, message=message, data=data))

    async def run(self, *, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (forever without one).

        Raises:
            CredentialRejectedError: the coordinator refused this agent's credential.
        """
        stop = stop if stop is not None else asyncio.Event()
        failures = 0
        while not stop.is_set():
            self._emit(EventKind.CONNECTING, f"attempt {failures + 1}", attempt=failures + 1)
            hello = self.loop.hello(agent_version=self.agent_version)
            try:
                link = await self.connector.connect(hello)
            except CredentialRejectedError:
                raise
            except TransportError as exc:
                delay = self.backoff.delay(failures, self.rng)
                failures += 1
                self._emit(EventKind.DISCONNECTED, f"{exc}; retrying in {delay:.1f} s", retry=delay)
                await _sleep(delay, stop)
                continue
            self.connections += 1
            self._emit(EventKind.CONNECTED, "task stream open")
            opened = time.monotonic()
            try:
                summary = await self.loop.serve(link, stop=stop)
            finally:
                await link.close()
            if stop.is_set():
                return
            healthy = summary.messages > 0 or time.monotonic() - opened >= self.backoff.maximum
            if healthy:
                failures = 0
            delay = self.backoff.delay(failures, self.rng)
            failures += 1
            self._emit(
                EventKind.DISCONNECTED,
                f"stream ended ({summary.reason or 'no reason'}); reconnecting in {delay:.1f} s",
                retry=delay,
            )
            await _sleep(delay, stop)


async def _sleep(seconds: float, stop: asyncio.Event) -> None:
    """Sleep, waking early when ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
