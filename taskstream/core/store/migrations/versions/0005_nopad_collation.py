"""Keys compare byte for byte on MySQL and MariaDB: every table moves from `utf8mb4_bin`, a
PAD SPACE collation (`'k'` equals `'k '` in comparisons and in UNIQUE and primary keys), to the
NO PAD binary collation of the server: `utf8mb4_nopad_bin` on MariaDB (10.2 and later),
`utf8mb4_0900_bin` on MySQL (8.0.17 and later). SQLite and PostgreSQL already compare bytes:
nothing changes there.

Each table is rebuilt (`CONVERT TO`, which also sets its default for columns added later). The
foreign key from `instance_history` to `task_instances` is dropped first and added back
afterwards, since neither side of it may change collation while it exists.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Dialect

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out, not imported: a migration keeps the schema of its revision.
MARIADB_COLLATION = "utf8mb4_nopad_bin"
MYSQL_COLLATION = "utf8mb4_0900_bin"
OLD_COLLATION = "utf8mb4_bin"
TABLES = (
    "task_definitions",
    "task_instances",
    "instance_history",
    "trigger_decisions",
    "readiness_markers",
    "side_effects",
    "alerts",
    "review_queue",
    "upstreams",
)
FK_NAME = "fk_instance_history_instance"


def _nopad(dialect: Dialect) -> str:
    return MARIADB_COLLATION if getattr(dialect, "is_mariadb", False) else MYSQL_COLLATION


def _has_foreign_key() -> bool:
    """The foreign key is there: a run of this migration that failed halfway (MySQL commits
    each DDL statement) may have dropped it already."""
    found = op.get_bind().execute(
        sa.text(
            "SELECT 1 FROM information_schema.TABLE_CONSTRAINTS"
            " WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = 'instance_history'"
            " AND CONSTRAINT_TYPE = 'FOREIGN KEY' AND CONSTRAINT_NAME = :name"
        ),
        {"name": FK_NAME},
    )
    return found.first() is not None


def _convert(collation: str) -> None:
    """Each step can be run again: after a failure halfway (a lock wait timed out, a lost
    connection), `taskstream migrate` picks up where it stopped."""
    if _has_foreign_key():
        op.drop_constraint(FK_NAME, "instance_history", type_="foreignkey")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}")
    op.create_foreign_key(
        FK_NAME, "instance_history", "task_instances", ["instance_id"], ["id"], ondelete="CASCADE"
    )


def upgrade() -> None:
    dialect = op.get_bind().dialect
    if dialect.name == "mysql":
        _convert(_nopad(dialect))


def downgrade() -> None:
    # Fails with a duplicate key once two stored keys differ only by trailing spaces.
    if op.get_bind().dialect.name == "mysql":
        _convert(OLD_COLLATION)
