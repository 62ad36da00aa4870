"""One round of a job, transport-free: the spine the coordinator, the audit and the test harness
all run (docs/architecture.md#the-round-driver).

:func:`run_round` takes a sample through release policy → task → invite → setup → sum (the
ledger committed inside, before the sum is computable) → restoration of the dropouts' noise →
decode → ``finish_round``. The transport is a :class:`Cohort`; the ledger a :class:`Ledger`.
"""

from dpfl.learning.rounds.driver import Cohort, Commit, Ledger, run_round
from dpfl.learning.rounds.state import (
    Acceptance,
    Invitation,
    RoundAborted,
    RoundEnd,
    RoundJob,
    Summation,
    Summed,
    SumSetup,
)

__all__ = [
    "Acceptance",
    "Cohort",
    "Commit",
    "Invitation",
    "Ledger",
    "RoundAborted",
    "RoundEnd",
    "RoundJob",
    "SumSetup",
    "Summation",
    "Summed",
    "run_round",
]
