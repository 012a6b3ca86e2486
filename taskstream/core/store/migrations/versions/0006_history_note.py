"""A note on history rows: `instance_history.note`, the why a person gave for a move they made
(`taskstream retry ID --reason ...`), kept with the move itself. Before, it was kept only in
the instance's `last_error`, which the next failure overwrites.

A nullable column added at the end: MariaDB and MySQL add it in place without copying the
table; rows written before have none.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out, not imported: a migration keeps the schema of its revision.
NOTE_LEN = 500


def upgrade() -> None:
    """Skipped when done: on MySQL the DDL commits before the revision is written, so a run
    stopped between the two is picked up by the next."""
    columns = sa.inspect(op.get_bind()).get_columns("instance_history")
    if "note" not in {c["name"] for c in columns}:
        op.add_column("instance_history", sa.Column("note", sa.String(NOTE_LEN), nullable=True))


def downgrade() -> None:
    op.drop_column("instance_history", "note")
