"""When a task's schedule took effect: `task_definitions.schedule_from_ms`, set when a task is
created and whenever `tasks apply` changes its `schedule`. The scheduler lists the fire times
of a schedule from that moment on, so an edited schedule creates no runs for fire times it
would have had before it was applied.

A nullable column added at the end: MariaDB and MySQL add it in place without copying the
table; definitions stored before have none, and keep their fire times from their cursor.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Skipped when done: on MySQL the DDL commits before the revision is written, so a run
    stopped between the two is picked up by the next."""
    columns = sa.inspect(op.get_bind()).get_columns("task_definitions")
    if "schedule_from_ms" not in {c["name"] for c in columns}:
        op.add_column(
            "task_definitions", sa.Column("schedule_from_ms", sa.BigInteger(), nullable=True)
        )


def downgrade() -> None:
    op.drop_column("task_definitions", "schedule_from_ms")
