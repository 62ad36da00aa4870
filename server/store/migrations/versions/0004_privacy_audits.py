"""Empirical privacy audits stored with the job they audited (``dpfl audit --database-url``).

Additive: a new table ``privacy_audits`` (one row per audit, foreign key to ``jobs``), so
existing rows are untouched and the downgrade drops only the new table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "privacy_audits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("relation", sa.String(length=16), nullable=False),
        sa.Column("canaries", sa.Integer(), nullable=False),
        sa.Column("guesses", sa.Integer(), nullable=False),
        sa.Column("correct", sa.Integer(), nullable=False),
        sa.Column("confidence", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("epsilon_lower", sa.Double(), nullable=False),
        sa.Column("epsilon_upper", sa.Double(), nullable=False),
        sa.Column("mu_lower", sa.Double(), nullable=False),
        sa.Column("epsilon_lower_gdp", sa.Double(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.CheckConstraint(
            "correct >= 0 AND correct <= guesses AND guesses <= canaries",
            name=op.f("ck_privacy_audits_counts"),
        ),
        sa.CheckConstraint(
            "confidence > 0 AND confidence < 1", name=op.f("ck_privacy_audits_confidence_range")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_privacy_audits_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_privacy_audits")),
    )
    with op.batch_alter_table("privacy_audits", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_privacy_audits_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("privacy_audits", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_privacy_audits_job_id"))
    op.drop_table("privacy_audits")
