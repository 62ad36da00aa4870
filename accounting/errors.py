"""The errors of :mod:`dpfl.accounting`: one base, specific subclasses.

Every problem this package detects is a subclass of :class:`AccountingError`, so callers (the
ledger, the agents' local policy, the CLI) can map the whole family to one status while still
telling the cases apart. Each class's meaning and its HTTP, gRPC and CLI mappings:
docs/accounting.md#errors-and-their-statuses.
"""

from __future__ import annotations

__all__ = [
    "AccountingError",
    "CalibrationError",
    "InvalidEventError",
    "InvalidParameterError",
    "TightPathError",
    "UnsupportedEventError",
]


class AccountingError(Exception):
    """Base of every error raised by :mod:`dpfl.accounting`."""


class InvalidEventError(AccountingError, ValueError):
    """A privacy event or its JSON form is malformed; the message names the field."""


class InvalidParameterError(AccountingError, ValueError):
    """An argument of an accounting computation is out of its domain."""


class UnsupportedEventError(AccountingError):
    """A valid event that the requested accounting path cannot handle; names the subevent."""


class CalibrationError(AccountingError):
    """No noise multiplier in the searched range meets the privacy target."""


class TightPathError(AccountingError):
    """The tight path applies to an event but its computation failed (dp_accounting raised, or a
    Skellam mass was not a number); :func:`dpfl.accounting.compute_epsilon` then reports the RDP
    bound with method ``"rdp_fallback"``."""
