"""Deterministic fault-injection points of the round engine (tests only).

The engine awaits ``hooks.at(point, context)`` at each point of :data:`POINTS`. The production
coordinator uses :data:`NO_HOOKS`, which does nothing; only code that builds a coordinator by
hand (tests, never the settings or the CLI) can pass other hooks. A test uses them to stop the
world at an exact place, e.g. to crash the coordinator right after the ledger commit and before
any unmask request is sent: its hook blocks at ``"after_ledger_commit"`` and the test cancels
the coordinator, which then writes nothing more to the store (a cancelled round engine never
writes; see :mod:`dpfl.server.orchestrator.round`).
"""

from __future__ import annotations

from typing import Protocol, TypedDict

__all__ = ["NO_HOOKS", "POINTS", "FaultHooks", "NoHooks", "RoundPoint"]


#: Which round attempt reached a point (the ``context`` of :meth:`FaultHooks.at`).
class RoundPoint(TypedDict):
    job_id: str
    round: int
    attempt: int
    round_id: int


#: The named points, in the order a masked round passes them. A round without secure
#: aggregation commits right after ``advertise_keys_closed``: it passes ``after_ledger_commit``
#: before ``masked_input_closed`` (and has no share-keys or unmask stage).
POINTS = (
    "round_started",  # the round's record exists; nothing sent yet
    "invitations_closed",  # the participants are known
    "advertise_keys_closed",
    "share_keys_closed",
    "masked_input_closed",  # masked inputs summed; nothing committed yet (plain: committed)
    "consistency_closed",  # malicious-secure rounds only: the survivor set attested
    "after_ledger_commit",  # the commit is durable; no unmask (plain: no vector) request yet
    "unmask_closed",  # the aggregate is known
    "round_completed",  # the round and its model version are stored
)


class FaultHooks(Protocol):
    """Called by the round engine at every point of :data:`POINTS`."""

    async def at(self, point: str, context: RoundPoint) -> None:
        """``context``: the attempt that reached ``point``."""
        ...


class NoHooks:
    """The production hooks: nothing happens."""

    async def at(self, point: str, context: RoundPoint) -> None:
        del point, context


NO_HOOKS = NoHooks()
