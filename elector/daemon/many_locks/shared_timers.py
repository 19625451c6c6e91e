"""One loop timer for the many elections of a daemon that wake at the same instant.

A daemon of many locks renews each on a point of its renewal grid (grid.py), so hundreds of
elections sleep until the very same clock time. Each sleeping with its own loop timer put
thousands of handles in the event loop's heap, and every push and pop compared them in Python
(`TimerHandle.__lt__`): a sizeable share of a many-lock daemon's CPU (docs/design.md).
`SharedTimers` keeps one loop timer per distinct wake-up time and the callbacks due then in a
list: an election's wait is the same wait, only its timer is shared (the election's
`WakeUpTimers`, see `Election._sleep_until`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class SharedTimer:
    """A callback's place in its wake-up's list; `cancel` takes it out (the timer stays)."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        self.callback = None


class SharedTimers:
    """Calls each callback at its clock time, one loop timer per distinct time.

    `clock` is the elections' clock (the loop's own timers run on loop time: the delay is
    converted when a time's loop timer is made). Callbacks run in the order they were added,
    on the running loop, like `loop.call_later`'s.
    """

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._due: dict[float, list[SharedTimer]] = {}

    def __len__(self) -> int:
        """The distinct wake-up times pending (for tests)."""
        return len(self._due)

    def call_at(self, when: float, callback: Callable[[], object]) -> SharedTimer:
        timer = SharedTimer(callback)
        waiting = self._due.get(when)
        if waiting is None:
            waiting = self._due[when] = []
            asyncio.get_running_loop().call_later(max(0.0, when - self._clock()), self._fire, when)
        waiting.append(timer)
        return timer

    def _fire(self, when: float) -> None:
        for timer in self._due.pop(when, ()):
            callback = timer.callback
            if callback is not None:
                timer.callback = None
                callback()
