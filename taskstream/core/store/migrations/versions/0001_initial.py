"""Initial schema: definitions, instances, history, decisions, markers, side effects, alerts,
review queue.

Written out in full rather than imported from `tables.py`, so this revision stays what it was
when later revisions change the live schema.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}


def _json() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql")


def _serial() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ms(name: str, *, nullable: bool = False) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), nullable=nullable)


def _definitions_and_instances() -> None:
    op.create_table(
        "task_definitions",
        sa.Column("task_id", sa.String(200), primary_key=True),
        sa.Column("spec", _json(), nullable=False),
        sa.Column("spec_hash", sa.String(128), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        _ms("cursor_ms", nullable=True),
        _ms("created_at_ms"),
        _ms("updated_at_ms"),
        **MYSQL,
    )
    op.create_table(
        "task_instances",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("agent", sa.String(200), nullable=False),
        sa.Column("dedupe_key", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        _ms("scheduled_for_ms"),
        sa.Column("business_date", sa.String(10), nullable=True),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("result", _json(), nullable=True),
        sa.Column("context", _json(), nullable=False),
        sa.Column("fail_class", sa.String(32), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        _ms("lease_expires_at_ms", nullable=True),
        _ms("not_before_ms", nullable=True),
        _ms("deadline_ms", nullable=True),
        _ms("next_attempt_at_ms", nullable=True),
        sa.Column("trace_id", sa.String(64), nullable=False),
        _ms("created_at_ms"),
        _ms("updated_at_ms"),
        **MYSQL,
    )
    op.create_index("uq_task_instances_dedupe_key", "task_instances", ["dedupe_key"], unique=True)
    op.create_index(
        "ix_task_instances_task_id_scheduled", "task_instances", ["task_id", "scheduled_for_ms"]
    )
    op.create_index(
        "ix_task_instances_status_next_attempt", "task_instances", ["status", "next_attempt_at_ms"]
    )


def _history_and_decisions() -> None:
    op.create_table(
        "instance_history",
        sa.Column("id", _serial(), primary_key=True, autoincrement=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("from_status", sa.String(16), nullable=True),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("reason", sa.String(500), nullable=False),
        _ms("at_ms"),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["task_instances.id"],
            name="fk_instance_history_instance",
            ondelete="CASCADE",
        ),
        **MYSQL,
    )
    op.create_index("ix_instance_history_instance_id", "instance_history", ["instance_id"])
    op.create_table(
        "trigger_decisions",
        sa.Column("id", _serial(), primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(200), nullable=False),
        _ms("fire_time_ms"),
        sa.Column("decision", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("details", _json(), nullable=False),
        sa.Column("instance_id", sa.String(64), nullable=True),
        _ms("decided_at_ms"),
        **MYSQL,
    )
    op.create_index(
        "ix_trigger_decisions_task_fire", "trigger_decisions", ["task_id", "fire_time_ms"]
    )


def _operations() -> None:
    op.create_table(
        "readiness_markers",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("business_date", sa.String(10), primary_key=True),
        _ms("created_at_ms"),
        **MYSQL,
    )
    op.create_table(
        "side_effects",
        sa.Column("idempotency_key", sa.String(255), primary_key=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        _ms("created_at_ms"),
        **MYSQL,
    )
    op.create_table(
        "alerts",
        sa.Column("id", _serial(), primary_key=True, autoincrement=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        _ms("created_at_ms"),
        _ms("sent_at_ms", nullable=True),
        **MYSQL,
    )
    op.create_table(
        "review_queue",
        sa.Column("id", _serial(), primary_key=True, autoincrement=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        _ms("created_at_ms"),
        _ms("resolved_at_ms", nullable=True),
        sa.Column("resolved_by", sa.String(255), nullable=True),
        **MYSQL,
    )


def upgrade() -> None:
    _definitions_and_instances()
    _history_and_decisions()
    _operations()


def downgrade() -> None:
    for table in (
        "review_queue",
        "alerts",
        "side_effects",
        "readiness_markers",
        "trigger_decisions",
        "instance_history",
        "task_instances",
        "task_definitions",
    ):
        op.drop_table(table)
