"""Ledger entries keep f₁: the fraction of the charged noise's variance that ONE agent's own
share carries in the round (docs/accounting.md#what-the-agent-can-verify).

Additive: a nullable column, NULL for every entry written before (its f₁ is unknown, and the
client's own-share figure with it), range-checked like ``honest_fraction``. SQLite gets the check
inside the column definition (a plain ``ALTER TABLE ... ADD COLUMN``, never a table rebuild);
PostgreSQL adds it as a named table constraint. The downgrade drops both.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "ck_ledger_entries_own_noise_fraction_range"
_RANGE = "own_noise_fraction IS NULL OR (own_noise_fraction > 0 AND own_noise_fraction <= 1)"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE ledger_entries ADD COLUMN own_noise_fraction DOUBLE "
            f"CONSTRAINT {_NAME} CHECK ({_RANGE})"
        )
        return
    op.add_column("ledger_entries", sa.Column("own_noise_fraction", sa.Double(), nullable=True))
    op.create_check_constraint(op.f(_NAME), "ledger_entries", _RANGE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint(op.f(_NAME), "ledger_entries", type_="check")
    with op.batch_alter_table("ledger_entries", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("own_noise_fraction")
