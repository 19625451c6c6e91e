"""A term is entered only while it is live, and a loop blocked past the ttl recovers.

Against a real redis-server. The async shape runs as its own process (tests/support/
blocking_body.py), judged on its journal and its log; the sync shape blocks the election's own
thread past the ttl (as a starved or frozen thread would be) and looks at what `leadership()`
hands the program then.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

import elector
import elector.sync
from tests.support.seed import seed_used_lock
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
LOCK = "jobs"
TTL_S = 1.0


def journal(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def tokens(path: Path) -> list[int]:
    return sorted({int(line[1]) for line in journal(path) if line[0] == "step"})


def test_an_async_body_that_blocked_the_loop_past_the_ttl_steps_down_and_leads_again(
    redis_url: str, tmp_path: Path
) -> None:
    """Before the fix, `leadership()` handed the ended term back at once, without a turn for the
    loop: the program spun at 100 % CPU for ever (thousands of `lost` lines), never stepped
    down, never led again, and ignored SIGTERM."""
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, LOCK)
    client.close()
    path = tmp_path / "journal"
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        program = subprocess.Popen(
            [sys.executable, "-m", "tests.support.blocking_body", redis_url, LOCK, str(TTL_S), str(path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert program.stdout is not None
        assert program.stdout.readline().strip() == "READY"
        # The first term blocks for 1.5 ttl; then it steps down and contends again (hang bound).
        wait_until(lambda: len(tokens(path)) >= 2, timeout_s=20)
        first, second = tokens(path)[:2]
        assert second > first
        lost = [line for line in journal(path) if line[0] == "lost"]
        # Once, or a few times on a loaded machine (a slow renewal at a 1 s ttl ends a term);
        # before the fix, thousands: the ended term was re-entered in a loop without a yield.
        assert len(lost) <= 10, f"{len(lost)} LeadershipLost caught: the program re-entered an ended term"
        program.send_signal(signal.SIGTERM)
        assert program.wait(timeout=15) == 143
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
    text = log.read_text()
    assert "stepped down (lease_expired)" in text, text
    assert "fencing token " + str(first) in text and "fencing token " + str(second) in text


def test_the_sync_leadership_never_enters_a_term_whose_validity_ran_out(redis_url: str) -> None:
    """The election's thread is held past the ttl (a thread starved or frozen); the program's
    thread asks to lead meanwhile. Before the fix it was handed the ended term (`remaining()`
    0.0, a stale token) as soon as the election's loop ran again, ahead of the step-down."""
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, LOCK)
    client.close()
    entered: list[tuple[int, float, bool]] = []  # the program's journal: token, remaining, active
    # A 2 s ttl: the new term's validity must outlast the hop back to this thread on a loaded machine.
    ttl_s = 2 * TTL_S
    with elector.sync.Elector(LOCK, redis=redis_url, ttl_s=ttl_s) as e:
        with e.leadership(resign_on_exit=False, timeout=10) as lease:
            entered.append((lease.fencing_token, lease.remaining(), lease.active))
        assert e._loop is not None
        held = threading.Event()

        def hold_the_election_thread() -> None:
            held.set()
            time.sleep(1.5 * ttl_s)

        e._loop.call_soon_threadsafe(hold_the_election_thread)
        assert held.wait(timeout=10)
        with e.leadership(resign_on_exit=False, timeout=10) as lease:
            entered.append((lease.fencing_token, lease.remaining(), lease.active))
    (first, _, _), (token, remaining, active) = entered
    assert active and remaining > 0.0, entered
    assert token > first, entered


async def test_the_async_wait_for_leadership_gives_the_loop_a_turn_each_time(redis_url: str) -> None:
    """Re-entering a live term still yields: a loop of `leadership()` blocks whose bodies never
    await cannot starve the election (or a signal handler)."""
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async with elector.Elector(LOCK, redis=redis_url, ttl_s=TTL_S) as e:
        await e.wait_for_leadership(timeout=10)
        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        before = turns
        for _ in range(10):
            async with e.leadership(resign_on_exit=False):
                pass
        counter.cancel()
        assert turns - before >= 10
