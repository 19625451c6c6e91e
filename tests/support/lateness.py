"""How late this machine runs our timers: the measured load a timing bound may allow for.

A test that checks something happens promptly ("the link is found dead within keepalive +
timeout") cannot know how busy the machine is, but it can measure it: a probe asks to wake every
10 ms and records how late it woke. Every step of the thing under test that waits for a timer or
for the CPU is late by about as much. A bound is then

    nominal + margin + steps * probe.worst_s

where `steps` is the number of timer wake-ups in a row the measured thing needs (each can be late
by up to the worst lateness seen). On an idle machine the lateness is a millisecond or two and the
bound is as tight as the nominal one; on a loaded machine it grows by what the load was measured
to cost during the measurement itself, never by a guess. Assertion messages show the lateness.

`loop_lateness()` measures the running event loop (for code under test in this process: a busy
loop delays its timers as much as the machine does); `thread_lateness()` measures this process's
scheduling from a thread (for daemons in other processes: a stand-in for their timers, which
compete for the same cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator

#: How often the probe asks to wake: short against any bound it serves, long against its own cost.
PROBE_PERIOD_S = 0.01


class Lateness:
    """The worst lateness (seconds) of the probe's wake-ups so far."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self.wakeups = 0

    def _woke(self, late_s: float) -> None:
        self.wakeups += 1
        self.worst_s = max(self.worst_s, late_s)

    def __repr__(self) -> str:
        return f"Lateness(worst_s={self.worst_s:.3f}, wakeups={self.wakeups})"


@contextlib.asynccontextmanager
async def loop_lateness() -> AsyncIterator[Lateness]:
    """Probe the running loop while the body runs; the probe stops (and is awaited) on exit."""
    lateness = Lateness()

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + PROBE_PERIOD_S
            await asyncio.sleep(PROBE_PERIOD_S)
            lateness._woke(max(0.0, loop.time() - due))

    task = asyncio.create_task(probe())
    try:
        yield lateness
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def thread_lateness() -> Iterator[Lateness]:
    """Probe this process from a thread while the body runs."""
    lateness = Lateness()
    stop = threading.Event()

    def probe() -> None:
        while True:
            due = time.monotonic() + PROBE_PERIOD_S
            if stop.wait(PROBE_PERIOD_S):
                return
            lateness._woke(max(0.0, time.monotonic() - due))

    thread = threading.Thread(target=probe, name="lateness-probe", daemon=True)
    thread.start()
    try:
        yield lateness
    finally:
        stop.set()
        thread.join()
