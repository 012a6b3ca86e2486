"""Index settling instead of every status: `task_instances.settled`, generated from `status`
(NULL while in flight, the status once settled), and the index `(settled,
next_attempt_at_ms)` in place of `(status, next_attempt_at_ms)`.

Claims and the outbox's dispatch then change no secondary index, and a run changes one when
it settles, instead of one at every move. On MySQL/MariaDB and PostgreSQL the column is STORED
and adding it rewrites `task_instances`; SQLite's ALTER TABLE can add only a VIRTUAL one (a
rebuilt table would cascade-delete the history), with the same values and index.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out, not imported: a migration keeps the schema of its revision.
SETTLED_SQL = "CASE WHEN status IN ('FAILED', 'SKIPPED', 'SUCCESS') THEN status END"


def upgrade() -> None:
    """Each step is skipped when done: on MySQL each DDL statement commits, so a run that
    failed halfway (a lock wait timed out, a lost connection) is picked up where it stopped."""
    bind = op.get_bind()
    stored = bind.dialect.name != "sqlite"
    seen = sa.inspect(bind)
    if "settled" not in {c["name"] for c in seen.get_columns("task_instances")}:
        op.add_column(
            "task_instances",
            sa.Column("settled", sa.String(16), sa.Computed(SETTLED_SQL, persisted=stored)),
        )
    indexes = {i["name"] for i in seen.get_indexes("task_instances")}
    if "ix_task_instances_settled_next_attempt" not in indexes:
        op.create_index(
            "ix_task_instances_settled_next_attempt",
            "task_instances",
            ["settled", "next_attempt_at_ms"],
        )
    if "ix_task_instances_status_next_attempt" in indexes:
        op.drop_index("ix_task_instances_status_next_attempt", table_name="task_instances")


def downgrade() -> None:
    op.create_index(
        "ix_task_instances_status_next_attempt", "task_instances", ["status", "next_attempt_at_ms"]
    )
    op.drop_index("ix_task_instances_settled_next_attempt", table_name="task_instances")
    op.drop_column("task_instances", "settled")
