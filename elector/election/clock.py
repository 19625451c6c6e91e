"""The clock leases are counted on: CLOCK_BOOTTIME.

Redis expires keys by wall time, which keeps running while this host is suspended (a laptop lid,
a hibernated VM, a frozen container checkpoint). CLOCK_MONOTONIC stops during a suspend, so a
leader that resumes would believe its lease still had the validity it had when it went to sleep.
CLOCK_BOOTTIME is monotonic too (no NTP steps) but includes suspended time: after a resume the
lease is seen to have run out at once.

Every process on the host reads the same CLOCK_BOOTTIME, so a validity end can be handed to
another process (exec mode's keeper) as a plain number of seconds.

Off Linux (no CLOCK_BOOTTIME) this falls back to time.monotonic(); the suspend gap then remains.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def _pick() -> Callable[[], float]:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return time.monotonic
    try:
        time.clock_gettime(clock_id)
    except OSError:  # a kernel or sandbox that refuses it
        return time.monotonic

    def boottime() -> float:
        return time.clock_gettime(clock_id)

    return boottime


#: Seconds on CLOCK_BOOTTIME (time.monotonic where that clock does not exist).
boottime: Callable[[], float] = _pick()

#: Whether `boottime` really counts suspended time (False: it fell back to the monotonic clock).
COUNTS_SUSPEND = boottime is not time.monotonic
