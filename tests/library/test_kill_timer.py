"""The kernel timer behind `on_overrun="exit"` (elector/library/_kill_timer.py, _sync_overrun.py).

Each case runs in a child program (a timer that fires kills its process: never pytest's own) and
is judged by how that program ended and what it printed. Bounds on waits are hang bounds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import redis

from tests.support.seed import seed_used_lock

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 60

PRELUDE = """
import os, sys, time
from elector.election.clock import boottime
from elector.library._kill_timer import KillTimer

def hold_the_gil(seconds):
    import ctypes
    ctypes.PyDLL(None).sleep(seconds)  # PyDLL: the GIL stays held through the call
"""


def run(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    source = PRELUDE + textwrap.dedent(program)
    return subprocess.run(
        [sys.executable, "-c", source, *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_an_armed_timer_kills_its_process_while_a_c_call_holds_the_gil() -> None:
    done = run("""
        timer = KillTimer.create()
        timer.arm_at(boottime() + 0.2)
        print("armed", flush=True)
        hold_the_gil(20)
        print("survived")
    """)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["armed"]


def test_an_armed_timer_kills_its_process_while_it_is_stopped() -> None:
    done = run("""
        import signal
        timer = KillTimer.create()
        timer.arm_at(boottime() + 0.2)
        os.kill(os.getpid(), signal.SIGSTOP)  # nobody sends SIGCONT
        print("survived")
    """)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == ""


def test_a_disarmed_or_re_armed_later_timer_does_not_fire() -> None:
    done = run("""
        timer = KillTimer.create()
        timer.arm_at(boottime() + 0.3)
        timer.disarm()
        assert timer.armed_at is None
        other = KillTimer.create()
        other.arm_at(boottime() + 0.3)
        other.arm_at(boottime() + 600)  # replaces the first arming
        hold_the_gil(1)
        timer.close(); other.close(); other.close()  # close is idempotent
        try:
            other.arm_at(boottime() + 1)
        except RuntimeError:
            print("closed")
    """)
    assert (done.returncode, done.stdout.split()) == (0, ["closed"]), done.stderr


def test_a_fork_child_has_no_timer_and_its_copy_touches_nothing() -> None:
    """POSIX timers are not inherited by fork: the parent dies at its deadline, the child lives
    on. The copied KillTimer does nothing in the child, not even to the child's own timer, which
    has the same id there: neither arms it early nor disarms it."""
    done = run("""
        timer = KillTimer.create()
        timer.arm_at(boottime() + 0.5)
        if os.fork() == 0:
            own = KillTimer.create()  # the child's first timer: the same id as the copy's
            own.arm_at(boottime() + 1.5)
            timer.arm_at(boottime() + 0.1)  # the copy: must not arm `own` early
            timer.disarm()  # nor disarm it
            time.sleep(1.0)  # past the parent's deadline
            print("child alive", flush=True)
            time.sleep(20)
            print("child survived its own timer", flush=True)
            os._exit(0)
        hold_the_gil(20)
    """)
    # The parent was killed at +0.5 s; the child lived past it and past the copy's +0.1 s, then
    # its own timer killed it at +1.5 s (the output ends when the child's end closes the pipe).
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.splitlines() == ["child alive"]


SYNC_PROGRAM = """
import elector.sync
url = sys.argv[1]
with elector.sync.Elector("jobs", redis=url, identity="a", ttl_s=2.0, on_overrun="exit") as e:
    timer = e._guard._timer
    with e.leadership() as lease:
        armed = set()
        until = boottime() + 4.0  # 2 ttls: renewals (every 0.6 s) re-arm it; it never fires meanwhile
        while boottime() < until:
            lease.check()
            now = boottime()
            remaining = lease.remaining()
            armed_at = timer.armed_at
            # Ahead (a renewal is seen by the loop a few bytecodes after the status shows it: the
            # timer may lag by one renewal, never more), and never past the validity end + grace.
            assert armed_at is not None and now < armed_at <= now + remaining + 0.05 + 1e-3, (
                armed_at, now, remaining)
            armed.add(armed_at)
            time.sleep(0.01)
        print("re-armed", len(armed) >= 4, flush=True)
        # A C call that holds the GIL well inside the validity: renewals resume after it, nothing
        # is killed (the timer is at least validity - renew interval = 1.175 s ahead).
        import ctypes
        ctypes.PyDLL(None).usleep(500_000)
        lease.check()
        time.sleep(0.7)  # a renewal or two after it
        lease.check()
        print("outlived a short hold", flush=True)
        child = os.fork()
        if child == 0:  # a fork of the leader: no timer aimed at it
            time.sleep(2.0)
            os._exit(0)
    print("after the block", timer.armed_at, flush=True)  # disarmed once the body left
    time.sleep(2.0)  # still electing, no body: nothing to kill
    print("fork child", os.waitpid(child, 0)[1], flush=True)
print("closed", timer._closed, flush=True)
"""


def test_the_guard_re_arms_at_renewals_disarms_when_the_body_left_and_deletes_at_close(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, "jobs")
    client.close()
    done = run(SYNC_PROGRAM, redis_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "re-armed True",
        "outlived a short hold",
        "after the block None",
        "fork child 0",
        "closed True",
    ], done.stderr


def test_without_exit_nothing_of_it_is_made_or_loaded() -> None:
    done = run("""
        import threading
        import elector.sync
        for mode in ("withhold", None):
            kwargs = {} if mode is None else {"on_overrun": mode}
            e = elector.sync.Elector("jobs", redis="redis://127.0.0.1:1", **kwargs)
            e.start()
            print(e._guard, "ctypes" in sys.modules, len(e._core._outcome_listeners),
                  sorted(t.name for t in threading.enumerate() if "overrun" in t.name))
            e.close()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["None False 0 []"] * 2
