"""The lateness probe sees a stall of what it measures (lower bounds only: they hold on any machine)."""

from __future__ import annotations

import asyncio
import time

from tests.support.lateness import PROBE_PERIOD_S, loop_lateness, thread_lateness


async def test_the_loop_probe_sees_a_blocked_loop() -> None:
    async with loop_lateness() as lateness:
        await asyncio.sleep(PROBE_PERIOD_S / 2)  # the probe runs and waits for its next wake-up
        blocked_from = time.monotonic()
        time.sleep(0.2)  # noqa: ASYNC251 - the stall the probe must see
        blocked_s = time.monotonic() - blocked_from
        await asyncio.sleep(3 * PROBE_PERIOD_S)
    # Its wake-up was due at most one period after the stall began.
    assert lateness.worst_s >= blocked_s - PROBE_PERIOD_S, lateness


def test_the_thread_probe_wakes_while_the_body_runs() -> None:
    with thread_lateness() as lateness:
        time.sleep(0.1)
    assert lateness.wakeups >= 1, lateness
