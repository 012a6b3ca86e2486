"""Which Redis replies are denials, what they name, and the pauses after them: replies as
Redis 7 and Valkey word them, parsed by redis-py as the roles get them."""

from __future__ import annotations

import pytest
from redis.exceptions import NoPermissionError, ReadOnlyError, ResponseError

from taskstream.core.denials import Holds, command_of, denied, pause_s, refused, reply_of

PIPELINE = (
    "Command # 1 (XACK ts:{x}:stream:default executors 1-0) of pipeline caused error: "
    "this user has no permissions to run the 'xack' command"
)
SCRIPT = (
    "The user executing the script can't run this command or subcommand script: "
    "a764d429f9fe6948381e4de60effb176f4883f41, on @user_script:5."
)


NO = "this user has no permissions to "
UNKNOWN = "unknown command 'XAUTOCLAIM', with args beginning with: 'ts:{x}:s' "
FROM_SCRIPT = "Unknown Redis command called from script script: abc, on @user_script:3."


@pytest.mark.parametrize(
    ("exc", "command"),
    [
        (NoPermissionError(NO + "run the 'xadd' command"), "XADD"),
        (NoPermissionError(NO + "run the 'xinfo|consumers' command"), "XINFO|CONSUMERS"),
        (NoPermissionError(NO + "access one of the keys used as arguments"), "EVALSHA"),
        (NoPermissionError(NO + "access one of the channels used as arguments"), "EVALSHA"),
        (ResponseError(UNKNOWN), "XAUTOCLAIM"),
        (ResponseError(FROM_SCRIPT), "EVALSHA"),
        (ResponseError("unknown command 'XADD' (called from a script)"), "XADD"),
        (ResponseError("Invalid command passed to redis.acl_check_cmd()"), "EVALSHA"),
        (ResponseError(SCRIPT), "EVALSHA"),
        (NoPermissionError(PIPELINE), "XACK"),
    ],
)
def test_a_denial_names_the_command_the_reply_names_else_the_one_sent(
    exc: ResponseError, command: str
) -> None:
    assert denied(exc)
    assert command_of(exc, "EVALSHA") == command


@pytest.mark.parametrize(
    "exc",
    [
        ResponseError("NOGROUP No such key 'ts:{x}:stream:high' or consumer group"),
        ResponseError("BUSYGROUP Consumer Group name already exists"),
        ReadOnlyError("You can't write against a read only replica."),
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ConnectionError("refused"),
    ],
)
def test_outages_and_other_errors_are_no_denials(exc: Exception) -> None:
    assert not denied(exc)


def test_the_reply_keeps_no_argument_of_the_call() -> None:
    unknown = ResponseError("unknown command 'XADD', with args beginning with: 'secret-value' ")
    assert reply_of(unknown) == "unknown command 'XADD'"
    assert reply_of(NoPermissionError(PIPELINE)) == (
        "NOPERM this user has no permissions to run the 'xack' command"
    )
    assert "executors" not in reply_of(NoPermissionError(PIPELINE))


def test_a_key_denial_names_the_calls_keys_and_a_command_denial_does_not() -> None:
    keys = ("ts:{x}:stream:default", "ts:{x}:dead")
    by_key = NoPermissionError("this user has no permissions to access one of the keys used")
    assert refused(by_key, "EVALSHA", keys).reply.endswith("(ts:{x}:stream:default, ts:{x}:dead)")
    by_command = NoPermissionError("this user has no permissions to run the 'xadd' command")
    assert "ts:{x}" not in refused(by_command, "EVALSHA", keys).reply


def test_pauses_double_up_to_the_cap() -> None:
    assert [pause_s(n) for n in (0, 1, 2, 3, 5, 6, 99)] == [1, 1, 2, 4, 16, 30, 30]


def test_a_held_key_is_due_again_after_its_pause_and_at_once_once_cleared() -> None:
    holds = Holds()
    assert holds.due("e", 0)
    assert holds.hold("e", 0) == 1.0 and not holds.due("e", 999) and holds.due("e", 1000)
    assert holds.hold("e", 1000) == 2.0 and not holds.due("e", 2999) and holds.due("e", 3000)
    holds.clear("e")
    assert holds.due("e", 1000) and holds.hold("e", 1000) == 1.0


def test_holds_forget_the_oldest_past_their_size() -> None:
    holds = Holds(kept=2)
    for key in "abc":
        holds.hold(key, 0)
    assert holds.due("a", 0) and not holds.due("b", 0) and not holds.due("c", 0)
