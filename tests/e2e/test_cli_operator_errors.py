"""Operator commands refuse what they cannot do with one line naming it and a non-zero exit:
a dead letter id that does not exist, an id together with `--all`, a run count below one, a
task file given to `up` that is not there, a database never migrated."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import redis

from tests.e2e.cli_rig import applied, role_process, run_cli, wait_for


def test_replaying_a_dead_letter_that_does_not_exist_fails(tmp_path: Path, redis_url: str) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        out = run_cli("dead", "replay", "1-1", env=cli.env, cwd=cli.cwd)
    assert out.returncode == 1
    assert out.stderr == "error: no dead letter with id '1-1' (see `dead list`)\n"


def test_a_dead_letter_id_that_is_not_a_stream_id_is_named(tmp_path: Path, redis_url: str) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        out = run_cli("dead", "replay", "last-one", env=cli.env, cwd=cli.cwd)
    assert out.returncode == 1
    assert "'last-one' is not a dead letter id" in out.stderr


def test_replaying_all_looks_at_every_dead_letter_once(tmp_path: Path, redis_url: str) -> None:
    """More letters than one page; none can be replayed (they name no instance), so all are
    kept, and each is reported once: the pages move on past letters kept."""
    with applied(tmp_path, redis_url, {}) as cli:
        client = redis.Redis.from_url(redis_url)
        with client.pipeline(transaction=False) as pipe:
            for n in range(1001):
                pipe.xadd(cli.keys.dead, {"reason": "undecodable", "detail": str(n)})
            ids = [i.decode() for i in pipe.execute()]
        out = run_cli("dead", "replay", "--all", env=cli.env, cwd=cli.cwd)
        kept = client.xlen(cli.keys.dead)
        client.close()
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ids
    assert all("not replayed" in line and "names no instance" in line for line in lines)
    assert kept == 1001
    assert out.returncode == 1
    assert out.stderr == "error: 1001 of 1001 dead letters not replayed (kept)\n"


def test_a_dead_letter_that_cannot_be_replayed_fails(tmp_path: Path, redis_url: str) -> None:
    """Nothing was done, so `dead replay ID && ...` must not go on."""
    with applied(tmp_path, redis_url, {}) as cli:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        dead_id = str(client.xadd(cli.keys.dead, {"reason": "poison", "orig.instance_id": "x"}))
        out = run_cli("dead", "replay", dead_id, env=cli.env, cwd=cli.cwd)
        kept = client.xlen(cli.keys.dead)
        client.close()
    assert out.returncode == 1
    assert out.stderr == f"error: dead letter {dead_id} names no instance; kept\n"
    assert (out.stdout, kept) == ("", 1)


@pytest.mark.parametrize("option", ["socket_timeout=abc", "no_such_option=1"])
def test_a_redis_url_option_the_client_refuses_is_named(
    tmp_path: Path, redis_url: str, option: str
) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        env = cli.env | {"TASKSTREAM_REDIS_URL": f"{redis_url}?{option}"}
        out = run_cli("dead", "list", env=env, cwd=cli.cwd)
    assert out.returncode == 2
    assert out.stderr.startswith("TASKSTREAM_REDIS_URL: ")
    assert option.partition("=")[0] in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("1-1", "--all"), "give one dead letter id or --all, not both"),
        ((), "which letters? give one dead letter id, or --all for every one"),
    ],
)
def test_dead_replay_needs_exactly_one_of_an_id_and_all(
    tmp_path: Path, redis_url: str, args: tuple[str, ...], expected: str
) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        out = run_cli("dead", "replay", *args, env=cli.env, cwd=cli.cwd)
    assert out.returncode == 2
    assert expected in " ".join(out.stderr.replace("│", " ").split())


@pytest.mark.parametrize(("command", "value"), [("executor", "0"), ("executor", "-1"), ("up", "0")])
def test_fewer_than_one_run_at_once_is_refused(
    tmp_path: Path, redis_url: str, command: str, value: str
) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        out = run_cli(command, "--concurrency", value, env=cli.env, cwd=cli.cwd)
    assert out.returncode == 2
    assert "--concurrency" in out.stderr and "Traceback" not in out.stderr


def test_up_with_a_task_file_that_is_not_there_starts_nothing(
    tmp_path: Path, redis_url: str
) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        out = run_cli("up", "--tasks", "missing.yaml", env=cli.env, cwd=cli.cwd)
    assert out.returncode == 2
    assert "no task file at missing.yaml" in out.stderr
    assert not (tmp_path / ".taskstream").exists()


def test_a_database_never_migrated_says_to_migrate(tmp_path: Path, redis_url: str) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        sqlite3.connect(tmp_path / "fresh.db").close()  # an empty file: a database, no tables
        env = cli.env | {"TASKSTREAM_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
        out = run_cli("status", env=env, cwd=cli.cwd)
    assert out.returncode == 1
    assert out.stderr.startswith("error: store sqlite:///")
    assert "no taskstream tables" in out.stderr
    assert out.stderr.rstrip().endswith("run `taskstream migrate`")


@pytest.mark.parametrize("command", [("status",), ("tasks", "list"), ("instances",)])
def test_a_store_file_that_is_not_there_is_named_not_made(
    tmp_path: Path, redis_url: str, command: tuple[str, ...]
) -> None:
    """A typo in the path: the command says the file does not exist, with the exit of a store
    never migrated, and leaves no empty file behind; `migrate` makes it."""
    with applied(tmp_path, redis_url, {}) as cli:
        path = tmp_path / "typo.db"
        env = cli.env | {"TASKSTREAM_DATABASE_URL": "sqlite:///typo.db"}
        out = run_cli(*command, env=env, cwd=cli.cwd)
        assert out.returncode == 1
        assert out.stderr == (
            f"error: store sqlite:///typo.db: no file {path} (a typo in the URL?): "
            "run `taskstream migrate` to make it\n"
        )
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("typo")) == []
        run_cli("migrate", env=env, cwd=cli.cwd, check=True)
    assert path.is_file()


@pytest.mark.roles
@pytest.mark.parametrize("role", ["executor", "sweeper", "scheduler"])
def test_a_role_started_before_the_migration_waits_for_it(
    tmp_path: Path, redis_url: str, role: str
) -> None:
    """Started on a database with no tables, the role logs the outage and keeps running;
    after `migrate` it works (the executor runs a triggered instance) and SIGTERM exits 0."""
    with applied(tmp_path, redis_url, {}) as cli:
        env = cli.env | {"TASKSTREAM_DATABASE_URL": f"sqlite:///{tmp_path / 'late.db'}"}
        log = tmp_path / f"{role}.log"
        with role_process(role, env, log) as proc:
            assert wait_for(lambda: "run `taskstream migrate`" in log.read_text(), 30)
            assert proc.poll() is None
            run_cli("migrate", env=env, check=True)
            if role == "executor":
                (tmp_path / "t.yaml").write_text(TASK)
                run_cli("tasks", "apply", str(tmp_path / "t.yaml"), env=env, check=True)
                run_cli("trigger", "hello", env=env, check=True)
                assert wait_for(lambda: _succeeded(env), 30), log.read_text()[-2000:]
    assert proc.returncode == 0, log.read_text()[-2000:]


@pytest.mark.roles
def test_a_role_started_while_the_database_is_down_waits_for_it(
    tmp_path: Path, redis_url: str
) -> None:
    """The store cannot be opened at start (its folder is not there yet: as for a database
    server still starting): the role logs it and waits instead of exiting, then runs."""
    with applied(tmp_path, redis_url, {}) as cli:
        later = tmp_path / "later"
        env = cli.env | {"TASKSTREAM_DATABASE_URL": f"sqlite:///{later / 'store.db'}"}
        log = tmp_path / "executor.log"
        with role_process("executor", env, log) as proc:
            assert wait_for(lambda: "startup.dependency_down" in log.read_text(), 30)
            assert proc.poll() is None
            later.mkdir()
            (tmp_path / "store.db").rename(later / "store.db")
            assert wait_for(lambda: "executor.started" in log.read_text(), 30), log.read_text()
            (tmp_path / "t.yaml").write_text(TASK)
            run_cli("tasks", "apply", str(tmp_path / "t.yaml"), env=env, check=True)
            run_cli("trigger", "hello", env=env, check=True)
            assert wait_for(lambda: _succeeded(env), 30), log.read_text()[-2000:]
    assert proc.returncode == 0, log.read_text()[-2000:]


TASK = "tasks:\n  - {id: hello, agent: echo, payload: {hi: 1}}\n"


def _succeeded(env: dict[str, str]) -> bool:
    out = run_cli("instances", "--status", "SUCCESS", "--json", env=env)
    return out.returncode == 0 and len(json.loads(out.stdout)) == 1


def test_a_stored_definition_that_no_longer_validates_is_listed_as_invalid(
    tmp_path: Path, redis_url: str
) -> None:
    """A definition stored by a newer version (a field this one does not know) does not hide
    the others: `tasks list` shows every task, names the bad one's problem on stderr without
    its stored value, and exits 1."""
    files = {"t.yaml": "tasks:\n  - {id: a, agent: echo}\n  - {id: b, agent: echo}\n"}
    with applied(tmp_path, redis_url, files) as cli:
        with sqlite3.connect(tmp_path / "store.db") as db:
            db.execute(
                "UPDATE task_definitions SET spec = json_set(spec, '$.newfield', 'v-secret')"
                " WHERE task_id = 'b'"
            )
        out = run_cli("tasks", "list", "--json", env=cli.env, cwd=cli.cwd)
    assert out.returncode == 1
    rows = {row["task_id"]: row for row in json.loads(out.stdout)}
    assert (rows["a"]["valid"], rows["b"]["valid"]) == (True, False)
    assert out.stderr == "stored task 'b': newfield: Extra inputs are not permitted\n"


def test_dead_letters_are_listed_while_the_store_is_down(tmp_path: Path, redis_url: str) -> None:
    """The letters on the stream are read from Redis alone: a store that is down does not
    hide them. It hides the letters Redis lost (instances FAILED poison in the store with no
    letter), so the answer is partial, said on stderr, and the exit is 1, as `status` does
    with Redis down."""
    with applied(tmp_path, redis_url, {}) as cli:
        client = redis.Redis.from_url(redis_url)
        try:
            client.xadd(cli.keys.dead, {"reason": "poison", "detail": "boom"})
        finally:
            client.close()
        env = cli.env | {"TASKSTREAM_DATABASE_URL": "mysql+asyncmy://root@127.0.0.1:1/x"}
        out = run_cli("dead", "list", "--json", env=env)
    assert out.returncode == 1, out.stderr
    assert [(x["reason"], x["lost"]) for x in json.loads(out.stdout)] == [("poison", False)]
    assert out.stderr.startswith("error: lost letters unknown: store mysql+asyncmy://")
    assert len(out.stderr.splitlines()) == 1


def test_up_refuses_a_task_file_whose_payload_is_over_the_limit(
    tmp_path: Path, redis_url: str
) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        (tmp_path / "big.yaml").write_text(
            "tasks:\n  - {id: big, agent: echo, payload: {blob: '" + "x" * 2000 + "'}}\n"
        )
        env = cli.env | {"TASKSTREAM_MAX_PAYLOAD_BYTES": "1024"}
        out = run_cli("up", "--tasks", "big.yaml", env=env, cwd=cli.cwd)
    assert out.returncode == 2
    assert out.stderr.startswith("big.yaml: task 'big': payload: ")
    assert "over the limit of 1024 bytes" in out.stderr
    assert not (tmp_path / ".taskstream").exists()
