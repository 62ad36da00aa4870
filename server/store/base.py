"""The store: one abstract interface over agents, secrets, jobs, rounds, models and the ledger.

:class:`Store` implements every rule once; a backend (``SqlStore``) supplies only transactions
over :class:`~dpfl.server.store.tx.StoreTx` primitives, so SQLite and PostgreSQL behave alike
(one contract suite runs against both). Every method is one transaction, raises only
:class:`~dpfl.server.errors.StoreError` subclasses on bad input, is thread-safe, and blocks
(asyncio code calls it through a thread).
"""

from __future__ import annotations

from dpfl.server.store.directory import DirectoryMixin
from dpfl.server.store.privacy_audits import PrivacyAuditsMixin
from dpfl.server.store.reports import ReportsMixin
from dpfl.server.store.rounds import RoundsMixin

__all__ = ["Store"]


class Store(DirectoryMixin, RoundsMixin, ReportsMixin, PrivacyAuditsMixin):
    """The abstract store (see the module docstring); open one with
    :func:`dpfl.server.store.open_store`."""
