"""`treestop.dying`: which processes left after a SIGKILL's slack are not survivors.

A process that can never run its own code again (gone, a zombie, exiting, a SIGKILL pending) is
as good as gone; one in uninterruptible sleep is not (its syscall can still complete), nor one
whose /proc entry cannot be read as Linux writes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from elector.daemon.execmode.treestop import dying, dying_from

SLEEPING = b"1234 (python3 x) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 999 1 1 1\n"
STATUS = b"Name:\tpython3\nState:\tS (sleeping)\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n"


def stat_with(state: bytes, flags: int) -> bytes:
    fields = SLEEPING.split(b") ", 1)[1].split()
    fields[0], fields[6] = state, str(flags).encode()
    return b"1234 (python3 x) " + b" ".join(fields) + b"\n"


def status_with(*, thread: int = 0, shared: int = 0) -> bytes:
    return STATUS.replace(b"SigPnd:\t0000000000000000", f"SigPnd:\t{thread:016x}".encode()).replace(
        b"ShdPnd:\t0000000000000000", f"ShdPnd:\t{shared:016x}".encode()
    )


KILL = 1 << (signal.SIGKILL - 1)
TERM = 1 << (signal.SIGTERM - 1)


@pytest.mark.parametrize(
    ("stat", "status", "expected"),
    [
        (SLEEPING, STATUS, False),  # running its code
        (stat_with(b"R", 0), status_with(thread=TERM), False),  # a SIGTERM can be handled
        (stat_with(b"R", 0), status_with(thread=KILL), True),  # SIGKILL pending, not yet scheduled
        (stat_with(b"S", 0), status_with(shared=KILL), True),
        (stat_with(b"R", 0x4), STATUS, True),  # PF_EXITING: in do_exit()
        (stat_with(b"Z", 0), STATUS, True),
        (stat_with(b"D", 0), status_with(thread=KILL), False),  # its syscall may still complete
        (stat_with(b"D", 0x4), STATUS, False),  # e.g. flushing a network file system's pages
        (b"garbage", STATUS, False),  # not Linux's format: the cautious answer
    ],
)
def test_dying_from_proc(stat: bytes, status: bytes, expected: bool) -> None:
    assert dying_from(stat, status) is expected


def test_a_live_process_is_not_dying_a_zombie_and_a_gone_one_are() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not dying(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        # Dead and not reaped yet (a zombie): dying, never "alive".
        while not dying(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert dying(child.pid)  # gone
