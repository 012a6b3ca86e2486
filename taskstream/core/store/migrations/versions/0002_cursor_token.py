"""Fence the scheduler cursor: `task_definitions.cursor_token` holds the leader-lease token of
the last cursor write; a write with an older token is rejected.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Skipped when done: on MySQL the DDL commits before the revision is written, so a run
    stopped between the two is picked up by the next."""
    columns = sa.inspect(op.get_bind()).get_columns("task_definitions")
    if "cursor_token" not in {c["name"] for c in columns}:
        op.add_column("task_definitions", sa.Column("cursor_token", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("task_definitions", "cursor_token")
