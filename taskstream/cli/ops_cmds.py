"""Operator commands: `retry ID` and `dead list|replay`."""

from __future__ import annotations

import sys

import typer
from rich.table import Table

from taskstream.cli.common import (
    Cluster,
    console,
    err_console,
    open_cluster,
    open_queue,
    operator,
    print_json,
    run_async,
    settings,
)
from taskstream.core import operations
from taskstream.core.errors import LetterKept, QueueUnavailable, StoreUnavailable, TaskstreamError
from taskstream.core.outbox import Outbox
from taskstream.core.spec import INSTANCE_ID_LENGTH

dead_app = typer.Typer(no_args_is_help=True, help="List and replay dead-lettered entries.")


def _outbox(cluster: Cluster) -> Outbox:
    return Outbox(cluster.store, cluster.queue, cluster.keys)


def retry_cmd(
    instance_id: str = typer.Argument(...),
    reason: str = typer.Option(..., "--reason", help="Why; recorded in the history."),
) -> None:
    """Requeue a FAILED instance (FAILED -> PENDING), recorded with who and why."""

    async def go() -> str | None:
        async with open_cluster(settings()) as cluster:
            return await operations.requeue(
                _outbox(cluster),
                instance_id,
                who=operator(),
                why=reason,
                now_ms=await cluster.store.db_now_ms(),
            )

    late = run_async(go())
    sys.stdout.write(f"{instance_id}: requeued\n")
    if late is not None:
        err_console.print(f"warning: {instance_id} {late}")


@dead_app.command("list")
def dead_list_cmd(
    limit: int = typer.Option(100, min=1, max=10_000),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The oldest dead letters with their reason and instance."""

    async def go() -> list[operations.DeadLetter]:
        async with open_queue(settings()) as (redis, keys):
            return await operations.dead_letters(redis, keys.dead, limit=limit)

    letters = run_async(go())
    if as_json:
        print_json([_row(letter) for letter in letters])
        return
    table = Table()
    table.add_column("dead_id", no_wrap=True)
    table.add_column("reason")
    table.add_column("detail")
    table.add_column("instance_id", no_wrap=True, min_width=INSTANCE_ID_LENGTH)
    table.add_column("source")
    for letter in letters:
        table.add_row(
            letter.dead_id,
            _cut(letter.reason, 40),
            _cut(letter.detail, 60),
            _cut(letter.instance_id or "", 40),
            _cut(letter.source_stream, 60),
        )
    console.print(table)


def _cut(text: str, width: int) -> str:
    """`text` to at most `width` characters, an ellipsis marking a cut: a letter another
    program wrote may carry fields of any length, which would squeeze every other column
    (the dead ids `dead replay ID` needs among them) to nothing."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(letter: operations.DeadLetter) -> dict[str, object]:
    return {
        "dead_id": letter.dead_id,
        "reason": letter.reason,
        "detail": letter.detail,
        "source_stream": letter.source_stream,
        "instance_id": letter.instance_id,
        "fields": letter.fields,
    }


@dead_app.command("replay")
def dead_replay_cmd(
    dead_id: str = typer.Argument(None, help="One dead letter id; omit with --all."),
    all_: bool = typer.Option(False, "--all", help="Replay every dead letter."),
) -> None:
    """Send dead-lettered instances through again (FAILED ones are requeued)."""
    if all_ and dead_id is not None:
        raise typer.BadParameter("give one dead letter id or --all, not both")
    if not all_ and dead_id is None:
        raise typer.BadParameter("which letters? give one dead letter id, or --all for every one")

    async def go() -> None:
        async with open_cluster(settings()) as cluster:
            if dead_id is None:
                await _replay_all(cluster)
                return
            letter = await operations.dead_letter(cluster.queue, cluster.keys.dead, dead_id)
            if letter is None:
                raise TaskstreamError(f"no dead letter with id {dead_id!r} (see `dead list`)")
            try:
                done = await _replay_one(cluster, letter)
            except LetterKept as exc:
                _say(f"{letter.dead_id}: {exc}")
                raise QueueUnavailable(f"redis unavailable: dead letter {dead_id} kept") from exc
            _say(f"{letter.dead_id}: {done}")

    run_async(go())


REPLAY_PAGE = 1000


async def _replay_all(cluster: Cluster) -> None:
    """Every dead letter there was when it started, oldest first, a page at a time. Letters
    kept (not replayable) are passed over and letters written meanwhile are left (a replayed
    instance can be dead-lettered again at once), so each is looked at once. Raises
    `TaskstreamError` at the end when some were kept, and at once when the store is down or
    Redis fails after a letter's replay was done (that letter's line says what was done)."""
    dead = cluster.keys.dead
    newest = await operations.newest_dead_id(cluster.queue, dead)
    after: str | None = None
    seen = kept = 0
    while newest and (
        letters := await operations.dead_letters(
            cluster.queue, dead, limit=REPLAY_PAGE, after=after, until=newest
        )
    ):
        for letter in letters:
            try:
                done = await _replay_one(cluster, letter)
            except StoreUnavailable:
                raise
            except LetterKept as exc:
                _say(f"{letter.dead_id}: {exc}")
                raise QueueUnavailable(
                    f"redis unavailable: stopped at dead letter {letter.dead_id} (kept)"
                ) from exc
            except TaskstreamError as exc:
                kept, done = kept + 1, f"not replayed: {exc}"
            _say(f"{letter.dead_id}: {done}")
        seen += len(letters)
        after = letters[-1].dead_id
    if kept:
        raise TaskstreamError(f"{kept} of {seen} dead letters not replayed (kept)")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _replay_one(cluster: Cluster, letter: operations.DeadLetter) -> str:
    return await operations.replay(
        _outbox(cluster), letter, who=operator(), now_ms=await cluster.store.db_now_ms()
    )
