"""`on_overrun="exit"` holds while a C call holds the GIL (issue 41, item 4), judged on journals.

Two worker processes (tests/support/overrun_worker.py) on one lock at ttl 2 s on a real
redis-server. The leader's body calls C code that holds the GIL for about 10 s; its heartbeat
thread (a Python thread, as the old guard was) stops beating, which shows the GIL is held. The
successor journals its grant. This process watches the leader through a pidfd and journals, on
the same clock (CLOCK_BOOTTIME), when it last saw it alive and when it saw it gone: the leader
must be gone before the successor is granted the lease, killed by the kernel timer (SIGKILL), not
by a Python thread of its own.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from elector.election.clock import boottime
from tests.support.seed import seed_used_lock
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
LOCK = "jobs"
TTL_S = 2.0
#: Bounds on hangs, not measurements: the old guard let the leader live through the whole C call.
GRANT_WITHIN_S = 30.0
GONE_WITHIN_S = 30.0


class Worker:
    """A worker process (tests/support/overrun_worker.py), started and READY; killed at the exit."""

    def __init__(self, url: str, identity: str, journal: Path, mode: str, go: Path) -> None:
        args = [url, LOCK, identity, str(TTL_S), str(journal), mode, str(go)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.overrun_worker", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> Worker:
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "READY":
            self.__exit__()
            raise AssertionError("the worker did not start (its stderr is above)")
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(timeout=10)


class DeathWatch:
    """Journals, in this process, when a process was last seen alive and when it was seen gone.

    A pidfd is readable once its process has exited: a `select` that finds it not readable was
    made while the process lived (so it was alive at the time read before it); one that finds it
    readable, after it died (so it was gone by the time read after it)."""

    def __init__(self, pid: int) -> None:
        self._fd = os.pidfd_open(pid)
        self.alive_at: list[float] = []
        self.gone_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                before = boottime()
                ready, _, _ = select.select([self._fd], [], [], 0.01)
                if ready:
                    self.gone_at = boottime()
                    return
                self.alive_at.append(before)
        finally:
            os.close(self._fd)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def read_journal(path: Path) -> list[tuple[str, str, int, float]]:
    entries = []
    for line in path.read_text().splitlines():
        identity, event, token, at = line.split()
        entries.append((identity, event, int(token), float(at)))
    return entries


def events(journal: list[tuple[str, str, int, float]], identity: str, event: str) -> list[tuple[int, float]]:
    return [(token, at) for who, what, token, at in journal if who == identity and what == event]


@pytest.fixture
def workers(redis_url: str) -> Iterator[contextlib.ExitStack]:
    """Where a test enters its workers: each is killed when the test ends, however it ends."""
    with redis.Redis.from_url(redis_url) as client:
        seed_used_lock(client, LOCK)
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.mark.parametrize("mode", ["hold-sleep", "hold-regex"])
def test_a_leader_whose_body_holds_the_gil_is_gone_before_its_successor_is_granted(
    redis_url: str, workers: contextlib.ExitStack, tmp_path: Path, mode: str
) -> None:
    journal, go = tmp_path / "journal", tmp_path / "go"
    a = workers.enter_context(Worker(redis_url, "a", journal, mode, go))
    wait_until(lambda: events(read_journal(journal), "a", "grant"), timeout_s=GRANT_WITHIN_S)
    workers.enter_context(Worker(redis_url, "b", journal, "follow", go))
    watch = DeathWatch(a.process.pid)
    go.touch()  # a's body now holds the GIL in C for about 10 s
    wait_until(lambda: events(read_journal(journal), "b", "grant"), timeout_s=GRANT_WITHIN_S, every_s=0.05)
    watch.join(GONE_WITHIN_S)
    entries = read_journal(journal)
    [(a_token, _)] = events(entries, "a", "grant")
    [(_, hold_at)] = events(entries, "a", "hold")
    (b_token, b_granted_at), *_ = events(entries, "b", "grant")

    # The leader was gone before its successor was granted the lease.
    assert watch.gone_at is not None, f"a still ran {GONE_WITHIN_S:.0f}s after b was granted the lease"
    assert watch.gone_at < b_granted_at, (
        f"a was seen gone {watch.gone_at - b_granted_at:.3f}s after b was granted the lease "
        f"({watch.gone_at - hold_at:.3f}s after its body began to hold the GIL)"
    )
    # Killed by the kernel timer: its own threads could not run (the guard's exit would be 70).
    assert a.process.wait(timeout=10) == -signal.SIGKILL
    # The GIL was held: the heartbeat (every 5 ms) stopped for good while the process still
    # lived, for at least half a second (the kill came at the validity end, >= 1.2 s later).
    last_beat = max(at for _, at in events(entries, "a", "beat"))
    assert last_beat < b_granted_at
    alive_after_last_beat = [at for at in watch.alive_at if at > last_beat]
    assert alive_after_last_beat, "a died as its heartbeat stopped"
    assert max(alive_after_last_beat) - last_beat >= 0.5, (last_beat, alive_after_last_beat[-3:])
    # No line of a's after b's grant, nothing after the C call, and b's term is a newer one.
    assert max(at for who, _, _, at in entries if who == "a") < b_granted_at
    assert events(entries, "a", "held") == []
    assert b_token > a_token
