"""No secret anywhere: Redis passwords (URL or file) and the lease's owner token.

Real daemons run against a password-protected redis-server with the password in the URL or in a
password file, and with errors provoked (a wrong password, an unreachable port); their logs in
both formats, /metrics, /leader and `elector status` output are searched for the password. A
leading daemon's secret owner token (read from the lease in Redis) must not show up in its
/leader, /metrics or debug logs either; the token has 128 bits from `secrets`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from elector.backend import RedisLeaseBackend, RedisSettings, make_client, redis_lease
from elector.backend.lua.lease import LockKeys
from elector.lease import Granted
from elector.testing.redis_server import RedisServerProcess, free_tcp_port
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock, seed_used_lock_async
from tests.support.tiers import REDIS, needs

PASSWORD = "Sup3r-s3cret-pw"
WRONG = "wr0ng-s3cret-pw"
LOCK = "jobs"


@pytest.fixture
@needs(REDIS)
def protected() -> Iterator[RedisServerProcess]:
    # Protected after start: RedisServerProcess checks that the server is up with a bare PING.
    with RedisServerProcess() as server:
        client = redis.Redis(port=server.port)
        seed_used_lock(client, LOCK)
        client.config_set("requirepass", PASSWORD)
        client.close()
        yield server


def _url(port: int, password: str) -> str:
    return f"redis://:{password}@127.0.0.1:{port}/0"


def _everything(daemon: DaemonProcess) -> str:
    """Everything the daemon shows: its log, /leader, /metrics, /healthz and /readyz."""
    shown = [daemon.logs_text()]
    for path in ("/leader", "/metrics", "/healthz", "/readyz"):
        shown.append(daemon.get(path)[1])
    return "\n".join(shown)


def _run_briefly(daemon: DaemonProcess, *, seconds: float) -> str:
    try:
        daemon.start().wait_http()
        time.sleep(seconds)
        return _everything(daemon)
    finally:
        daemon.stop()


@pytest.mark.parametrize("log_format", ["json", "console"])
@pytest.mark.parametrize(
    "case",
    [
        "url-password-leading",
        "file-password-leading",
        "wrong-url-password",
        "wrong-file-password",
        "unreachable",
    ],
)
def test_no_password_in_logs_metrics_or_http(
    protected: RedisServerProcess, tmp_path: Path, case: str, log_format: str
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(WRONG + "\n" if case == "wrong-file-password" else PASSWORD + "\n")
    url = {
        "url-password-leading": _url(protected.port, PASSWORD),
        "file-password-leading": _url(protected.port, "url-password-is-ignored"),
        "wrong-url-password": _url(protected.port, WRONG),
        "wrong-file-password": _url(protected.port, "url-password-is-ignored"),
        "unreachable": _url(free_tcp_port(), PASSWORD),
    }[case]
    extra = ["--log-level", "debug", "--log-format", log_format]
    if "file" in case:
        extra += ["--redis-password-file", str(password_file)]
    daemon = DaemonProcess(
        redis_url=url, identity=f"{case}-{log_format}", lock=LOCK, log_dir=tmp_path, extra_args=tuple(extra)
    )
    daemon.command.remove("--log-format")  # DaemonProcess asks for json; `extra` decides
    daemon.command.remove("json")
    shown = _run_briefly(daemon, seconds=1.5)
    if case.endswith("leading"):
        assert '"is_leader": true' in shown, shown[-2000:]
    else:
        assert "redis_unreachable" in shown, shown[-2000:]  # the error was provoked and logged
    for secret in (PASSWORD, WRONG, "url-password-is-ignored"):
        assert secret not in shown, f"{secret!r} shown by the daemon ({case}, {log_format})"


@pytest.mark.parametrize("password", [PASSWORD, WRONG])
@pytest.mark.parametrize("as_json", [False, True])
def test_no_password_in_status_output(protected: RedisServerProcess, password: str, as_json: bool) -> None:
    command = [
        sys.executable,
        "-m",
        "elector",
        "status",
        "--lock",
        LOCK,
        "--redis-url",
        _url(protected.port, password),
    ]
    if as_json:
        command.append("--json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTOR_")}
    completed = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env, check=False)
    assert completed.returncode == (0 if password == PASSWORD else 1), completed.stderr
    output = completed.stdout + completed.stderr
    assert PASSWORD not in output and WRONG not in output
    if password == WRONG:
        assert "***" in output or "refused" in output.lower()


async def test_no_password_in_backend_exceptions(protected: RedisServerProcess) -> None:
    for password, port in ((WRONG, protected.port), (PASSWORD, free_tcp_port())):
        client = make_client(RedisSettings(url=_url(port, password), request_timeout_s=0.5))
        backend = RedisLeaseBackend(client, lock=LOCK)
        try:
            with pytest.raises(Exception) as info:  # noqa: PT011 - any error; its text is checked
                await backend.acquire("a", ttl_ms=1000)
        finally:
            await client.aclose()
        texts = [str(info.value), repr(info.value)]
        cause = info.value.__cause__
        while cause is not None:  # the chained client exception is logged with tracebacks too
            texts += [str(cause), repr(cause)]
            cause = cause.__cause__
        for text in texts:
            assert password not in text


def test_the_owner_token_is_never_shown(redis_server: RedisServerProcess, tmp_path: Path) -> None:
    client = redis.Redis(port=redis_server.port)
    seed_used_lock(client, LOCK)
    daemon = DaemonProcess(
        redis_url=redis_server.url,
        identity="leader",
        lock=LOCK,
        log_dir=tmp_path,
        extra_args=("--log-level", "debug"),
    )
    try:
        daemon.start().wait_http()
        wait_until(daemon.is_leader, timeout_s=10)
        value = json.loads(client.get(LockKeys(LOCK).lease) or b"{}")
        token = value["token"]
        time.sleep(1.0)  # several renewals, each logged at DEBUG
        shown = _everything(daemon)
    finally:
        daemon.stop()
        client.close()
    assert re.fullmatch(r"[0-9a-f]{32}", token), token
    assert '"renewed"' in shown  # the debug lines were there to search
    assert token not in shown
    assert token[:12] not in shown  # not even a prefix


async def test_the_owner_token_has_128_bits_from_secrets(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[tuple[int, str]] = []
    real = redis_lease.secrets.token_hex

    def spy(nbytes: int | None = None) -> str:
        token = real(nbytes)
        drawn.append((nbytes or 0, token))
        return token

    monkeypatch.setattr(redis_lease.secrets, "token_hex", spy)
    client = make_client(RedisSettings(url=redis_url, request_timeout_s=1.0))
    try:
        import redis.asyncio

        raw = redis.asyncio.Redis.from_url(redis_url)
        await seed_used_lock_async(raw, LOCK)
        await raw.aclose()
        backend = RedisLeaseBackend(client, lock=LOCK)
        tokens = set()
        for _ in range(20):
            result = await backend.acquire("a", ttl_ms=5000)
            assert isinstance(result, Granted)
            assert await backend.release(result.lease)
            tokens.add(json.loads(result.lease.value)["token"])
    finally:
        await client.aclose()
    # The backend's instance nonce (8 bytes, drawn once: it tells two processes of one identity
    # apart in the candidate registry, and is no secret) comes first; then one owner token of
    # 16 bytes = 128 bits per grant.
    assert [nbytes for nbytes, _ in drawn] == [8] + [16] * 20
    assert drawn[0][1] == backend.nonce
    assert tokens == {token for _, token in drawn[1:]}  # the stored token is exactly the drawn one
    secret = json.loads(result.lease.value)["token"]
    assert secret not in repr(result.lease) and secret not in str(result)
