"""Find the instances FAILED as poison without reading every settled row: the index on
`task_instances.fail_class`. `dead list` looks through them for dead letters
Redis lost (restored from an older snapshot, restarted without its data, flushed).

An index only: no table is rewritten. `fail_class` is NULL on every row in flight (the store
clears it at every move but the one to FAILED), so the index changes when a run fails or is
requeued, never at the hot moves (dispatch, claim) nor when a run succeeds.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_task_instances_fail_class"


def upgrade() -> None:
    """Skipped when done: on MySQL the DDL commits before the revision is written, so a run
    stopped between the two is picked up by the next."""
    indexes = sa.inspect(op.get_bind()).get_indexes("task_instances")
    if INDEX not in {i["name"] for i in indexes}:
        op.create_index(INDEX, "task_instances", ["fail_class"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="task_instances")
