"""Revocation and audit: one agent per certificate name, and an audit trail of admin actions.

- ``ix_agents_certificate_cn``, a unique index: a client certificate's common name is bound to at
  most one agent (NULLs, agents enrolled without a certificate, never collide). A database that
  already holds two agents with the same name cannot be upgraded silently: the upgrade stops and
  names them: the administrator decides which agent each silo keeps and clears the other's
  ``certificate_cn`` (that agent can then no longer pass the certificate check under mutual TLS).
- ``audit_records``: who enabled, disabled or revoked which agent, when and why.

The ``revoked`` agent status needs no schema change (``agents.status`` is a string).
``recreate="never"`` as in 0002: no table rebuild under SQLite.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    shared = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT certificate_cn, COUNT(*) FROM agents WHERE certificate_cn IS NOT NULL "
                "GROUP BY certificate_cn HAVING COUNT(*) > 1"
            )
        )
        .all()
    )
    if shared:
        names = ", ".join(f"{cn!r} ({n} agents)" for cn, n in shared)
        raise RuntimeError(
            "cannot bind each certificate name to one agent: several agents share "
            f"{names}; decide which agent each silo keeps, then retry"
        )
    with op.batch_alter_table("agents", schema=None, recreate="never") as batch_op:
        batch_op.create_index("ix_agents_certificate_cn", ["certificate_cn"], unique=True)
    op.create_table(
        "audit_records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_audit_records_agent_id_agents")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_records")),
    )
    with op.batch_alter_table("audit_records", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_records_agent_id"), ["agent_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_records_at"), ["at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audit_records", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_records_at"))
        batch_op.drop_index(batch_op.f("ix_audit_records_agent_id"))
    op.drop_table("audit_records")
    with op.batch_alter_table("agents", schema=None, recreate="never") as batch_op:
        batch_op.drop_index("ix_agents_certificate_cn")
