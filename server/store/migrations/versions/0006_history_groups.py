"""A client's ledger entries grouped by (job, relation class, guaranteed event), the state its
privacy figure is composed from (``dpfl.accounting.history``).

Additive: a new table ``history_groups``; the store fills it from the existing entries when it
opens a database whose groups were never built (``ReportsMixin._ensure_histories``), with the
same code as every later commit. The downgrade drops only the new table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28 00:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "history_groups",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("relation", sa.String(length=64), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("entries", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_history_groups_agent_id_agents")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_history_groups_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("agent_id", "job_id", "key", name=op.f("pk_history_groups")),
    )
    with op.batch_alter_table("history_groups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_history_groups_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("history_groups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_history_groups_job_id"))
    op.drop_table("history_groups")
