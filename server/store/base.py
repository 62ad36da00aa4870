"""The store: one abstract interface over agents, secrets, jobs, rounds, models and the ledger.

:class:`Store` implements every rule once; the backend (``SqlStore``) supplies only transactions
over :class:`~dpfl.server.store.tx.StoreTx` primitives, so every database behaves identically
(one contract suite, ``tests/integration/test_store_contract.py``, runs against SQLite and
PostgreSQL).

The methods, by caller:

- enrolment and authentication (gRPC): :meth:`~DirectoryMixin.redeem_enrollment_token`,
  :meth:`~DirectoryMixin.authenticate_agent`, :meth:`~DirectoryMixin.authenticate_api_token`;
- orchestration: :meth:`~RoundsMixin.start_round`, :meth:`~RoundsMixin.update_round`,
  :meth:`~RoundsMixin.record_stage`, :meth:`~ReportsMixin.check_budgets` (before invitation),
  :meth:`~RoundsMixin.commit_round` (before unmasking), :meth:`~RoundsMixin.complete_round`,
  :meth:`~RoundsMixin.abort_round`, :meth:`~RoundsMixin.abort_interrupted_rounds` (start-up);
- REST and CLI: :meth:`~ReportsMixin.client_budget`, :meth:`~ReportsMixin.list_client_budgets`,
  :meth:`~ReportsMixin.job_epsilons`, :meth:`~RoundsMixin.list_rounds`,
  :meth:`~DirectoryMixin.list_model_versions`, :meth:`~ReportsMixin.verify_ledger`;
- privacy audits (``dpfl audit``, REST): :meth:`~PrivacyAuditsMixin.add_privacy_audit`,
  :meth:`~PrivacyAuditsMixin.list_privacy_audits`.

Every method runs in its own transaction and raises only :class:`~dpfl.server.errors.StoreError`
subclasses on bad input or state. Methods are thread-safe (one store is shared by the gRPC and
REST sides of the coordinator); they block, so asyncio code calls them through a thread.
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
