"""Hostile and mistaken input: every bad flag, variable or URL exits 2 naming the setting.

One table drives `elector run`, `elector status` and `elector handoff` through click's runner
(the daemon is replaced, as in test_main.py: nothing may start); a few rows run the installed
console script in a subprocess to check the real exit code and stderr. Every row runs with a
password in the environment's Redis URL, so no message may ever show it. The rows complement
tests/cli/test_main.py (which covers the basic timing and lock-name errors): here are the variable
forms, URLs that redis-py would accept silently and then never reach (port 0, `/abc` as the
database, a stray newline), absurd durations, and options that contradict each other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import elector.daemon.service
from elector.cli.main import cli
from elector.daemon.settings import Settings

PASSWORD = "pw-Zq8x-never-shown"
#: Valid, with a password: every row that does not set its own URL runs with this one.
PASSWORD_URL = f"redis://:{PASSWORD}@127.0.0.1:6390/0"
ELECTOR_SCRIPT = Path(sys.executable).with_name("elector")


@pytest.fixture(autouse=True)
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    for key in list(os.environ):
        if key.startswith("ELECTOR_") and key != "ELECTOR_REDIS_SERVER":
            monkeypatch.delenv(key)
    started: list[Settings] = []

    def fake_run_daemon(settings: Settings) -> int:
        started.append(settings)
        return 0

    monkeypatch.setattr(elector.daemon.service, "run_daemon", fake_run_daemon)
    return started


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("hostile")
    paths = {
        "empty": root / "empty",
        "newline": root / "newline",
        "binary": root / "binary",
        "no-locks": root / "no-locks",
        "bad-locks": root / "bad-locks",
    }
    paths["empty"].write_text("")
    paths["newline"].write_text("\n")
    paths["binary"].write_bytes(b"\xff\xfe\x00" + PASSWORD.encode())
    paths["no-locks"].write_text("# nothing here\n\n")
    paths["bad-locks"].write_text("good\nbad lock\n")
    return {name: str(path) for name, path in paths.items()} | {"dir": str(root)}


# (id, command line after the subcommand, environment, fragments the message must contain)
Row = tuple[str, list[str], dict[str, str], list[str]]

RUN_ROWS: list[Row] = [
    # Durations, as flags and as variables (the variable's name must be in the message).
    ("env-ttl-garbage", ["--lock", "x"], {"ELECTOR_TTL": "abc"}, ["--ttl", "ELECTOR_TTL", "'abc'"]),
    ("env-ttl-negative", ["--lock", "x"], {"ELECTOR_TTL": "-5s"}, ["--ttl", "ELECTOR_TTL"]),
    ("env-ttl-empty-unit", ["--lock", "x"], {"ELECTOR_TTL": "s"}, ["--ttl", "ELECTOR_TTL"]),
    ("env-ttl-too-short", ["--lock", "x"], {"ELECTOR_TTL": "100ms"}, ["--ttl", "ELECTOR_TTL", "500ms"]),
    ("ttl-two-dots", ["--lock", "x", "--ttl", "1.5.5s"], {}, ["--ttl", "not a duration"]),
    ("ttl-exponent", ["--lock", "x", "--ttl", "1e3s"], {}, ["--ttl", "not a duration"]),
    ("ttl-absurd", ["--lock", "x", "--ttl", "9" * 30 + "h"], {}, ["--ttl", "too long"]),
    ("ttl-over-a-day", ["--lock", "x", "--ttl", "25h"], {}, ["--ttl", "at most 24h"]),
    ("env-interval", ["--lock", "x"], {"ELECTOR_RENEW_INTERVAL": "3"}, ["--renew-interval", "no unit"]),
    ("interval-zero", ["--lock", "x", "--renew-interval", "0s"], {}, ["--renew-interval", "positive"]),
    ("env-deadline", ["--lock", "x"], {"ELECTOR_RENEW_DEADLINE": "soon"}, ["ELECTOR_RENEW_DEADLINE"]),
    (
        "env-deadline-above-ttl",
        ["--lock", "x"],
        {"ELECTOR_TTL": "2s", "ELECTOR_RENEW_DEADLINE": "3s"},
        ["--ttl, --renew-deadline (set by ELECTOR_TTL, ELECTOR_RENEW_DEADLINE)", "renew deadline"],
    ),
    ("timeout-zero", ["--lock", "x", "--request-timeout", "0s"], {}, ["--request-timeout", "positive"]),
    (
        "env-timeout-long",
        ["--lock", "x"],
        {"ELECTOR_REQUEST_TIMEOUT": "10s"},
        ["--request-timeout, --renew-interval (set by ELECTOR_REQUEST_TIMEOUT)", "shorter"],
    ),
    ("kill-grace-garbage", ["--lock", "x", "--kill-grace", "lots", "--", "true"], {}, ["--kill-grace"]),
    # Lock names and identities.
    ("lock-empty", ["--lock", ""], {}, ["--lock", "not a valid lock name"]),
    ("lock-dash", ["--lock", "-x"], {}, ["--lock", "'-x'"]),
    ("lock-unicode", ["--lock", "réservé"], {}, ["--lock", "not a valid lock name"]),
    ("lock-newline", ["--lock", "a\nb"], {}, ["--lock", "not a valid lock name"]),
    ("env-lock-braces", [], {"ELECTOR_LOCK": "ok {x}"}, ["--lock (set by ELECTOR_LOCK)", "'{x}'"]),
    ("env-lock-twice", [], {"ELECTOR_LOCK": "a a"}, ["--lock (set by ELECTOR_LOCK)", "more than once"]),
    ("locks-file-empty", ["--locks-file", "{no-locks}"], {}, ["--lock", "at least one lock name"]),
    ("locks-file-bad-line", ["--locks-file", "{bad-locks}"], {}, ["--locks-file", ":2:", "'bad lock'"]),
    ("locks-file-dir", ["--locks-file", "{dir}"], {}, ["--locks-file", "is a directory"]),
    ("identity-empty", ["--lock", "x", "--identity", ""], {}, ["--identity", "1-253 characters"]),
    ("identity-long", ["--lock", "x", "--identity", "i" * 254], {}, ["--identity", "got 254"]),
    ("identity-tab", ["--lock", "x", "--identity", "a\tb"], {}, ["--identity", "control characters"]),
    (
        "env-identity-newline",
        ["--lock", "x"],
        {"ELECTOR_IDENTITY": "pod\n"},
        ["--identity (set by ELECTOR_IDENTITY)", "control characters"],
    ),
    # Redis URLs (redis, rediss, unix) and the password file.
    ("url-port-zero", ["--lock", "x", "--redis-url", "redis://h:0"], {}, ["--redis-url", "port 0"]),
    ("url-port-negative", ["--lock", "x", "--redis-url", "redis://h:-1"], {}, ["--redis-url", "port"]),
    ("url-port-text", ["--lock", "x", "--redis-url", "rediss://h:tls"], {}, ["--redis-url", "port"]),
    ("url-db-text", ["--lock", "x", "--redis-url", "redis://h/abc"], {}, ["--redis-url", "database number"]),
    ("url-db-negative", ["--lock", "x", "--redis-url", "redis://h/-1"], {}, ["--redis-url", "database"]),
    ("url-db-nested", ["--lock", "x", "--redis-url", "redis://h/0/1"], {}, ["--redis-url", "database"]),
    ("url-db-twice", ["--lock", "x", "--redis-url", "redis://h/1?db=2"], {}, ["--redis-url", "twice"]),
    ("url-db-query-text", ["--lock", "x", "--redis-url", "redis://h?db=x"], {}, ["--redis-url", "'db'"]),
    ("url-option-repeated", ["--lock", "x", "--redis-url", "redis://h?db=1&db=2"], {}, ["more than once"]),
    ("url-host-blank", ["--lock", "x", "--redis-url", "redis://re dis:6379"], {}, ["invalid host"]),
    ("url-newline", ["--lock", "x", "--redis-url", "redis://h\n:6379"], {}, ["--redis-url", "control"]),
    ("url-scheme-http", ["--lock", "x", "--redis-url", "https://h"], {}, ["--redis-url", "redis://"]),
    ("url-scheme-typo", ["--lock", "x", "--redis-url", "redis:/h:6379"], {}, ["--redis-url"]),
    ("url-empty", ["--lock", "x", "--redis-url", ""], {}, ["--redis-url", "must start with"]),
    ("url-unix-no-path", ["--lock", "x", "--redis-url", "unix://"], {}, ["--redis-url", "socket path"]),
    (
        "url-unix-option",
        ["--lock", "x", "--redis-url", "unix:///run/redis.sock?socket_timeout=9"],
        {},
        ["--redis-url", "'socket_timeout' is not supported"],
    ),
    (
        "url-retry-option",
        ["--lock", "x", "--redis-url", "redis://h?retry_on_timeout=yes"],
        {},
        ["--redis-url", "'retry_on_timeout' is not supported"],
    ),
    (
        "url-password-slash",
        ["--lock", "x", "--redis-url", f"redis://:{PASSWORD}/x@h:6379/0"],
        {},
        ["--redis-url", "percent-encode"],
    ),
    (
        "url-password-hash",
        ["--lock", "x", "--redis-url", f"redis://user:{PASSWORD}#1@h:6379/0"],
        {},
        ["--redis-url", "percent-encode"],
    ),
    (
        "url-password-bad-port",
        ["--lock", "x", "--redis-url", f"redis://user:{PASSWORD}@h:123456/0"],
        {},
        ["--redis-url", "user:***@h:123456"],
    ),
    (
        "url-query-password-bad-db",
        ["--lock", "x", "--redis-url", f"redis://h/0?password={PASSWORD}&db=1"],
        {},
        ["--redis-url", "password=***"],
    ),
    (
        "env-url-bad-host",
        ["--lock", "x"],
        {"ELECTOR_REDIS_URL": f"redis://:{PASSWORD}@bad host:6379/0"},
        ["--redis-url (set by ELECTOR_REDIS_URL)", ":***@"],
    ),
    ("password-file-empty", ["--lock", "x", "--redis-password-file", "{empty}"], {}, ["is empty"]),
    ("password-file-newline", ["--lock", "x", "--redis-password-file", "{newline}"], {}, ["is empty"]),
    ("password-file-binary", ["--lock", "x", "--redis-password-file", "{binary}"], {}, ["not UTF-8"]),
    ("password-file-dir", ["--lock", "x", "--redis-password-file", "{dir}"], {}, ["--redis-password-file"]),
    (
        "env-password-file-missing",
        ["--lock", "x"],
        {"ELECTOR_REDIS_PASSWORD_FILE": "/nonexistent/secret"},
        ["--redis-password-file (set by ELECTOR_REDIS_PASSWORD_FILE)", "No such file"],
    ),
    # HTTP address, logs, numbers, flags.
    ("http-ipv6-open", ["--lock", "x", "--http-address", "[::1:8080"], {}, ["--http-address"]),
    ("http-url", ["--lock", "x", "--http-address", "http://0.0.0.0:8080"], {}, ["--http-address", "host"]),
    ("http-two-ports", ["--lock", "x", "--http-address", "h:1:2"], {}, ["--http-address"]),
    ("http-port-negative", ["--lock", "x", "--http-address", ":-1"], {}, ["--http-address", "port"]),
    ("http-ipv6-bare", ["--lock", "x", "--http-address", "::1:8080"], {}, ["--http-address", "brackets"]),
    (
        "env-http-host",
        ["--lock", "x"],
        {"ELECTOR_HTTP_ADDRESS": "exa mple:80"},
        ["--http-address (set by ELECTOR_HTTP_ADDRESS)", "invalid host"],
    ),
    ("env-log-level", ["--lock", "x"], {"ELECTOR_LOG_LEVEL": "loud"}, ["--log-level", "ELECTOR_LOG_LEVEL"]),
    (
        "env-log-format",
        ["--lock", "x"],
        {"ELECTOR_LOG_FORMAT": "xml"},
        ["--log-format", "ELECTOR_LOG_FORMAT"],
    ),
    ("env-priority-float", ["--lock", "x"], {"ELECTOR_PRIORITY": "1.5"}, ["--priority", "ELECTOR_PRIORITY"]),
    ("priority-negative-huge", ["--lock", "x", "--priority", "-2000000"], {}, ["--priority", "between"]),
    ("leader-file-dir", ["--lock", "x", "--leader-file", "{dir}"], {}, ["--leader-file", "directory"]),
    # Options that contradict each other.
    (
        "child-exit-no-command",
        ["--lock", "x", "--on-child-exit", "exit"],
        {},
        ["--on-child-exit", "exec mode"],
    ),
    (
        "env-child-exit-no-command",
        ["--lock", "x"],
        {"ELECTOR_ON_CHILD_EXIT": "restart"},
        ["--on-child-exit (set by ELECTOR_ON_CHILD_EXIT)", "exec mode"],
    ),
    (
        "env-kill-grace-no-command",
        ["--lock", "x"],
        {"ELECTOR_KILL_GRACE": "1s"},
        ["--kill-grace (set by ELECTOR_KILL_GRACE)", "exec mode"],
    ),
    (
        "exec-with-locks-file",
        ["--lock", "a", "--locks-file", "{bad-locks}", "--", "true"],
        {},
        ["--locks-file"],
    ),
]

OTHER_ROWS: list[Row] = [
    (
        "status-port-zero",
        ["status", "--lock", "x", "--redis-url", "redis://h:0"],
        {},
        ["--redis-url", "port 0"],
    ),
    ("status-db-text", ["status", "--lock", "x", "--redis-url", f"redis://:{PASSWORD}@h/abc"], {}, [":***@"]),
    ("status-lock", ["status", "--lock", "a b"], {}, ["--lock", "'a b'"]),
    ("status-timeout", ["status", "--lock", "x", "--timeout", "0s"], {}, ["--timeout", "positive"]),
    ("status-env-lock", ["status"], {"ELECTOR_LOCK": "{x}"}, ["--lock (set by ELECTOR_LOCK)"]),
    ("handoff-to", ["handoff", "--lock", "x", "--to", " b"], {}, ["--to", "surrounding blanks"]),
    ("handoff-window", ["handoff", "--lock", "x", "--window", "1h"], {}, ["--window", "at most"]),
    ("handoff-url", ["handoff", "--lock", "x", "--redis-url", "redis://h?db=1&db=1"], {}, ["more than once"]),
]


def _fill(args: list[str], files: dict[str, str]) -> list[str]:
    filled = []
    for arg in args:
        text = arg
        for name, path in files.items():
            text = text.replace("{" + name + "}", path)
        filled.append(text)
    return filled


def _invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(cli, args, env={"ELECTOR_REDIS_URL": PASSWORD_URL, **env}, prog_name="elector")


def _check(result: Result, fragments: list[str], *, command: str) -> None:
    message = " ".join(result.stderr.split())
    assert result.exit_code == 2, f"exit {result.exit_code}: {result.output}"
    assert result.stdout == ""
    assert f"Usage: elector {command}" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert PASSWORD not in result.output
    assert "Traceback" not in result.output


def test_the_table_is_big_enough() -> None:
    assert len(RUN_ROWS) + len(OTHER_ROWS) >= 40
    assert len({row[0] for row in RUN_ROWS + OTHER_ROWS}) == len(RUN_ROWS) + len(OTHER_ROWS)


@pytest.mark.parametrize(
    ("args", "env", "fragments"), [pytest.param(*row[1:], id=row[0]) for row in RUN_ROWS]
)
def test_bad_run_input_exits_2_naming_the_setting(
    no_daemon: list[Settings],
    files: dict[str, str],
    args: list[str],
    env: dict[str, str],
    fragments: list[str],
) -> None:
    result = _invoke(["run", *_fill(args, files)], env)
    _check(result, fragments, command="run")
    assert no_daemon == [], "nothing may start with a bad setting"


@pytest.mark.parametrize(
    ("args", "env", "fragments"), [pytest.param(*row[1:], id=row[0]) for row in OTHER_ROWS]
)
def test_bad_status_and_handoff_input_exits_2_naming_the_setting(
    args: list[str], env: dict[str, str], fragments: list[str]
) -> None:
    _check(_invoke(args, env), fragments, command=args[0])


def test_a_valid_table_neighbour_starts(no_daemon: list[Settings]) -> None:
    """The checks refuse the bad rows, not their good neighbours."""
    for url in ("redis://h", "redis://h:6379/", "rediss://u:p@h:6380/15", "unix:///run/r.sock?db=2",
                "redis://[::1]:6379/0", "redis://redis_1:6379/0"):  # fmt: skip
        result = _invoke(["run", "--lock", "x", "--redis-url", url, "--ttl", "24h"], {})
        assert result.exit_code == 0, result.output
    assert [settings.redis.url for settings in no_daemon][-1] == "redis://redis_1:6379/0"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTOR_") or k == "ELECTOR_REDIS_SERVER"}
    return {**env, "ELECTOR_REDIS_URL": PASSWORD_URL, **extra}


@pytest.mark.parametrize(
    ("args", "env", "fragments"),
    [
        pytest.param(["run", "--lock", "x", "--ttl", "25h"], {}, ["--ttl", "24h"], id="ttl"),
        pytest.param(
            ["run", "--lock", "x"], {"ELECTOR_REDIS_URL": f"redis://:{PASSWORD}@h:0"}, ["port 0"], id="url"
        ),
        pytest.param(["run"], {"ELECTOR_LOCK": "{x}"}, ["--lock (set by ELECTOR_LOCK)"], id="env-lock"),
        pytest.param(["run", "--lock", "x", "--on-child-exit", "exit"], {}, ["exec mode"], id="conflict"),
        pytest.param(["status", "--lock", "x", "--redis-url", "redis://h/x"], {}, ["database"], id="status"),
    ],
)
def test_the_installed_command_exits_2_on_stderr(
    args: list[str], env: dict[str, str], fragments: list[str]
) -> None:
    assert ELECTOR_SCRIPT.is_file(), f"{ELECTOR_SCRIPT} is not installed: run `pip install -e .[dev]`"
    completed = subprocess.run(
        [str(ELECTOR_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=_clean_env(**env),
        check=False,
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stdout == ""
    message = " ".join(completed.stderr.split())
    for fragment in fragments:
        assert fragment in message
    assert PASSWORD not in completed.stderr
    assert "Traceback" not in completed.stderr
