"""Round orchestration: the job runners, the round engine and the fault-injection points.

- :class:`Orchestrator` -- one runner task per running job; the ``JobControl`` of the REST API;
- :class:`RoundEngine` -- one round, exactly the sequence of docs/architecture.md ("A round over
  the wire"), with the ledger committed between the masked-input stage and unmasking;
- :mod:`.sampling` -- which clients an attempt invites (one draw per round, kept across its
  uncommitted attempts) and how a small sample is released;
- :mod:`.hooks` -- named points where tests stop or crash the coordinator (inactive otherwise).
"""

from dpfl.server.orchestrator.core import Orchestrator
from dpfl.server.orchestrator.hooks import NO_HOOKS, POINTS, FaultHooks, NoHooks
from dpfl.server.orchestrator.round import RoundEngine, RoundReport
from dpfl.server.orchestrator.runner import JobRunner

__all__ = [
    "NO_HOOKS",
    "POINTS",
    "FaultHooks",
    "JobRunner",
    "NoHooks",
    "Orchestrator",
    "RoundEngine",
    "RoundReport",
]
