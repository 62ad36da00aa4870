"""``/api/v1/agents`` and ``/api/v1/audit``: the agents' life cycle, for the administrator only.

Disabling or revoking an agent takes effect before the response: the coordinator closes its
stream and drops it from every round (``dpfl.server.agents_control``). Each change leaves an
audit record naming the caller (``admin`` and the client address the request came from), the
action, the time and the reason given.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dpfl.server.agents_control import AgentControl
from dpfl.server.api.deps import AdminDep, ClientId, StoreDep, app_state
from dpfl.server.api.routes import error_responses
from dpfl.server.store import Agent, AgentStatus
from dpfl.server.store.core import MAX_REASON, text_problem

__all__ = ["AgentPublic", "AuditRecordPublic", "StatusChange", "audit_router", "router"]

router = APIRouter(prefix="/agents", tags=["agents"])
audit_router = APIRouter(prefix="/audit", tags=["agents"])

_AUTH = error_responses(401, 403, 422)
_CHANGE = error_responses(400, 401, 403, 404, 409, 422)


class _Public(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)


class AgentPublic(_Public):
    """An agent's identity and status (no secret)."""

    id: str
    name: str
    status: str = Field(description="active, disabled (may be enabled again) or revoked (final).")
    certificate_cn: str | None = Field(
        description="The client certificate's common name it is bound to (mutual TLS)."
    )
    labels: dict[str, str]
    created_at: datetime
    connected: bool = Field(description="Whether it has an open stream to this coordinator.")


class AuditRecordPublic(_Public):
    id: int
    at: datetime
    actor: str
    action: str = Field(description="agent.enable, agent.disable or agent.revoke.")
    agent_id: str | None
    detail: str


class StatusChange(BaseModel):
    """The body of a status change (optional)."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(
        default="",
        max_length=MAX_REASON,
        description="Why; kept in the audit record. Tabs and line feeds are allowed; other "
        "control characters, format characters (Unicode Cc, Cf: NUL, U+202E ...) and unpaired "
        "surrogates are refused (422).",
    )

    @field_validator("reason")
    @classmethod
    def _storable(cls, value: str) -> str:
        problem = text_problem(value, multiline=True)
        if problem is not None:
            raise ValueError(problem)
        return value


AgentsDep = Annotated[AgentControl, app_state("agents")]


def _public(agent: Agent, control: AgentControl) -> AgentPublic:
    registry = control.registry
    return AgentPublic(
        id=agent.id,
        name=agent.name,
        status=agent.status.value,
        certificate_cn=agent.certificate_cn,
        labels=dict(agent.labels),
        created_at=agent.created_at,
        connected=registry is not None and registry.get(agent.id) is not None,
    )


def _actor(request: Request) -> str:
    host = request.client.host if request.client is not None else "unknown"
    return f"admin (REST from {host})"


@router.get("", response_model=list[AgentPublic], responses=_AUTH)
def list_agents(
    _: AdminDep,
    store: StoreDep,
    control: AgentsDep,
    status: Annotated[AgentStatus | None, Query(description="Only agents in this status.")] = None,
) -> list[AgentPublic]:
    """Every agent, oldest first."""
    return [_public(a, control) for a in store.list_agents(status=status)]


async def _change(
    request: Request,
    control: AgentControl,
    agent_id: str,
    status: AgentStatus,
    body: StatusChange | None,
) -> AgentPublic:
    agent = await control.set_status(
        agent_id, status, actor=_actor(request), reason=body.reason if body else ""
    )
    return _public(agent, control)


@router.post("/{agent_id}/disable", response_model=AgentPublic, responses=_CHANGE)
async def disable_agent(
    agent_id: ClientId,
    request: Request,
    _: AdminDep,
    control: AgentsDep,
    body: StatusChange | None = None,
) -> AgentPublic:
    """Shut the agent out now (its stream closes, its rounds drop it); it may be enabled again."""
    return await _change(request, control, agent_id, AgentStatus.DISABLED, body)


@router.post("/{agent_id}/enable", response_model=AgentPublic, responses=_CHANGE)
async def enable_agent(
    agent_id: ClientId,
    request: Request,
    _: AdminDep,
    control: AgentsDep,
    body: StatusChange | None = None,
) -> AgentPublic:
    """Let a disabled agent authenticate again (409 for a revoked one)."""
    return await _change(request, control, agent_id, AgentStatus.ACTIVE, body)


@router.post("/{agent_id}/revoke", response_model=AgentPublic, responses=_CHANGE)
async def revoke_agent(
    agent_id: ClientId,
    request: Request,
    _: AdminDep,
    control: AgentsDep,
    body: StatusChange | None = None,
) -> AgentPublic:
    """Shut the agent out for good and revoke its secrets; its ledger stays. Revoke its client
    certificate too (``dpfl-coordinator certs revoke``)."""
    return await _change(request, control, agent_id, AgentStatus.REVOKED, body)


_AUDIT = error_responses(401, 403, 404, 422)


@audit_router.get("", response_model=list[AuditRecordPublic], responses=_AUDIT)
async def list_audit(
    _: AdminDep,
    store: StoreDep,
    agent_id: Annotated[
        str | None, Query(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$", description="One agent.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="The newest this many.")] = 200,
) -> list[AuditRecordPublic]:
    """Who enabled, disabled or revoked which agent, when and why (oldest first)."""
    records = await anyio.to_thread.run_sync(
        lambda: store.audit_records(agent_id=agent_id, limit=limit)
    )
    return [AuditRecordPublic.model_validate(r) for r in records]
