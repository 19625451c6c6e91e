from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio
import redis.asyncio.retry
import redis.backoff

from elector.testing.redis_server import RedisServerProcess
from tests.support.lateness import loop_lateness
from tests.support.tcp_proxy import TcpProxy

ClientFactory = Callable[..., redis.asyncio.Redis]


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """redis-py clients without retries (so failures are not hidden), closed after the test."""
    clients: list[redis.asyncio.Redis] = []

    def make(url: str, socket_timeout: float = 2.0) -> redis.asyncio.Redis:
        retry = redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)
        client = redis.asyncio.Redis.from_url(
            url, retry=retry, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def _raw(proxy: TcpProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def test_forwards_redis_commands(tcp_proxy: TcpProxy, make_client: ClientFactory) -> None:
    assert tcp_proxy.url == f"redis://127.0.0.1:{tcp_proxy.port}/0"
    client = make_client(tcp_proxy.url)
    assert await client.set("k", "v")
    assert await client.get("k") == b"v"
    assert tcp_proxy.connections_accepted == 1
    assert tcp_proxy.active_connections == 1


async def test_cut_fails_fast_with_connection_error(tcp_proxy: TcpProxy, make_client: ClientFactory) -> None:
    client = make_client(tcp_proxy.url)
    assert await client.ping()
    tcp_proxy.cut()
    started = time.monotonic()
    async with loop_lateness() as lateness:
        with pytest.raises(redis.ConnectionError):
            await client.ping()  # the pooled connection was reset
        with pytest.raises(redis.ConnectionError):
            await client.ping()  # a new connection is accepted, then reset at once
    # Fast: no timeout waited for. The two failures' wake-ups may each be as late as the loop was
    # measured to run (a loaded machine).
    assert time.monotonic() - started < 0.5 + 2 * lateness.worst_s, lateness
    assert tcp_proxy.connections_accepted == 2
    assert tcp_proxy.active_connections == 0
    tcp_proxy.restore()
    assert await make_client(tcp_proxy.url).ping()


async def test_cut_sends_rst_not_fin(tcp_proxy: TcpProxy) -> None:
    reader, writer = await _raw(tcp_proxy)
    writer.write(b"PING\r\n")
    assert await reader.readline() == b"+PONG\r\n"
    tcp_proxy.cut()
    with pytest.raises(ConnectionResetError):
        await reader.read(100)
    writer.close()


async def test_blackhole_times_out_instead_of_failing_fast(
    tcp_proxy: TcpProxy, make_client: ClientFactory
) -> None:
    client = make_client(tcp_proxy.url, socket_timeout=0.3)
    assert await client.ping()
    tcp_proxy.blackhole()
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        await client.ping()
    assert time.monotonic() - started >= 0.29
    with pytest.raises(redis.TimeoutError):
        await make_client(tcp_proxy.url, socket_timeout=0.3).ping()  # new connections too
    tcp_proxy.restore()
    assert await make_client(tcp_proxy.url).ping()
    assert await client.ping()  # redis-py reconnects after its timeout


async def test_restore_revives_a_blackholed_connection(tcp_proxy: TcpProxy) -> None:
    reader, writer = await _raw(tcp_proxy)
    tcp_proxy.blackhole()
    writer.write(b"PING lost\r\n")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readline(), 0.2)  # no answer, and no FIN or RST either
    tcp_proxy.restore()
    writer.write(b"PING again\r\n")
    assert await asyncio.wait_for(reader.readline(), 2) == b"$5\r\n"  # the lost PING stays lost
    assert await reader.readline() == b"again\r\n"
    writer.close()


async def test_blackhole_hold_delivers_late(
    tcp_proxy: TcpProxy, redis_url: str, make_client: ClientFactory
) -> None:
    client = make_client(tcp_proxy.url, socket_timeout=0.3)
    assert await client.ping()
    tcp_proxy.blackhole(hold=True)
    with pytest.raises(redis.TimeoutError):
        await client.set("late", "write")
    direct = make_client(redis_url)
    assert await direct.get("late") is None
    tcp_proxy.restore()
    for _ in range(100):  # the held SET (and redis-py's close) arrive after restore()
        if await direct.get("late") is not None:
            break
        await asyncio.sleep(0.01)
    assert await direct.get("late") == b"write"


async def test_delay_adds_latency(tcp_proxy: TcpProxy, make_client: ClientFactory) -> None:
    client = make_client(tcp_proxy.url)
    assert await client.ping()
    # The delays are lower bounds on any machine. The upper bounds allow each of the proxy's
    # timed forwards to fire as late as the loop was measured to run meanwhile (a loaded machine).
    tcp_proxy.delay(0.2)
    started = time.monotonic()
    async with loop_lateness() as lateness:
        assert await client.ping()
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 1.0 + 2 * lateness.worst_s, lateness  # 0.2 s each way
    tcp_proxy.delay(0.3, direction="upstream")
    tcp_proxy.delay(0, direction="downstream")
    started = time.monotonic()
    async with loop_lateness() as lateness:
        assert await client.ping()
    assert 0.3 <= time.monotonic() - started < 0.55 + 2 * lateness.worst_s, lateness  # one way only
    tcp_proxy.restore()
    started = time.monotonic()
    async with loop_lateness() as lateness:
        assert await client.ping()
    assert time.monotonic() - started < 0.2 + 2 * lateness.worst_s, lateness


async def test_redis_crash_reaches_the_client(
    tcp_proxy: TcpProxy, redis_server: RedisServerProcess, make_client: ClientFactory
) -> None:
    client = make_client(tcp_proxy.url)
    assert await client.ping()
    redis_server.kill()
    with pytest.raises(redis.ConnectionError):
        await client.ping()
    redis_server.restart_empty()
    assert await client.ping()


async def test_stop_leaves_no_tasks(redis_server: RedisServerProcess, make_client: ClientFactory) -> None:
    proxy = await TcpProxy("127.0.0.1", redis_server.port).start()
    client = make_client(proxy.url)
    assert await client.ping()
    proxy.blackhole(hold=True)
    _, writer = await _raw(proxy)
    writer.write(b"PING\r\n")
    await asyncio.sleep(0.05)
    await proxy.stop()
    await proxy.stop()  # idempotent
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert proxy.active_connections == 0
    writer.close()
