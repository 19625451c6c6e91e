"""The sync API's safety under faults, judged on the workers' own journals (tests/support/sync_worker.py).

Two worker processes contend for one lock on a real redis-server; one is hit while it leads
(SIGSTOP, a cut link to Redis, SIGKILL). Every journal line is a moment a body acted as leader,
on CLOCK_BOOTTIME: the intervals of different terms must never overlap.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.seed import seed_used_lock
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
LOCK = "jobs"
TTL_S = 1.0


class Worker:
    def __init__(
        self, url: str, identity: str, journal: Path, *, mode: str = "check", ttl_s: float = TTL_S
    ) -> None:
        self.identity = identity
        self.journal = journal
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.sync_worker",
                url,
                LOCK,
                identity,
                str(ttl_s),
                str(journal),
                mode,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "READY"

    def lines(self) -> int:
        return sum(1 for line in read_journal(self.journal) if line[0] == self.identity)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def read_journal(path: Path) -> list[tuple[str, int, float]]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        identity, token, at = line.split()
        entries.append((identity, int(token), float(at)))
    return entries


def overlapping_terms(path: Path) -> list[tuple[object, object]]:
    """Pairs of terms (identity, token, first, last) whose journal intervals overlap."""
    terms: dict[tuple[str, int], list[float]] = {}
    for identity, token, at in read_journal(path):
        interval = terms.setdefault((identity, token), [at, at])
        interval[0], interval[1] = min(interval[0], at), max(interval[1], at)
    items = sorted((key, first, last) for key, (first, last) in terms.items())
    return [
        (one, other)
        for i, one in enumerate(items)
        for other in items[i + 1 :]
        if one[0][1] != other[0][1] and one[1] <= other[2] and other[1] <= one[2]
    ]


@pytest.fixture
def workers(redis_url: str) -> Iterator[list[Worker]]:
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, LOCK)
    client.close()
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


async def leading(worker: Worker, *, timeout_s: float = 10.0) -> None:
    """Until `worker` journals as leader."""
    before = worker.lines()
    await until(lambda: worker.lines() > before, timeout_s=timeout_s)


async def test_a_sync_leader_frozen_by_sigstop_never_acts_beside_its_successor(
    redis_url: str, workers: list[Worker], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    workers.append(a := Worker(redis_url, "a", journal))
    await leading(a)
    workers.append(b := Worker(redis_url, "b", journal))
    await asyncio.sleep(0.3)
    a.process.send_signal(signal.SIGSTOP)
    try:
        await leading(b)
        await asyncio.sleep(0.2)
    finally:
        a.process.send_signal(signal.SIGCONT)
    await asyncio.sleep(1.0)  # a resumes: its body looks, finds the term over, writes nothing
    assert a.process.poll() is None
    assert overlapping_terms(journal) == []
    assert {entry[0] for entry in read_journal(journal)} == {"a", "b"}


@pytest.mark.parametrize("mode", ["check", "exit"])
async def test_a_sync_leader_cut_from_redis_stops_before_its_successor_starts(
    redis_url: str, tcp_proxy: TcpProxy, workers: list[Worker], tmp_path: Path, mode: str
) -> None:
    journal = tmp_path / "journal"
    workers.append(a := Worker(tcp_proxy.url, "a", journal, mode=mode))
    await leading(a)
    workers.append(b := Worker(redis_url, "b", journal))
    await asyncio.sleep(0.3)
    tcp_proxy.cut()
    await leading(b)
    await asyncio.sleep(0.3)
    if mode == "exit":
        # Work that never looks: the hard stop ended the process (before the lease could lapse,
        # as the journals show below: b, granted only after the lapse, never overlaps a).
        assert a.process.wait(timeout=10) == 70
    else:
        assert a.process.poll() is None
    assert overlapping_terms(journal) == []
    a_last = max(at for identity, _, at in read_journal(journal) if identity == "a")
    b_first = min(at for identity, _, at in read_journal(journal) if identity == "b")
    assert a_last < b_first


async def test_without_the_hard_stop_work_that_never_looks_overlaps_its_successor(
    redis_url: str, tcp_proxy: TcpProxy, workers: list[Worker], tmp_path: Path
) -> None:
    """What on_overrun="exit" is for, and the proof that the journals catch an overlap."""
    journal = tmp_path / "journal"
    workers.append(a := Worker(tcp_proxy.url, "a", journal, mode="blind"))
    await leading(a)
    workers.append(b := Worker(redis_url, "b", journal))
    await asyncio.sleep(0.3)
    tcp_proxy.cut()
    await leading(b)
    await asyncio.sleep(0.3)
    assert a.process.poll() is None
    assert overlapping_terms(journal) != []


async def test_a_sync_leader_killed_is_replaced_without_overlap(
    redis_url: str, workers: list[Worker], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    workers.append(a := Worker(redis_url, "a", journal))
    await leading(a)
    workers.append(b := Worker(redis_url, "b", journal))
    await asyncio.sleep(0.3)
    a.process.kill()
    a.process.wait(timeout=10)
    await leading(b)
    assert overlapping_terms(journal) == []


async def test_sigterm_under_elector_sync_run_releases_the_lease(
    redis_url: str, workers: list[Worker], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    workers.append(a := Worker(redis_url, "a", journal, mode="sigterm", ttl_s=10.0))
    await leading(a)
    a.process.send_signal(signal.SIGTERM)
    assert a.process.wait(timeout=10) == 128 + signal.SIGTERM
    client = redis.Redis.from_url(redis_url)
    try:
        # Released: without it, the key would live on for most of its 10 s ttl.
        assert client.exists(f"elector:{{{LOCK}}}:lease") == 0
    finally:
        client.close()


ASYNC_PROGRAM = """
import asyncio, sys, elector
async def main():
    async with elector.Elector("jobs", redis=sys.argv[1], identity="a", ttl_s=10) as e:
        async with e.leadership():
            print("LEADING", flush=True)
            await asyncio.Event().wait()
elector.run(main())
"""


def test_sigterm_under_elector_run_releases_the_lease(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, LOCK)
    program = subprocess.Popen(
        [sys.executable, "-c", ASYNC_PROGRAM, redis_url], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert program.stdout is not None
        assert program.stdout.readline().strip() == "LEADING"
        assert client.exists(f"elector:{{{LOCK}}}:lease") == 1
        program.send_signal(signal.SIGTERM)
        assert program.wait(timeout=10) == 128 + signal.SIGTERM
        assert client.exists(f"elector:{{{LOCK}}}:lease") == 0
    finally:
        if program.poll() is None:
            os.kill(program.pid, signal.SIGKILL)
            program.wait()
        client.close()
