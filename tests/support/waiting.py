"""Polling until a condition holds: in a thread (`wait_until`) or on the running loop (`until`).

Both fail with an AssertionError when the time runs out; the timeout is a bound on a hang, never
a measurement (tests that measure time say so and derive their bounds from what they measured).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], *, timeout_s: float, every_s: float = 0.005) -> float:
    """Poll until predicate() is truthy; returns the monotonic time it became so."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s}s")


async def until(predicate: Callable[[], object], *, timeout_s: float = 5.0, every_s: float = 0.01) -> None:
    """Poll on the running loop until predicate() is truthy."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"condition not met within {timeout_s}s"
        await asyncio.sleep(every_s)
