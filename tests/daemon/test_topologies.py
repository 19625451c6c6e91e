"""`elector run` on a Redis Cluster (--redis-cluster) and on a Redlock set (--redlock-url x N).

Real daemons, real servers: one leader at a time, a handover on SIGTERM with a higher fencing
token, and the settings that make no sense refused at start-up with exit code 2.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from elector.backend.lua.lease import LockKeys
from elector.cli.main import cli
from elector.testing.redis_server import RedisServerProcess
from tests.support.cluster import LocalCluster
from tests.support.daemon import DaemonProcess, wait_until

pytestmark = pytest.mark.timeout(90)


@contextlib.contextmanager
def daemons(*daemons: DaemonProcess) -> Iterator[list[DaemonProcess]]:
    started = [d.start() for d in daemons]
    try:
        for d in started:
            d.wait_http()
        yield started
    finally:
        for d in started:
            d.stop()


def _leaders(group: list[DaemonProcess]) -> list[DaemonProcess]:
    return [d for d in group if d.is_leader()]


def _handover(group: list[DaemonProcess]) -> tuple[int, int]:
    """The first leader's token, and the next leader's after SIGTERM to the first."""
    wait_until(lambda: len(_leaders(group)) == 1, timeout_s=15)
    first = _leaders(group)[0]
    first_view = first.leader()
    assert first_view is not None
    first_token = int(first_view["fencing_token"])
    first.signal(signal.SIGTERM)
    assert first.wait() == 0, first.logs_text()
    rest = [d for d in group if d is not first]
    wait_until(lambda: len(_leaders(rest)) == 1, timeout_s=10)
    second_view = _leaders(rest)[0].leader()
    assert second_view is not None
    return first_token, int(second_view["fencing_token"])


def test_daemons_on_a_redlock_set_hand_over_with_a_higher_token(tmp_path: Path, redis_binary: str) -> None:
    servers = [RedisServerProcess(binary=redis_binary).start() for _ in range(3)]
    try:
        urls = [arg for s in servers for arg in ("--redlock-url", s.url)]
        group = [
            DaemonProcess(
                redis_url=None, identity=f"r{i}", log_dir=tmp_path, ttl="2s", extra_args=tuple(urls)
            )
            for i in range(2)
        ]
        with daemons(*group):
            first_token, second_token = _handover(group)
            assert second_token > first_token
            # The grant lives on a majority of the servers, under the same value.
            holders = []
            for server in servers:
                with redis.Redis.from_url(server.url) as client:
                    holders.append(client.get(LockKeys("jobs").lease))
            assert sum(1 for value in holders if value is not None) >= 2, holders
            started = [line for line in group[1].log_lines() if line.get("event") == "started"]
            assert started and started[0]["topology"] == "redlock", started
            assert len(started[0]["redis"]) == 3
    finally:
        for server in servers:
            server.stop()


def test_daemons_on_a_redis_cluster_hand_over_with_a_higher_token(tmp_path: Path, redis_binary: str) -> None:
    with LocalCluster(masters=3, binary=redis_binary) as cluster:
        group = [
            DaemonProcess(
                redis_url=cluster.startup_url,
                identity=f"c{i}",
                log_dir=tmp_path,
                ttl="2s",
                lock=lock,
                extra_args=("--redis-cluster",),
            )
            for i in range(2)
            for lock in ("jobs",)
        ]
        with daemons(*group):
            first_token, second_token = _handover(group)
            assert second_token > first_token
            started = [line for line in group[1].log_lines() if line.get("event") == "started"]
            assert started and started[0]["topology"] == "cluster", started


@pytest.mark.parametrize(
    ("args", "setting", "message"),
    [
        (["--redlock-url", "redis://a:1", "--redlock-url", "redis://b:1"], "--redlock-url", "odd number"),
        (
            ["--redlock-url", "redis://a:1", "--redlock-url", "redis://b:1", "--redlock-url", "redis://a:1"],
            "--redlock-url",
            "twice",
        ),
        (
            ["--redlock-url", "redis://a:1", "--redlock-url", "redis://b:1", "--redlock-url", "ftp://c:1"],
            "--redlock-url",
            "redis://",
        ),
        (
            ["--redis-url", "redis://x:1", *[a for h in "abc" for a in ("--redlock-url", f"redis://{h}:1")]],
            "--redlock-url",
            "replaces --redis-url",
        ),
        (
            ["--priority", "5", *[a for h in "abc" for a in ("--redlock-url", f"redis://{h}:1")]],
            "--priority",
            "not supported",
        ),
        (
            ["--redis-cluster", *[a for h in "abc" for a in ("--redlock-url", f"redis://{h}:1")]],
            "--redis-cluster",
            "not a cluster",
        ),
        (["--redis-cluster", "--redis-url", "unix:///tmp/r.sock"], "--redis-cluster", "redis://"),
        (["--redis-cluster", "--min-replicas-ack", "1"], "--redis-cluster", "not supported"),
        (
            ["--min-replicas-ack", "1", *[a for h in "abc" for a in ("--redlock-url", f"redis://{h}:1")]],
            "--redlock-url",
            "not supported",
        ),
        (
            ["--redis-cluster", "--redis-url", "redis+sentinel://s1:26379/main"],
            "--redis-cluster",
            "redis://",
        ),
    ],
)
def test_topology_settings_that_make_no_sense_exit_2_naming_the_setting(
    args: list[str], setting: str, message: str
) -> None:
    result = CliRunner().invoke(cli, ["run", "--lock", "jobs", *args], env={})
    assert result.exit_code == 2, result.output
    assert setting in result.output and message in result.output, result.output


def test_redlock_urls_from_the_environment_are_split_on_spaces(tmp_path: Path) -> None:
    env = {"ELECTOR_REDLOCK_URL": "redis://a:1 redis://b:1"}
    result = CliRunner().invoke(cli, ["run", "--lock", "jobs"], env=env)
    assert result.exit_code == 2 and "got 2" in result.output, result.output
