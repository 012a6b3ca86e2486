"""Upstream limits from the `upstreams:` section of task files (limiter and breaker settings
per upstream name), so executors on every host read the same limits.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}


def upgrade() -> None:
    """Skipped when done: on MySQL the DDL commits before the revision is written, so a run
    stopped between the two is picked up by the next."""
    if sa.inspect(op.get_bind()).has_table("upstreams"):
        return
    op.create_table(
        "upstreams",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("config", sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql"), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        **MYSQL,
    )


def downgrade() -> None:
    op.drop_table("upstreams")
