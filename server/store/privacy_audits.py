"""Empirical privacy audits stored with the job whose run they audited (``dpfl audit``).

An audit is evidence beside the ledger, never a charge: it is recorded after the job's rounds
were charged, is never added to a total or compared with a budget, and leaves the ledger as it
is. The figures are checked here (a bound that is not a finite, non-negative number, counts out
of order) so that the REST API and the dashboard never show a malformed audit.
"""

from __future__ import annotations

import math
from dataclasses import replace

from dpfl.server.errors import InvalidInput
from dpfl.server.store.core import StoreCore, check_count, check_json_object, check_number
from dpfl.server.store.records import PrivacyAudit, PrivacyAuditFigures

__all__ = ["AUDIT_MODES", "AUDIT_RELATIONS", "AUDIT_UNITS", "PrivacyAuditsMixin"]

AUDIT_MODES = ("white-box", "black-box")
AUDIT_UNITS = ("record", "agent")
AUDIT_RELATIONS = ("add-remove", "replace-one")


def _check_figures(figures: PrivacyAuditFigures) -> PrivacyAuditFigures:
    if not isinstance(figures, PrivacyAuditFigures):
        raise InvalidInput(f"an audit must be PrivacyAuditFigures, got {type(figures).__name__}")
    for name, allowed in (
        ("mode", AUDIT_MODES),
        ("unit", AUDIT_UNITS),
        ("relation", AUDIT_RELATIONS),
    ):
        value = getattr(figures, name)
        if value not in allowed:
            raise InvalidInput(f"audit {name} must be one of {', '.join(allowed)}, got {value!r}")
    canaries = check_count(figures.canaries, "audit canaries", minimum=2)
    guesses = check_count(figures.guesses, "audit guesses", minimum=1)
    correct = check_count(figures.correct, "audit correct guesses")
    if not correct <= guesses <= canaries:
        raise InvalidInput(
            f"audit counts must satisfy correct ≤ guesses ≤ canaries, got {correct}, "
            f"{guesses}, {canaries}"
        )
    confidence = check_number(figures.confidence, "audit confidence")
    delta = check_number(figures.delta, "audit delta")
    for name, value in (("confidence", confidence), ("delta", delta)):
        if not 0.0 < value < 1.0:
            raise InvalidInput(f"audit {name} must lie in (0, 1), got {value!r}")
    upper = figures.epsilon_upper
    if isinstance(upper, bool) or not isinstance(upper, int | float) or not upper >= 0:
        raise InvalidInput(f"audit epsilon_upper must be a number >= 0 (may be inf), got {upper!r}")
    return replace(
        figures,
        canaries=canaries,
        guesses=guesses,
        correct=correct,
        confidence=confidence,
        delta=delta,
        epsilon_lower=check_number(figures.epsilon_lower, "audit epsilon_lower", minimum=0.0),
        epsilon_upper=float(upper) if math.isfinite(upper) else math.inf,
        mu_lower=check_number(figures.mu_lower, "audit mu_lower", minimum=0.0),
        epsilon_lower_gdp=check_number(
            figures.epsilon_lower_gdp, "audit epsilon_lower_gdp", minimum=0.0
        ),
        details=check_json_object(figures.details, "audit details"),
    )


class PrivacyAuditsMixin(StoreCore):
    def add_privacy_audit(self, job_id: str, figures: PrivacyAuditFigures) -> PrivacyAudit:
        """Record an audit of a job's run (after its rounds were charged).

        Raises:
            NotFound: no such job.
            InvalidInput: a malformed figure (see the module docstring).
        """
        checked = _check_figures(figures)
        with self._transaction(write=True) as tx:
            self._job_of(tx, job_id)
            return tx.insert_privacy_audit(job_id, checked, self._now())

    def list_privacy_audits(self, job_id: str) -> list[PrivacyAudit]:
        """The job's audits, oldest first. Raises: NotFound."""
        with self._transaction(write=False) as tx:
            self._job_of(tx, job_id)
            return tx.privacy_audits_of_job(job_id)
