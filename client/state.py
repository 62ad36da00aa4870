"""The agent's state directory: its identity and credential, kept across restarts.

Layout: docs/agent.md#the-state-directory. ``agent.json`` is written atomically and never silently
replaced: a corrupt, incomplete, foreign or world-readable file is a :class:`StateDirError`
naming the file, since the credential cannot be recovered and the ledger beside it must stay tied
to the silo's data. One process at a time holds a directory (:meth:`StateDir.lock`), since two
agents sharing a ledger would spend budget the other does not see. Secrets never appear in
``repr`` or error messages.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dpfl.client.errors import StateDirError
from dpfl.client.local_ledger import LEDGER_FILENAME

__all__ = ["CREDENTIALS_FILE", "Credentials", "StateDir"]

CREDENTIALS_FILE = "agent.json"
LOCK_FILE = ".lock"
_FORMAT = "dpfl-agent-state"
_VERSION = 1
#: Files that may exist in a directory without agent.json: the lock of a failed first enrolment,
#: and the ledger of an agent that re-enrols (SQLite adds its journal files beside it).
_PRE_ENROLMENT = frozenset(
    {LOCK_FILE, *(LEDGER_FILENAME + suffix for suffix in ("", "-journal", "-wal", "-shm"))}
)
_STRING_FIELDS = ("agent_id", "credential", "api_token", "coordinator", "coordinator_id", "name")


@dataclass(frozen=True, slots=True)
class Credentials:
    """What enrolment gave this agent, and where.

    Attributes:
        agent_id: the coordinator's id for this agent (metadata ``x-dpfl-agent-id``).
        credential: the secret bearer credential (metadata ``authorization: Bearer ...``).
        api_token: the read-only REST token for this client's own budget.
        coordinator: the address the agent enrolled with (``HOST:PORT``).
        coordinator_id: the coordinator's own id, as returned by ``Enroll``.
        name: the silo's human-readable name.
        enrolled_at: when, in UTC ISO 8601.
    """

    agent_id: str
    credential: str = field(repr=False)
    api_token: str = field(repr=False)
    coordinator: str
    coordinator_id: str
    name: str
    enrolled_at: str

    def __post_init__(self) -> None:
        if not self.agent_id:
            raise StateDirError("an agent id must not be empty")
        if not self.credential:
            raise StateDirError("a credential must not be empty")

    def to_json(self) -> dict[str, Any]:
        return {"format": _FORMAT, "version": _VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any, *, source: str) -> Credentials:
        """Parse the stored form; ``source`` names the file in errors.

        Raises:
            StateDirError: not this format, an unknown version, or a missing or mistyped field.
        """
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise StateDirError(f"{source} is not a dpfl agent state file")
        if data.get("version") != _VERSION:
            raise StateDirError(
                f"{source} has state version {data.get('version')!r}; this agent reads "
                f"version {_VERSION} (a newer dpfl wrote it?)"
            )
        for name in (*_STRING_FIELDS, "enrolled_at"):
            if not isinstance(data.get(name), str):
                raise StateDirError(f"{source}: field {name!r} is missing or not a string")
        try:
            return cls(**{f.name: data[f.name] for f in fields(cls)})
        except StateDirError as exc:
            raise StateDirError(f"{source}: {exc}") from None


def now_utc() -> str:
    """The current time as the state file stores it."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class StateDir:
    """An agent's state directory (see the module docstring).

    Args:
        path: the directory; created (mode 0700, parents too) when missing.
        create: False to refuse a missing directory instead (read-only uses such as ``status``).

    Raises:
        StateDirError: the path exists and is not a directory, is missing (``create=False``), or
            cannot be created.
    """

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        self.path = Path(path).expanduser()
        if self.path.exists() and not self.path.is_dir():
            raise StateDirError(f"state directory {self.path} exists and is not a directory")
        if not create and not self.path.is_dir():
            raise StateDirError(f"state directory {self.path} does not exist")
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"cannot create state directory {self.path}: {exc}") from None

    def __repr__(self) -> str:
        return f"StateDir({str(self.path)!r})"

    @property
    def credentials_path(self) -> Path:
        return self.path / CREDENTIALS_FILE

    # -- credentials -------------------------------------------------------------------------

    def load_credentials(self) -> Credentials | None:
        """The stored credentials, or None when this directory was never enrolled.

        Raises:
            StateDirError: a corrupt or unsafe ``agent.json``, or a foreign directory (other
                files but no ``agent.json``).
        """
        path = self.credentials_path
        if not path.exists():
            others = sorted(
                p.name
                for p in self.path.iterdir()
                if p.name not in _PRE_ENROLMENT and not p.name.startswith(f".{CREDENTIALS_FILE}.")
            )
            if others:
                shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
                raise StateDirError(
                    f"{self.path} is not a dpfl agent state directory: it holds {shown} but no "
                    f"{CREDENTIALS_FILE}; point --state-dir at a new or empty directory"
                )
            return None
        try:
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):
                raise StateDirError(f"{path} is not a regular file")
            if mode & 0o077:
                raise StateDirError(
                    f"{path} is accessible by other users (mode {stat.S_IMODE(mode):04o}); it "
                    f"holds this agent's credential: run 'chmod 600 {path}' if that was not "
                    "intended by anyone else"
                )
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise StateDirError(f"cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise StateDirError(f"{path} is corrupt: not UTF-8 text") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise StateDirError(f"{path} is corrupt: not valid JSON ({exc})") from None
        return Credentials.from_json(data, source=str(path))

    def save_credentials(self, credentials: Credentials) -> None:
        """Write ``agent.json`` atomically with mode 0600.

        Raises:
            StateDirError: the file cannot be written.
        """
        payload = json.dumps(credentials.to_json(), indent=2, sort_keys=True) + "\n"
        write_private_atomic(self.credentials_path, payload.encode("utf-8"))

    def check_coordinator(self, credentials: Credentials, address: str) -> None:
        """Refuse to use credentials enrolled with another coordinator address.

        Raises:
            StateDirError: the stored address differs from ``address``.
        """
        if credentials.coordinator != address:
            raise StateDirError(
                f"{self.credentials_path} was enrolled with coordinator "
                f"{credentials.coordinator!r} (id {credentials.coordinator_id!r}), not "
                f"{address!r}; use that address or another --state-dir"
            )

    # -- exclusive use -----------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the directory's exclusive lock for the duration of the block.

        Raises:
            StateDirError: another process holds it.
        """
        path = self.path / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateDirError(f"cannot open {path}: {exc.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StateDirError(
                    f"{self.path} is in use by another dpfl-agent process (lock {path})"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def write_private_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically, readable by the owner only (0600).

    Raises:
        StateDirError: the write fails (the old file, if any, is left intact).
    """
    directory = path.parent
    tmp_name = ""
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
        tmp_name = ""
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise StateDirError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        if tmp_name:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
