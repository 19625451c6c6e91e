"""The other candidate for `on_overrun="exit"`, for bench/overrun/kill_cost.py only: a watchdog process.

    python -I -S bench/overrun/watchdog.py PARENT_PID     (started by PARENT_PID, a pipe on stdin)

Modelled on exec mode's keeper (elector/daemon/execmode/keeper.py): a bare interpreter with no
site-packages, that dies with its parent (PR_SET_PDEATHSIG: SIGKILL) and reads deadlines from a
pipe, one line each, CLOCK_BOOTTIME seconds (`0` disarms). When the latest deadline passes it
SIGKILLs its parent, if its parent is still PARENT_PID. It needs nothing of the parent's threads:
the parent only writes a line at each renewal. `WatchdogProcess` is the parent's side.

Not used by the library: the kernel timer (elector/library/_kill_timer.py) won (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9
#: select() sleeps on the monotonic clock: look at CLOCK_BOOTTIME again at least this often.
MAX_WAIT_S = 0.25


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def main(parent: int) -> None:
    import ctypes

    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the prctl took effect
        return
    deadline: float | None = None
    buffer = b""
    while True:
        wait_s = MAX_WAIT_S if deadline is None else max(0.0, min(MAX_WAIT_S, deadline - _boottime()))
        if select.select([0], [], [], wait_s)[0]:
            data = os.read(0, 4096)
            if not data:
                return  # the parent closed the pipe: disarmed for good
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                value = float(line)
                deadline = value if value > 0 else None
        if deadline is not None and _boottime() >= deadline:
            if os.getppid() == parent:
                os.kill(parent, _SIGKILL)
            return


class WatchdogProcess:
    """The parent's side: start the watchdog, arm it at a deadline, disarm it, close it."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, str(os.getpid())], stdin=subprocess.PIPE
        )
        assert self._process.stdin is not None
        self._pipe = self._process.stdin.fileno()

    @property
    def pid(self) -> int:
        return self._process.pid

    def arm_at(self, deadline: float) -> None:
        os.write(self._pipe, b"%r\n" % deadline)

    def disarm(self) -> None:
        os.write(self._pipe, b"0\n")

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()


if __name__ == "__main__":
    main(int(sys.argv[1]))
