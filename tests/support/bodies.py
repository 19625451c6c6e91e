"""The body of an `async with elector.leadership()` block, run in a task with its timeline on the
loop's clock (real or virtual): when it entered, was cancelled, unwound and left."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from elector import Elector, Leadership, LeadershipLost


class Body:
    """The body of one `async with elector.leadership()` block, in a task, with its timeline."""

    def __init__(self, e: Elector, *, hold_s: float = math.inf, unwind_s: float = 0.0, **kwargs: Any) -> None:
        self.loop = asyncio.get_running_loop()
        self.entered = asyncio.Event()
        self.lease: Leadership | None = None
        self.entered_at = self.cancelled_at = self.unwound_at = self.exited_at = math.nan
        self.valid_until = math.nan  # the last `now + remaining()` the body saw
        self.task = asyncio.create_task(self._run(e, hold_s, unwind_s, kwargs))

    async def _run(self, e: Elector, hold_s: float, unwind_s: float, kwargs: dict[str, Any]) -> None:
        async with e.leadership(**kwargs) as lease:
            self.lease, self.entered_at = lease, self.loop.time()
            self.entered.set()
            try:
                while self.loop.time() < self.entered_at + hold_s:
                    self.valid_until = self.loop.time() + lease.remaining()
                    await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                self.cancelled_at = self.loop.time()
                await asyncio.sleep(unwind_s)  # leader work taking its time to stop
                self.unwound_at = self.loop.time()
                raise
        self.exited_at = self.loop.time()

    async def lost(self) -> LeadershipLost:
        with pytest.raises(LeadershipLost) as info:
            async with asyncio.timeout(5):
                await self.task
        return info.value


async def wait_entered(*bodies: Body, timeout_s: float = 10.0) -> Body:
    """The first of `bodies` to enter its block (`timeout_s` bounds a hang; how soon is asserted
    where it matters)."""
    async with asyncio.timeout(timeout_s):
        while True:
            for body in bodies:
                if body.entered.is_set():
                    return body
            await asyncio.sleep(0.005)
