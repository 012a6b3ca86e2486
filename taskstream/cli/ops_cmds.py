"""Operator commands: `retry ID` and `dead list|replay`."""

from __future__ import annotations

import sys
from contextlib import aclosing

import typer

from taskstream.cli import dead_view
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
from taskstream.cli.shown import err_line
from taskstream.core import lost_letters, operations
from taskstream.core.errors import LetterKept, QueueUnavailable, StoreUnavailable, TaskstreamError
from taskstream.core.lost_letters import LostLetter
from taskstream.core.outbox import Outbox

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
    """The oldest dead letters with their reason and instance; then the instances FAILED
    poison in the store whose letter is not on the stream (lost with Redis's data), the
    latest failure first, looked for among the latest 1,000 poison failures (or `--limit`,
    when higher). With the store down, the letters alone and the store error, exit 1."""
    letters, lost, down = run_async(_dead_list(limit))
    if as_json:
        print_json(dead_view.letters_json(letters, lost.lost if lost else []))
        if lost is not None and not lost.all_examined:
            err_line(f"lost letters: {dead_view.examined_text(lost)}")
    else:
        dead_view.print_letters(console, letters)
        if lost is not None:
            dead_view.print_lost(console, lost)
    if down is not None:
        err_line(f"error: lost letters unknown: {down}")
        raise typer.Exit(1)


async def _dead_list(
    limit: int,
) -> tuple[list[operations.DeadLetter], lost_letters.LostAmong | None, str | None]:
    """Up to `limit` letters (the oldest) and up to `limit` lost letters (the latest failure
    first) among the latest `LOST_EXAMINED` poison failures, or `limit` when higher; the lost
    ones None, and why, when the store is unavailable: the letters are still shown."""
    s = settings()
    examine = max(limit, lost_letters.LOST_EXAMINED)
    async with open_queue(s) as (redis, keys):
        letters = await operations.dead_letters(redis, keys.dead, limit=limit)
        try:
            async with open_cluster(s, need_redis=False) as cluster:
                lost = await lost_letters.latest_lost(
                    cluster.store, redis, keys.dead, examine=examine, count=limit
                )
        except StoreUnavailable as exc:
            return letters, None, str(exc)
    return letters, lost, None


@dead_app.command("replay")
def dead_replay_cmd(
    dead_id: str = typer.Argument(
        None,
        metavar="ID",
        help="One dead letter id, or the instance id of a lost letter; omit with --all.",
    ),
    all_: bool = typer.Option(False, "--all", help="Replay every dead letter, lost ones too."),
) -> None:
    """Send dead-lettered instances through again (FAILED ones are requeued), by a dead
    letter id or, for a letter Redis lost, by its instance id (as `dead list` shows them)."""
    if all_ and dead_id is not None:
        raise typer.BadParameter("give one dead letter id or --all, not both")
    if not all_ and dead_id is None:
        raise typer.BadParameter("which letters? give one dead letter id, or --all for every one")

    async def go() -> None:
        async with open_cluster(settings()) as cluster:
            if dead_id is None:
                await _replay_all(cluster)
            elif operations.DEAD_ID.fullmatch(dead_id) is None:
                await _replay_lost_one(cluster, dead_id)
            else:
                await _replay_letter(cluster, dead_id)

    run_async(go())


async def _replay_letter(cluster: Cluster, dead_id: str) -> None:
    letter = await operations.dead_letter(cluster.queue, cluster.keys.dead, dead_id)
    if letter is None:
        raise TaskstreamError(f"no dead letter with id {dead_id!r} (see `dead list`)")
    try:
        done = await _replay_one(cluster, letter)
    except LetterKept as exc:
        _say(f"{letter.dead_id}: {exc}")
        raise _kept(exc, f"dead letter {dead_id} kept") from exc
    _say(f"{letter.dead_id}: {done}")


async def _replay_lost_one(cluster: Cluster, instance_id: str) -> None:
    """Requeue the instance of a lost letter, named by its id."""
    if await cluster.store.get_instance(instance_id) is None:
        raise TaskstreamError(
            f"{instance_id!r} is not a dead letter id (ms-seq) nor an instance id"
            " (as `dead list` shows them)"
        )
    lost = await lost_letters.lost_letter(
        cluster.store, cluster.queue, cluster.keys.dead, instance_id
    )
    _say(f"{instance_id} (lost letter): {await _replay_lost(cluster, lost)}")


REPLAY_PAGE = 1000


async def _replay_all(cluster: Cluster) -> None:
    """Every dead letter there was when it started, oldest first, then every lost letter of
    an instance that failed by then, the latest failure first. Raises `TaskstreamError` at
    the end when some were not replayed, and at once when the store is down or Redis fails
    after a letter's replay was done (that letter's line says what was done)."""
    started_ms = await cluster.store.db_now_ms()
    kept, seen = await _replay_letters(cluster)
    lost_kept, lost_seen = await _replay_lost_letters(cluster, started_ms)
    problems = [f"{kept} of {seen} dead letters not replayed (kept)"] if kept else []
    if lost_kept:
        problems.append(f"{lost_kept} of {lost_seen} lost letters not replayed")
    if problems:
        raise TaskstreamError("; ".join(problems))


async def _replay_letters(cluster: Cluster) -> tuple[int, int]:
    """Every dead letter there was when it started, oldest first, a page at a time. Letters
    kept (not replayable) are passed over and letters written meanwhile are left (a replayed
    instance can be dead-lettered again at once), so each is looked at once. Returns how many
    were kept and looked at."""
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
                raise _kept(exc, f"stopped at dead letter {letter.dead_id} (kept)") from exc
            except TaskstreamError as exc:
                kept, done = kept + 1, f"not replayed: {exc}"
            _say(f"{letter.dead_id}: {done}")
        seen += len(letters)
        after = letters[-1].dead_id
    return kept, seen


async def _replay_lost_letters(cluster: Cluster, failed_until_ms: int) -> tuple[int, int]:
    """Every lost letter of an instance that failed by `failed_until_ms` (epoch ms, database
    clock), the latest failure first: one failing again meanwhile is not chased, and each is
    looked at once. Returns how many were not replayed and looked at."""
    seen = kept = 0
    found = lost_letters.lost_letters(
        cluster.store, cluster.queue, cluster.keys.dead, failed_until_ms=failed_until_ms
    )
    async with aclosing(found) as lost_ones:
        async for lost in lost_ones:
            seen += 1
            try:
                done = await _replay_lost(cluster, lost)
            except StoreUnavailable:
                raise
            except TaskstreamError as exc:
                kept, done = kept + 1, f"not replayed: {exc}"
            _say(f"{lost.row.id} (lost letter): {done}")
    return kept, seen


def _kept(exc: LetterKept, what: str) -> QueueUnavailable:
    """The command's error for a letter kept after its replay was done: why Redis did not
    drop it (down, or refusing the XDEL), then `what`."""
    cause = exc.__cause__
    why = operations.redis_failure(cause) if isinstance(cause, Exception) else "redis failed"
    return QueueUnavailable(f"{why}: {what}")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _replay_one(cluster: Cluster, letter: operations.DeadLetter) -> str:
    return await operations.replay(
        _outbox(cluster), letter, who=operator(), now_ms=await cluster.store.db_now_ms()
    )


async def _replay_lost(cluster: Cluster, lost: LostLetter) -> str:
    return await lost_letters.replay_lost(
        _outbox(cluster), lost, who=operator(), now_ms=await cluster.store.db_now_ms()
    )
