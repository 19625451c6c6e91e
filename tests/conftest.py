"""The fixtures shared by the whole suite, in one place. Plain helpers live in tests/support/.

Every test is in one of two tiers, `check` or `integration`, decided by the fixtures it uses: a
fixture that starts or finds a real component says so with `@needs(...)` (tests/support/tiers.py).

- Redis: `redis_server` (a fresh one per test), `redis_binary` and `tls_redis_binary` (for a test
  that starts its own server), `redis_url`, `module_redis_server` (one per
  module: tests on it use locks of their own), `raw` (an async client), `plain` (a sync client),
  `seeded` (`plain`, with the lock "jobs" already used: no new-lock quiet period), `tcp_proxy`.
- Daemons: `daemon` starts `elector run` processes on `redis_url` and stops them after the test.
- Elections on the in-memory fake backend: `store`, `start`, `runs` (tests/support/election.py).
- Sentinel: `deployment`, a fresh master, two replicas and three sentinels (it is not shared:
  every test that uses one fails it over or kills its master).
- The previous release, built once per session.

A module that needs a variant overrides the fixture by name, building on this one
(`def raw(raw): seed...; return raw`).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from elector.testing.redis_server import RedisServerNotFound, RedisServerProcess, find_redis_server
from tests.election.fake_backend import FakeStore
from tests.faults.options import add_options as add_fault_options
from tests.support.daemon import DaemonStarter
from tests.support.election import CandidateStarter, cancel_all
from tests.support.previous_release import PreviousRelease, PreviousReleaseError, build_previous_release
from tests.support.seed import seed_used_lock
from tests.support.sentinel import SentinelSet
from tests.support.tcp_proxy import TcpProxy
from tests.support.tiers import CHECK, PIP, REDIS, needs
from tests.support.tiers import register as register_tiers
from tests.support.timeout_backstop import (
    make_report_dir,
    pytest_runtest_protocol,  # noqa: F401 (a hook)
    remove_report_dir_if_empty,
    reports,
)
from tests.support.tls import NoTlsRedisServer, find_tls_redis_server

#: The backstop's report directory, if this process made it (tests/support/timeout_backstop.py).
_BACKSTOP_DIR = pytest.StashKey[str | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """The fault suite's options: here, since pytest reads options only from the first conftests."""
    add_fault_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """CPython 3.11 can leave its AST builder's recursion depth wrong after an error inside it
    (python/cpython#106905; a timeout's signal can land there), after which pytest's own
    traceback formatting fails with an INTERNALERROR that hides the test's failure (seen here on
    3.11.7, pytest-dev/pytest#10874). Native tracebacks parse no source: on 3.11, unless the user
    chose a style, they are used, and a failure is reported rather than lost."""
    if sys.version_info[:2] == (3, 11) and config.option.tbstyle == "auto":
        config.option.tbstyle = "native"
    # Before pytest-xdist starts its workers: they inherit the directory.
    config.stash[_BACKSTOP_DIR] = make_report_dir()
    register_tiers(config, repository=Path(__file__).resolve().parent.parent)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the timeout backstop wrote before it ended a worker (xdist shows no worker's stderr)."""
    for name, text in reports():
        terminalreporter.section(f"timeout backstop report {name}", sep="-")
        terminalreporter.write(text)


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_report_dir_if_empty(config.stash.get(_BACKSTOP_DIR, None))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fail the whole run (not skip) if no redis-server is available: the integration tests need a
    real one. The check tier (`-m check`) needs none."""
    if session.config.option.markexpr == CHECK:
        return
    try:
        find_redis_server()
    except RedisServerNotFound as exc:
        pytest.exit(f"Cannot run the tests: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)


def _found(find: Callable[[], str], missing: type[Exception]) -> str:
    """What `find()` found; else the test fails with its message, which says how to get it."""
    try:
        return find()
    except missing as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
@needs(REDIS)
def redis_binary() -> str:
    """The redis-server a test starts itself (`RedisServerProcess(binary=redis_binary)`)."""
    return _found(find_redis_server, RedisServerNotFound)


@pytest.fixture(scope="session")
@needs(REDIS)
def tls_redis_binary() -> str:
    """A redis-server built with TLS, for a test that starts its own (`TlsRedis(binary=...)`)."""
    return _found(find_tls_redis_server, NoTlsRedisServer)


@pytest.fixture
@needs(REDIS)
def redis_server() -> Iterator[RedisServerProcess]:
    """A fresh, empty redis-server on a free port, stopped (by PID) after the test."""
    with RedisServerProcess() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServerProcess) -> str:
    return redis_server.url


@pytest.fixture(scope="module")
@needs(REDIS)
def module_redis_server() -> Iterator[RedisServerProcess]:
    """One redis-server for a whole module; its tests must use keys (locks) of their own."""
    with RedisServerProcess() as server:
        yield server


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An async client of `redis_server`, for looking at and tampering with the keys."""
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def plain(redis_url: str) -> Iterator[redis.Redis]:
    """A sync client of `redis_server` (for tests that drive daemons from threads)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    yield client
    client.close()


@pytest.fixture
def seeded(plain: redis.Redis) -> redis.Redis:
    """`plain`, with the lock "jobs" marked as used: no new-lock quiet period."""
    seed_used_lock(plain)
    return plain


@pytest.fixture
def daemon(redis_url: str, tmp_path: Path) -> Iterator[DaemonStarter]:
    """`daemon("pod-a", *extra_args, lock=..., ttl=...)`: a started `elector run`, serving HTTP."""
    starter = DaemonStarter(redis_url=redis_url, log_dir=tmp_path)
    yield starter
    starter.stop_all()


@pytest.fixture
def store() -> FakeStore:
    """The in-memory lock of the state-machine tests (looptime: virtual time)."""
    return FakeStore()


@pytest.fixture
async def start(store: FakeStore) -> AsyncIterator[CandidateStarter]:
    """`start("a", priority=..., ttl_s=...)`: an election on `store`, cancelled after the test."""
    starter = CandidateStarter(store)
    yield starter
    await starter.cancel_all()


@pytest.fixture
async def runs() -> AsyncIterator[list[Any]]:
    """A list to append objects with a running `.task` to: each is cancelled after the test."""
    started: list[Any] = []
    yield started
    await cancel_all(run.task for run in started)


@pytest.fixture
@needs(REDIS)
def deployment() -> Iterator[SentinelSet]:
    """A fresh Sentinel deployment: a master, two replicas, three sentinels."""
    with SentinelSet(replicas=2) as sentinels:
        yield sentinels


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
@needs(PIP)
def previous_release() -> PreviousRelease:
    """The last release's `elector` in a venv of its own, built from git history on first use."""
    try:
        return build_previous_release(Path(__file__).resolve().parent.parent)
    except PreviousReleaseError as exc:  # an error, never a skip: see tests/support/previous_release.py
        problem = str(exc)
    pytest.fail(problem, pytrace=False)
