"""`elector status` against a real, private redis-server.

The tests are synchronous: `elector status` runs its own event loop (asyncio.run), so leases
are set up with `asyncio.run(...)` and plain redis-py calls before invoking the command.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from elector.backend import RedisLeaseBackend, RedisSettings, make_client
from elector.cli import cli
from elector.lease import AcquireResult, Granted, Lease, QuietPeriod
from elector.redis_server import free_tcp_port
from tests.support.seed import seed_used_lock

SECRET = "hunter2-not-for-output"
JSON_KEYS = {
    "lock",
    "held",
    "holder",
    "fencing_token",
    "remaining_ms",
    "unrecognised_value",
    "last_fencing_token",
    "quiet_period_remaining_ms",
}


@pytest.fixture(autouse=True)
def _no_elector_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in os.environ:
        if key.startswith("ELECTOR_") and key != "ELECTOR_REDIS_SERVER":
            monkeypatch.delenv(key)


@pytest.fixture
def plain(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    yield client
    client.close()


def status(url: str, lock: str, *extra: str) -> Result:
    return CliRunner().invoke(
        cli, ["status", "--redis-url", url, "--lock", lock, *extra], prog_name="elector"
    )


def status_json(url: str, lock: str) -> dict[str, object]:
    result = status(url, lock, "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    assert set(document) == JSON_KEYS
    return document


def acquire(url: str, lock: str, identity: str, *, ttl_ms: int) -> AcquireResult:
    async def go() -> AcquireResult:
        client = make_client(RedisSettings(url=url))
        try:
            return await RedisLeaseBackend(client, lock=lock).acquire(identity, ttl_ms=ttl_ms)
        finally:
            await client.aclose()

    return asyncio.run(go())


def grant(url: str, plain: redis.Redis, lock: str, identity: str, *, ttl_ms: int = 30_000) -> Lease:
    # A new lock has no fencing counter: its first acquire is a quiet period (by design). Seed it.
    seed_used_lock(plain, lock)
    result = acquire(url, lock, identity, ttl_ms=ttl_ms)
    assert isinstance(result, Granted), result
    return result.lease


def test_free_lock(redis_url: str) -> None:
    result = status(redis_url, "orders")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "lock orders: free"
    assert "fencing counter: missing (a new lock, or Redis lost its data)" in result.stdout
    assert "quiet period" not in result.stdout
    assert status_json(redis_url, "orders") == {
        "lock": "orders",
        "held": False,
        "holder": None,
        "fencing_token": None,
        "remaining_ms": None,
        "unrecognised_value": False,
        "last_fencing_token": None,
        "quiet_period_remaining_ms": 0,
    }


def test_held_lock_shows_holder_token_and_ttl_but_never_the_secret(
    redis_url: str, plain: redis.Redis
) -> None:
    lease = grant(redis_url, plain, "orders", "pod-a", ttl_ms=30_000)
    secret_token = json.loads(lease.value)["token"]
    assert isinstance(secret_token, str) and len(secret_token) >= 16

    result = status(redis_url, "orders")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"lock orders: held by pod-a (fencing token {lease.fencing_token}), expires in ")
    remaining_s = float(first.split("expires in ")[1].split("s unless renewed")[0])
    assert 25.0 < remaining_s <= 30.0
    assert f"fencing counter: {lease.fencing_token} (the next grant gets more)" in result.stdout
    assert secret_token not in result.output

    document = status_json(redis_url, "orders")
    assert document["lock"] == "orders"
    assert document["held"] is True
    assert document["holder"] == "pod-a"
    assert document["fencing_token"] == lease.fencing_token
    assert document["last_fencing_token"] == lease.fencing_token
    assert document["unrecognised_value"] is False
    assert document["quiet_period_remaining_ms"] == 0
    remaining_ms = document["remaining_ms"]
    assert isinstance(remaining_ms, int) and 25_000 < remaining_ms <= 30_000
    assert secret_token not in json.dumps(document)
    assert "token" not in document


def test_status_does_not_disturb_the_lease(redis_url: str, plain: redis.Redis) -> None:
    lease = grant(redis_url, plain, "orders", "pod-a")
    before = plain.get("elector:{orders}:lease")
    assert status(redis_url, "orders").exit_code == 0
    assert plain.get("elector:{orders}:lease") == before == lease.value.encode()
    # Someone else still cannot take it: status did not contend or release.
    assert not isinstance(acquire(redis_url, "orders", "pod-b", ttl_ms=5_000), Granted)


def test_expired_lease_is_free_and_keeps_the_last_token(redis_url: str, plain: redis.Redis) -> None:
    lease = grant(redis_url, plain, "short", "pod-a", ttl_ms=600)
    assert status_json(redis_url, "short")["holder"] == "pod-a"
    time.sleep(0.8)
    document = status_json(redis_url, "short")
    assert (document["held"], document["holder"], document["remaining_ms"]) == (False, None, None)
    assert document["last_fencing_token"] == lease.fencing_token


def test_quiet_period_is_reported(redis_url: str) -> None:
    result = acquire(redis_url, "fresh", "pod-a", ttl_ms=20_000)
    assert isinstance(result, QuietPeriod)
    text = status(redis_url, "fresh")
    assert text.exit_code == 0, text.output
    assert "lock fresh: free" in text.stdout
    assert "quiet period: no grants for" in text.stdout
    document = status_json(redis_url, "fresh")
    quiet = document["quiet_period_remaining_ms"]
    assert isinstance(quiet, int) and 15_000 < quiet <= 20_000
    assert document["held"] is False


@pytest.mark.parametrize(
    "value",
    [b"garbage", b'{"identity": "x"}', b'{"identity": "x", "fencing_token": "7"}', b"[1, 2]", b"\xff\xfe"],
    ids=repr,
)
def test_value_not_written_by_elector(redis_url: str, plain: redis.Redis, value: bytes) -> None:
    plain.set("elector:{orders}:lease", value)
    result = status(redis_url, "orders")
    assert result.exit_code == 0, result.output
    assert "lock orders: held by a value elector did not write (no expiry)" in result.stdout
    document = status_json(redis_url, "orders")
    assert document["held"] is True
    assert document["unrecognised_value"] is True
    assert (document["holder"], document["fencing_token"]) == (None, None)
    assert document["remaining_ms"] is None


def test_value_not_written_by_elector_with_expiry(redis_url: str, plain: redis.Redis) -> None:
    plain.set("elector:{orders}:lease", "someone-else", px=20_000)
    result = status(redis_url, "orders")
    assert result.exit_code == 0
    assert "held by a value elector did not write (expires in " in result.stdout
    remaining = status_json(redis_url, "orders")["remaining_ms"]
    assert isinstance(remaining, int) and 15_000 < remaining <= 20_000


@pytest.mark.parametrize("as_json", [False, True])
def test_lease_key_of_the_wrong_type_exits_1(redis_url: str, plain: redis.Redis, as_json: bool) -> None:
    plain.hset("elector:{orders}:lease", "field", "value")
    result = status(redis_url, "orders", *(["--json"] if as_json else []))
    assert result.exit_code == 1
    if as_json:  # scripts get a parseable error on stdout too
        document = json.loads(result.stdout)
        assert document["lock"] == "orders" and "is not a string" in document["error"]
    else:
        assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert "is not a string: something other than elector wrote it" in result.stderr
    assert "elector:{" in result.stderr and "user_script" not in result.stderr
    assert "Traceback" not in result.output


def test_fencing_counter_not_a_number_exits_1(redis_url: str, plain: redis.Redis) -> None:
    plain.set("elector:{orders}:fencing", "twelve")
    result = status(redis_url, "orders")
    assert result.exit_code == 1
    assert "fencing counter elector:{orders}:fencing is not a number" in result.stderr


def test_unreachable_redis_exits_1_quickly() -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{free_tcp_port()}/0"
    started = time.monotonic()
    result = status(url, "orders")
    assert time.monotonic() - started < 5
    assert result.exit_code == 1
    assert "cannot reach Redis" in result.stderr
    assert SECRET not in result.output
    assert ":***@127.0.0.1:" in result.stderr


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections but never answers (a hung Redis)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.mark.parametrize(("timeout", "limit_s"), [("500ms", 0.45), ("1s", 0.95)])
def test_silent_redis_is_given_up_after_timeout(silent_port: int, timeout: str, limit_s: float) -> None:
    started = time.monotonic()
    result = status(f"redis://127.0.0.1:{silent_port}/0", "orders", "--timeout", timeout)
    elapsed = time.monotonic() - started
    assert result.exit_code == 1
    assert "did not answer in time" in result.stderr
    assert limit_s <= elapsed < limit_s + 3


def test_status_subprocess_unreachable_exits_1_without_the_password(silent_port: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTOR_")}
    url = f"redis://admin:{SECRET}@127.0.0.1:{silent_port}/0"
    started = time.monotonic()
    command = [sys.executable, "-m", "elector", "status", "--redis-url", url, "--lock", "orders"]
    completed = subprocess.run(
        [*command, "--timeout", "500ms"], capture_output=True, text=True, timeout=30, env=env, check=False
    )
    assert time.monotonic() - started < 5
    assert completed.returncode == 1
    assert completed.stdout == ""
    assert completed.stderr.startswith("error: redis://admin:***@127.0.0.1:")
    assert SECRET not in completed.stderr


def test_password_required(redis_url: str, plain: redis.Redis, tmp_path: Path) -> None:
    lease = grant(redis_url, plain, "orders", "pod-a")
    plain.config_set("requirepass", SECRET)
    host_port = redis_url.removeprefix("redis://")
    # No password: refused, exit 1.
    refused = status(redis_url, "orders")
    assert refused.exit_code == 1
    assert "error: " in refused.stderr
    # A wrong password in the URL: refused, and not echoed.
    wrong = status(f"redis://:wrong-{SECRET}@{host_port}", "orders")
    assert wrong.exit_code == 1
    assert "refused access" in wrong.stderr
    assert SECRET not in wrong.output
    # The right password from a file (overriding the URL's wrong one): read.
    password_file = tmp_path / "password"
    password_file.write_text(f"{SECRET}\n")
    ok = status(f"redis://:wrong@{host_port}", "orders", "--redis-password-file", str(password_file))
    assert ok.exit_code == 0, ok.output
    assert f"held by pod-a (fencing token {lease.fencing_token})" in ok.stdout
    assert SECRET not in ok.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--lock", "{x}"], "--lock"),
        (["--lock", "x", "--redis-url", f"redis://:{SECRET}@h:99999"], "invalid port"),
        (["--lock", "x", "--redis-url", "http://x"], "redis://"),
        (["--lock", "x", "--redis-password-file", "/nonexistent"], "/nonexistent"),
        (["--lock", "x", "--timeout", "abc"], "--timeout"),
        ([], "Missing option '--lock'"),
    ],
)
def test_invalid_status_settings_exit_2(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(cli, ["status", *args], prog_name="elector")
    assert result.exit_code == 2, result.output
    assert "Usage: elector status" in result.stderr
    assert fragment in result.stderr
    assert SECRET not in result.output


def test_zero_timeout_names_the_option() -> None:
    result = CliRunner().invoke(cli, ["status", "--lock", "x", "--timeout", "0"], prog_name="elector")
    assert result.exit_code == 2
    assert "--timeout" in result.stderr


def test_bad_url_query_option_is_an_invalid_setting() -> None:
    result = CliRunner().invoke(
        cli,
        ["status", "--lock", "x", "--redis-url", f"redis://127.0.0.1:{free_tcp_port()}/0?socket_timeout=abc"],
        prog_name="elector",
    )
    assert result.exit_code == 2
    assert "socket_timeout" in result.stderr


def test_url_query_cannot_lengthen_the_timeout(silent_port: int) -> None:
    started = time.monotonic()
    result = status(f"redis://127.0.0.1:{silent_port}/0?socket_timeout=3", "orders", "--timeout", "500ms")
    assert result.exit_code in (1, 2)
    assert time.monotonic() - started < 2
