"""Disabling, enabling and revoking agents: the store's record, and the running coordinator's
sessions and rounds.

A status change is one store transaction with its audit record
(``Store.set_agent_status``). What makes it take effect at once is the session registry: a
disabled or revoked agent is evicted (:meth:`~dpfl.server.sessions.SessionRegistry.evict`),
which closes its stream, makes every running round count it as gone, and refuses whatever it
still sends. Later rounds never invite it: a job's population is its *active* members.

Two paths lead here. The REST API calls :class:`AgentControl` in the coordinator's process, so
the eviction happens before the response. ``dpfl-coordinator agent ...`` writes the database
from another process; :meth:`AgentControl.watch` notices the change within its polling interval
(one second by default) and evicts then. Either way, the agent cannot authenticate again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dpfl.server.sessions import SessionRegistry
from dpfl.server.store import Agent, AgentStatus, Store

__all__ = ["AgentControl"]


class AgentControl:
    """Changes agents' status and applies it to the live sessions.

    Args:
        store: the coordinator's store.
        registry: the connected agents' sessions (None: an API without a coordinator, where
            only the store changes).
        revoked_serial: tells whether a certificate serial number is on the certificate
            revocation list (``dpfl.server.grpc.crl``); the watch evicts such sessions too.
    """

    def __init__(
        self,
        store: Store,
        registry: SessionRegistry | None = None,
        *,
        revoked_serial: Callable[[int], bool] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.revoked_serial = revoked_serial

    async def set_status(
        self, agent_id: str, status: AgentStatus, *, actor: str, reason: str = ""
    ) -> Agent:
        """Record the change (with its audit record) and apply it to the sessions.

        Raises:
            NotFound, InvalidTransition, InvalidInput: as ``Store.set_agent_status``.
        """
        agent = await asyncio.to_thread(
            self.store.set_agent_status, agent_id, status, actor=actor, reason=reason
        )
        self.apply(agent)
        return agent

    def apply(self, agent: Agent) -> None:
        """Evict an agent that may no longer take part; readmit an active one."""
        if self.registry is None:
            return
        if agent.status == AgentStatus.ACTIVE:
            self.registry.readmit(agent.id)
        elif self.registry.evicted(agent.id) is None:
            self.registry.evict(agent.id, f"the agent was {agent.status.value}")

    async def sync(self) -> None:
        """Apply every agent's stored status, and the revocation list, to the sessions."""
        if self.registry is None:
            return
        # the few agents that are not active (not the whole population, every second), and
        # readmission of the shut-out ones that are active again
        inactive = await asyncio.to_thread(self.store.list_agents, except_status=AgentStatus.ACTIVE)
        for agent in inactive:
            self.apply(agent)
        for agent_id in self.registry.evicted_ids() - {a.id for a in inactive}:
            self.registry.readmit(agent_id)
        if self.revoked_serial is not None:
            for agent_id in self.registry.connected():
                session = self.registry.get(agent_id)
                serial = None if session is None else session.certificate_serial
                if serial is not None and self.revoked_serial(serial):
                    self.registry.evict(agent_id, "its client certificate was revoked")

    async def watch(self, *, interval: float = 1.0) -> None:
        """Follow status changes made in the database by another process (the CLI), and the
        revocation list's file. Runs until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await self.sync()
