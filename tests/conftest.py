"""Shared fixtures: a private redis-server per test, and a fault-injecting TCP proxy in front of it.

Helpers live in tests/support/ (``from tests.support.tcp_proxy import TcpProxy``); keep this
file small.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from elector.testing.redis_server import RedisServerNotFound, RedisServerProcess, find_redis_server
from tests.faults.options import add_options as add_fault_options
from tests.support.previous_release import PreviousRelease, PreviousReleaseError, build_previous_release
from tests.support.tcp_proxy import TcpProxy


def pytest_addoption(parser: pytest.Parser) -> None:
    """The fault suite's options: here, since pytest reads options only from the first conftests."""
    add_fault_options(parser)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fail the whole run (not skip) if no redis-server is available: the tests need a real one."""
    try:
        find_redis_server()
    except RedisServerNotFound as exc:
        pytest.exit(f"Cannot run the tests: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture
def redis_server() -> Iterator[RedisServerProcess]:
    """A fresh, empty redis-server on a free port, stopped (by PID) after the test."""
    with RedisServerProcess() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServerProcess) -> str:
    return redis_server.url


@pytest.fixture
async def tcp_proxy(redis_server: RedisServerProcess) -> AsyncIterator[TcpProxy]:
    """A started TcpProxy in front of `redis_server`; connect to `tcp_proxy.url` to get faults."""
    proxy = TcpProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.fixture(scope="session")
def previous_release() -> PreviousRelease:
    """The last release's `elector` in a venv of its own, built from git history on first use."""
    try:
        return build_previous_release(Path(__file__).resolve().parent.parent)
    except PreviousReleaseError as exc:  # an error, never a skip: see tests/support/previous_release.py
        problem = str(exc)
    pytest.fail(problem, pytrace=False)
