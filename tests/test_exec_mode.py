"""Exec mode end to end: `elector run ... -- COMMAND` with real daemons, commands and Redis.

Each command is a `sh -c` script that records its pid, a grandchild's pid and a journal line
(identity and fencing token), so the tests can check which processes run where, and when.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock
from tests.support.tcp_proxy import TcpProxy

LEASE_KEY = "elector:{jobs}:lease"

#: Writes the journal line, keeps a grandchild (so `sh -c` is not exec-optimised away), waits.
SCRIPT = (
    'echo "start $ELECTOR_IDENTITY $ELECTOR_FENCING_TOKEN $ELECTOR_LEASE_TTL_MS $ELECTOR_LOCK" '
    ">> {dir}/journal; "
    "sleep 1000 & echo $! > {dir}/$ELECTOR_IDENTITY.grandchild; echo $$ > {dir}/$ELECTOR_IDENTITY.child; "
    "wait"
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # A zombie still answers kill(0); it no longer runs.
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def pids(directory: Path, identity: str) -> list[int]:
    found = []
    for kind in ("child", "grandchild"):
        path = directory / f"{identity}.{kind}"
        if path.exists() and path.read_text().strip():
            found.append(int(path.read_text()))
    return found


def journal(directory: Path) -> list[list[str]]:
    path = directory / "journal"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def seeded(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client)
    yield client
    client.close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    directory = tmp_path / "work"
    directory.mkdir()
    return directory


@pytest.fixture
def daemon(redis_url: str, tmp_path: Path, work: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def _start(
        identity: str,
        *extra_args: str,
        script: str = SCRIPT,
        command: tuple[str, ...] | None = None,
        url: str | None = None,
        ttl: str = "1s",
        env: dict[str, str] | None = None,
    ) -> DaemonProcess:
        argv = command if command is not None else ("sh", "-c", script.format(dir=work))
        process = DaemonProcess(
            redis_url=url or redis_url,
            identity=identity,
            log_dir=tmp_path,
            ttl=ttl,
            extra_args=(*extra_args, "--", *argv),
            env=env,
        ).start()
        started.append(process)
        process.wait_http()
        return process

    yield _start
    for process in started:
        process.stop()
    for path in work.glob("*.child"):
        for pid in pids(work, path.stem):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_command_runs_only_on_the_leader_with_the_lease_in_its_environment(daemon, seeded, work) -> None:
    a = daemon("a")
    wait_until(a.is_leader, timeout_s=3)
    b = daemon("b")
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=3)
    time.sleep(1.5)
    assert all(alive(pid) for pid in pids(work, "a"))
    assert pids(work, "b") == []
    (entry,) = journal(work)
    leader = a.leader()
    assert leader is not None
    assert entry == ["start", "a", str(leader["fencing_token"]), "1000", "jobs"]
    assert not b.is_leader()


def test_sigterm_drains_the_command_releases_and_the_next_command_gets_a_higher_token(
    daemon, seeded, work
) -> None:
    a = daemon("a")
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=3)
    b = daemon("b")
    a_pids = pids(work, "a")
    a.signal(signal.SIGTERM)
    assert a.wait(timeout_s=5) == 0
    assert not any(alive(pid) for pid in a_pids)  # gone before the daemon exited
    wait_until(lambda: len(pids(work, "b")) == 2, timeout_s=2)
    first, second = journal(work)
    assert (first[1], second[1]) == ("a", "b")
    assert int(second[2]) > int(first[2])
    assert b.is_leader()


async def test_a_cut_redis_link_kills_the_command_and_grandchildren_before_the_lease_expires(
    daemon, seeded, work, tcp_proxy: TcpProxy, redis_url: str
) -> None:
    a = await asyncio.to_thread(daemon, "a", url=tcp_proxy.url, ttl="2s")
    for _ in range(300):
        if len(pids(work, "a")) == 2:
            break
        await asyncio.sleep(0.01)
    b = await asyncio.to_thread(daemon, "b", ttl="2s")
    await asyncio.sleep(1.0)
    a_pids = pids(work, "a")
    assert len(a_pids) == 2 and all(alive(pid) for pid in a_pids)

    watcher = redis.Redis.from_url(redis_url)
    tcp_proxy.blackhole()  # no answers, no resets: only the leader's own deadline can save it
    cut_at = time.monotonic()
    # The latest expiry Redis will apply: a renewal already in flight may still land, so look
    # for a little while and keep the latest.
    expiry = 0.0
    for _ in range(20):
        pttl = await asyncio.to_thread(watcher.pttl, LEASE_KEY)
        expiry = max(expiry, time.monotonic() + pttl / 1000)
        await asyncio.sleep(0.005)
    gone_at = None
    while time.monotonic() < cut_at + 4:
        if not any(alive(pid) for pid in a_pids):
            gone_at = time.monotonic()
            break
        await asyncio.sleep(0.002)
    assert gone_at is not None, "the command outlived the lease"
    assert gone_at < expiry, f"command gone {gone_at - expiry:.3f}s after the lease expired"
    # The follower starts its command only after the expiry, with a higher token.
    for _ in range(400):
        if len(pids(work, "b")) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(journal(work)) == 2
    first, second = journal(work)
    assert second[1] == "b" and int(second[2]) > int(first[2])
    assert await asyncio.to_thread(b.is_leader)
    watcher.close()
    tcp_proxy.restore()
    await asyncio.to_thread(a.stop)


def test_on_child_exit_release_hands_leadership_to_another_replica(daemon, seeded, work) -> None:
    once = SCRIPT.replace("wait", 'if [ "$ELECTOR_IDENTITY" = a ]; then exit 3; fi; wait')
    a = daemon("a", script=once)
    wait_until(lambda: journal(work), timeout_s=3)  # a led (briefly: its command exits at once)
    b = daemon("b", script=once)
    wait_until(b.is_leader, timeout_s=3)
    lines = [
        line for line in a.log_lines() if line["event"] in ("command_exited", "resigning_after_command_exit")
    ]
    assert lines[0]["exit_code"] == 3
    assert lines[1]["stand_back_s"] == 1.0
    assert [entry[1] for entry in journal(work)][-1] == "b"
    time.sleep(1.5)
    assert b.is_leader() and not a.is_leader()


def test_on_child_exit_restart_restarts_while_still_leading(daemon, seeded, work) -> None:
    flaky = 'echo "start $ELECTOR_IDENTITY $ELECTOR_FENCING_TOKEN" >> {dir}/journal; exit 1'
    a = daemon("a", "--on-child-exit", "restart", script=flaky)
    wait_until(lambda: len(journal(work)) >= 3, timeout_s=6)  # back-off 1 s, then 2 s
    tokens = {entry[2] for entry in journal(work)}
    assert len(tokens) == 1  # the same term throughout
    assert a.is_leader()
    exits = [line for line in a.log_lines() if line["event"] == "command_restart_scheduled"]
    assert [line["delay_s"] for line in exits[:2]] == [1.0, 2.0]


def test_on_child_exit_exit_releases_and_exits_with_the_commands_code(daemon, seeded, work) -> None:
    a = daemon("a", "--on-child-exit", "exit", script="sleep 0.5; exit 7")
    b = daemon("b", "--on-child-exit", "exit", script="exec sleep 1000")
    assert a.wait(timeout_s=5) == 7
    wait_until(b.is_leader, timeout_s=1)  # released, not left to expire


def test_a_command_that_cannot_start_is_reported_and_backs_off(daemon, seeded, work) -> None:
    a = daemon("a", command=("/nonexistent/worker", "--flag"))
    wait_until(
        lambda: len([x for x in a.log_lines() if x["event"] == "command_failed_to_start"]) >= 2, timeout_s=4
    )
    failures = [line for line in a.log_lines() if line["event"] == "command_failed_to_start"]
    assert "/nonexistent/worker" in failures[0]["error"]
    stand_backs = [
        line["stand_back_s"] for line in a.log_lines() if line["event"] == "resigning_after_command_exit"
    ]
    assert stand_backs[:2] == [1.0, 2.0]  # backing off, not a hot loop
    assert a.get("/healthz")[0] == 200 and a.process is not None and a.process.poll() is None


def test_the_command_does_not_see_the_daemons_own_settings(daemon, seeded, work) -> None:
    script = "env > {dir}/env; exec sleep 1000"
    daemon("a", script=script, env={"ELECTOR_REDIS_URL": "redis://:secret@nowhere:1/0", "KEEP_ME": "yes"})
    wait_until(lambda: (work / "env").exists() and "KEEP_ME" in (work / "env").read_text(), timeout_s=3)
    env = (work / "env").read_text()
    assert "secret" not in env
    assert "ELECTOR_FENCING_TOKEN=" in env and "KEEP_ME=yes" in env
