"""Empirical privacy auditing: canaries per algorithm family and the one-run audit driver.

:mod:`~dpfl.learning.audit.canaries` (what a canary adds to a round's sum), one small module per
family (:mod:`~dpfl.learning.audit.fedavg`, :mod:`~dpfl.learning.audit.fedsgd`,
:mod:`~dpfl.learning.audit.helmet`, :mod:`~dpfl.learning.audit.voting`), and
:mod:`~dpfl.learning.audit.run` (the simulation and the bound). The conversion from guesses to
ε is :mod:`dpfl.accounting.audit`; docs/audit.md derives the designs.
"""

from dpfl.learning.audit.canaries import CanaryDesign, CanarySet, TooManyCanariesError
from dpfl.learning.audit.run import (
    DEFAULT_CANARIES,
    MODES,
    AuditReport,
    canary_capacity,
    canary_design,
    run_audit,
)

__all__ = [
    "DEFAULT_CANARIES",
    "MODES",
    "AuditReport",
    "CanaryDesign",
    "CanarySet",
    "TooManyCanariesError",
    "canary_capacity",
    "canary_design",
    "run_audit",
]
