"""Round records carry their version: every JSON object in ``rounds.noise`` gains
``"version": 1`` (``dpfl.server.store.round_setup``), no key renamed; the downgrade removes it.
A stored value that is not an object is left as it is (reading it is refused, naming the round).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 22:00:00.000000
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 1

_ROUNDS = sa.table("rounds", sa.column("id", sa.Integer()), sa.column("noise", sa.JSON()))


def _rewrite(change: Callable[[dict[str, object]], dict[str, object] | None]) -> None:
    """``change`` every stored object (None: as it is), a row at a time (records hold blobs)."""
    conn = op.get_bind()
    ids = conn.execute(sa.select(_ROUNDS.c.id).order_by(_ROUNDS.c.id)).scalars().all()
    for round_id in ids:
        stored = conn.execute(
            sa.select(_ROUNDS.c.noise).where(_ROUNDS.c.id == round_id)
        ).scalar_one()
        if not isinstance(stored, dict):
            continue
        changed = change(stored)
        if changed is not None:
            conn.execute(sa.update(_ROUNDS).where(_ROUNDS.c.id == round_id).values(noise=changed))


def _with_version(record: dict[str, object]) -> dict[str, object] | None:
    return None if "version" in record else {**record, "version": VERSION}


def _without_version(record: dict[str, object]) -> dict[str, object] | None:
    if record.get("version") != VERSION:
        return None
    return {k: v for k, v in record.items() if k != "version"}


def upgrade() -> None:
    _rewrite(_with_version)


def downgrade() -> None:
    _rewrite(_without_version)
