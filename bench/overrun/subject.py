"""The processes bench/overrun/kill_cost.py measures, one per candidate of `on_overrun="exit"`.

    python -m bench.overrun.subject leader VARIANT URL   # a sync leader at ttl 2 s, its body running
    python -m bench.overrun.subject victim VARIANT DELAY_S
    python -m bench.overrun.subject rearm VARIANT COUNT

VARIANT: `none` (on_overrun="withhold": nothing armed, the baseline), `timer` (on_overrun="exit":
the kernel timer, elector/library/_kill_timer.py, and the guard thread), `process` (on_overrun="withhold"
plus the watchdog process of bench/overrun/watchdog.py, armed at each renewal's validity end as
the timer is, from the same place: the election's outcome).

* `leader` prints `READY` once its body runs, then waits for EOF on stdin (memory is measured
  meanwhile).
* `victim` arms a kill DELAY_S ahead, prints the deadline (CLOCK_BOOTTIME), then holds the GIL in
  C (`sleep(30)` through ctypes.PyDLL) until killed.
* `rearm` re-arms COUNT times back to back and prints the CPU seconds per re-arm of this process
  (time.process_time); for `process` it then re-arms COUNT/10 times 1 ms apart and prints the
  watchdog's own CPU seconds per line (its /proc/PID/schedstat run time, in ns), minus what it
  used over as long a time without lines.
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

import elector.sync
from bench.overrun.watchdog import WatchdogProcess
from elector.election import CycleOutcome
from elector.election.clock import boottime
from elector.library._kill_timer import KillTimer
from elector.library._sync_overrun import kill_grace_s

FAR_S = 600.0


def _run_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def leader(variant: str, url: str) -> None:
    on_overrun = "exit" if variant == "timer" else "withhold"
    with elector.sync.Elector("bench", redis=url, identity=variant, ttl_s=2.0, on_overrun=on_overrun) as e:
        watchdog = WatchdogProcess() if variant == "process" else None
        if watchdog is not None:
            grace_s = kill_grace_s(e.timing)

            def renewed(outcome: CycleOutcome) -> None:
                if outcome.valid_until is not None:
                    watchdog.arm_at(outcome.valid_until + grace_s)

            e._core._outcome_listeners.append(renewed)
        with e.leadership() as lease:
            if watchdog is not None:
                watchdog.arm_at(boottime() + lease.remaining() + grace_s)
            print("READY", flush=True)
            sys.stdin.read()
            if watchdog is not None:
                watchdog.disarm()
        if watchdog is not None:
            watchdog.close()


def victim(variant: str, delay_s: float) -> None:
    arm = KillTimer.create().arm_at if variant == "timer" else WatchdogProcess().arm_at
    time.sleep(0.5)  # the watchdog's interpreter starts meanwhile
    deadline = boottime() + delay_s
    arm(deadline)
    print(repr(deadline), flush=True)
    ctypes.PyDLL(None).sleep(30)


def rearm(variant: str, count: int) -> None:
    if variant == "timer":
        timer = KillTimer.create()
        started = time.process_time()
        for _ in range(count):
            timer.arm_at(boottime() + FAR_S)
        print(repr((time.process_time() - started) / count), flush=True)
        timer.close()
        return
    watchdog = WatchdogProcess()
    time.sleep(0.5)
    started = time.process_time()
    for _ in range(count):
        watchdog.arm_at(boottime() + FAR_S)
    print(repr((time.process_time() - started) / count), flush=True)
    time.sleep(0.5)  # the watchdog drains its pipe
    paced = count // 10
    before = _run_ns(watchdog.pid)
    began = time.monotonic()
    for _ in range(paced):
        watchdog.arm_at(boottime() + FAR_S)
        time.sleep(0.001)
    busy_ns, span_s = _run_ns(watchdog.pid) - before, time.monotonic() - began
    before = _run_ns(watchdog.pid)
    time.sleep(span_s)
    idle_ns = _run_ns(watchdog.pid) - before
    print(repr((busy_ns - idle_ns) / 1e9 / paced), flush=True)
    watchdog.close()


if __name__ == "__main__":
    role, variant, arg = sys.argv[1:4]
    if role == "leader":
        leader(variant, arg)
    elif role == "victim":
        victim(variant, float(arg))
    else:
        rearm(variant, int(arg))
