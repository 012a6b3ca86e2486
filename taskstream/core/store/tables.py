"""The schema: the one module that declares every table of the store (SQLAlchemy Core).

Dialect-neutral by construction:
- Times are BIGINT UTC epoch milliseconds in columns named `*_ms`, written from the database
  clock (`dbclock.db_now_ms`) unless the column holds a caller's domain time (fire times,
  `scheduled_for_ms`, deadlines).
- JSON is stored as text (`json.dumps(sort_keys=True, allow_nan=False)`), MEDIUMTEXT on MySQL so a
  payload of up to 16 MiB fits.
- MySQL tables are InnoDB, utf8mb4 with a binary NO PAD collation (`NOPAD_COLLATIONS`), so keys
  compare byte for byte as they do on SQLite and PostgreSQL: `Daily`, `daily` and `daily ` are
  three dedupe keys everywhere. (`utf8mb4_bin` is PAD SPACE: it ignores trailing spaces.)
- `task_instances.settled` is generated from `status`: NULL while the instance is in flight
  (`states.IN_FLIGHT`), the status it settled in (SUCCESS, FAILED, SKIPPED) once it has. Its index
  `(settled, next_attempt_at_ms)` finds the in-flight rows the reconciler and the due-retry
  scan need (`settled IS NULL`) and counts settled rows by status, without indexing `status`
  itself: the hot moves (PENDING -> DISPATCHED -> RUNNING) leave every secondary index alone
  and a run's whole life changes it once, when it settles. Nothing writes it; every dialect
  computes it (STORED on MySQL/MariaDB and PostgreSQL; VIRTUAL on SQLite, whose ALTER TABLE
  cannot add a stored column).
- The index on `fail_class` finds the rows FAILED with one class: those FAILED `poison`, each
  of which the dead-letter stream should hold a letter of (`dead list` shows those whose
  letter Redis lost). `fail_class` is NULL except on FAILED rows, so this index changes only
  when a run fails or is requeued: not at the hot moves (dispatch, claim), nor when a run
  succeeds (an index that also held `settled` would change then).

`migrations/versions` must produce exactly this schema; a contract test compares them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Computed,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeEngine

from taskstream.core.states import SETTLED

metadata = MetaData()

NOPAD_COLLATIONS = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}
"""The binary NO PAD collation of utf8mb4 per server: MariaDB 10.2+ and MySQL 8.0.17+ (which has
no `utf8mb4_nopad_bin`). The table options below name MariaDB's; the migrations give each
server its own."""

MYSQL_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": NOPAD_COLLATIONS["mariadb"],
}

ID_LEN = 64
TASK_ID_LEN = 200
KEY_LEN = 255
STATUS_LEN = 16
OWNER_LEN = 255
REASON_LEN = 500
NOTE_LEN = 500


SETTLED_SQL = "CASE WHEN status IN ({}) THEN status END".format(
    ", ".join(f"'{s.value}'" for s in sorted(SETTLED, key=lambda s: s.value))
)
"""The generation expression of `task_instances.settled` (constants only)."""


def _json_text() -> TypeEngine[str]:
    return Text().with_variant(mysql.MEDIUMTEXT(), "mysql")


def _serial() -> TypeEngine[int]:
    # SQLite only autoincrements an INTEGER PRIMARY KEY.
    return BigInteger().with_variant(Integer(), "sqlite")


def _ms(name: str, *, nullable: bool = False) -> Column[int]:
    return Column(name, BigInteger(), nullable=nullable)


task_definitions = Table(
    "task_definitions",
    metadata,
    Column("task_id", String(TASK_ID_LEN), primary_key=True),
    Column("spec", _json_text(), nullable=False),
    Column("spec_hash", String(128), nullable=False),
    Column("paused", Boolean(), nullable=False),
    _ms("cursor_ms", nullable=True),
    Column("cursor_token", BigInteger(), nullable=True),
    _ms("created_at_ms"),
    _ms("updated_at_ms"),
    _ms("schedule_from_ms", nullable=True),
    **MYSQL_OPTIONS,
)

task_instances = Table(
    "task_instances",
    metadata,
    Column("id", String(ID_LEN), primary_key=True),
    Column("task_id", String(TASK_ID_LEN), nullable=False),
    Column("agent", String(TASK_ID_LEN), nullable=False),
    Column("dedupe_key", String(KEY_LEN), nullable=False),
    Column("status", String(STATUS_LEN), nullable=False),
    Column("attempt", Integer(), nullable=False),
    Column("max_attempts", Integer(), nullable=False),
    Column("priority", String(STATUS_LEN), nullable=False),
    _ms("scheduled_for_ms"),
    Column("business_date", String(10), nullable=True),
    Column("payload", _json_text(), nullable=False),
    Column("result", _json_text(), nullable=True),
    Column("context", _json_text(), nullable=False),
    Column("fail_class", String(32), nullable=True),
    Column("last_error", Text(), nullable=True),
    Column("lease_owner", String(OWNER_LEN), nullable=True),
    _ms("lease_expires_at_ms", nullable=True),
    _ms("not_before_ms", nullable=True),
    _ms("deadline_ms", nullable=True),
    _ms("next_attempt_at_ms", nullable=True),
    Column("trace_id", String(ID_LEN), nullable=False),
    _ms("created_at_ms"),
    _ms("updated_at_ms"),
    Column("settled", String(STATUS_LEN), Computed(SETTLED_SQL, persisted=True), nullable=True),
    Index("uq_task_instances_dedupe_key", "dedupe_key", unique=True),
    Index("ix_task_instances_task_id_scheduled", "task_id", "scheduled_for_ms"),
    Index("ix_task_instances_settled_next_attempt", "settled", "next_attempt_at_ms"),
    Index("ix_task_instances_fail_class", "fail_class"),
    **MYSQL_OPTIONS,
)

INSTANCE_COLUMNS = tuple(c for c in task_instances.c if c.computed is None)
"""The columns a `task_instances` row is stored with (all but the generated `settled`)."""

instance_history = Table(
    "instance_history",
    metadata,
    Column("id", _serial(), primary_key=True, autoincrement=True),
    Column(
        "instance_id",
        String(ID_LEN),
        ForeignKey("task_instances.id", name="fk_instance_history_instance", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("from_status", String(STATUS_LEN), nullable=True),
    Column("to_status", String(STATUS_LEN), nullable=False),
    Column("attempt", Integer(), nullable=False),
    Column("owner", String(OWNER_LEN), nullable=True),
    Column("reason", String(REASON_LEN), nullable=False),
    _ms("at_ms"),
    # The why of a move beyond its reason (`retry --reason`, a lost end's release); else NULL.
    Column("note", String(NOTE_LEN), nullable=True),
    Index("ix_instance_history_instance_id", "instance_id"),
    **MYSQL_OPTIONS,
)

trigger_decisions = Table(
    "trigger_decisions",
    metadata,
    Column("id", _serial(), primary_key=True, autoincrement=True),
    Column("task_id", String(TASK_ID_LEN), nullable=False),
    _ms("fire_time_ms"),
    Column("decision", String(32), nullable=False),
    Column("reason", String(REASON_LEN), nullable=False),
    Column("details", _json_text(), nullable=False),
    Column("instance_id", String(ID_LEN), nullable=True),
    _ms("decided_at_ms"),
    Index("ix_trigger_decisions_task_fire", "task_id", "fire_time_ms"),
    **MYSQL_OPTIONS,
)

readiness_markers = Table(
    "readiness_markers",
    metadata,
    Column("name", String(TASK_ID_LEN), primary_key=True),
    Column("business_date", String(10), primary_key=True),
    _ms("created_at_ms"),
    **MYSQL_OPTIONS,
)

side_effects = Table(
    "side_effects",
    metadata,
    Column("idempotency_key", String(KEY_LEN), primary_key=True),
    Column("instance_id", String(ID_LEN), nullable=False),
    Column("attempt", Integer(), nullable=False),
    _ms("created_at_ms"),
    **MYSQL_OPTIONS,
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", _serial(), primary_key=True, autoincrement=True),
    Column("instance_id", String(ID_LEN), nullable=False),
    Column("level", String(16), nullable=False),
    Column("message", Text(), nullable=False),
    _ms("created_at_ms"),
    _ms("sent_at_ms", nullable=True),
    **MYSQL_OPTIONS,
)

review_queue = Table(
    "review_queue",
    metadata,
    Column("id", _serial(), primary_key=True, autoincrement=True),
    Column("instance_id", String(ID_LEN), nullable=False),
    Column("reason", String(REASON_LEN), nullable=False),
    _ms("created_at_ms"),
    _ms("resolved_at_ms", nullable=True),
    Column("resolved_by", String(OWNER_LEN), nullable=True),
    **MYSQL_OPTIONS,
)

upstreams = Table(
    "upstreams",
    metadata,
    Column("name", String(TASK_ID_LEN), primary_key=True),
    Column("config", _json_text(), nullable=False),
    _ms("updated_at_ms"),
    **MYSQL_OPTIONS,
)
