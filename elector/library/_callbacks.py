"""The user's callbacks, run one at a time in a task of their own: a slow one never delays a renewal."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("elector.api")

_Call = tuple[str, Callable[[], object], asyncio.Future[None]]


class CallbackRunner:
    """Runs the user's callbacks one at a time, in submission order, in a task of its own."""

    def __init__(self, *, lock: str) -> None:
        self._lock = lock
        self._queue: asyncio.Queue[_Call | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name=f"elector:{lock}:callbacks")

    def submit(self, name: str, callback: Callable[[Any], object], arg: object) -> asyncio.Future[None]:
        """Queue `callback(arg)`; the future is done once it returned or raised (never fails)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((name, lambda: callback(arg), done))
        return done

    async def _run(self) -> None:
        while (item := await self._queue.get()) is not None:
            name, call, done = item
            try:
                result = call()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("%s callback failed", name, extra={"lock": self._lock})
            finally:
                done.set_result(None)

    async def aclose(self, *, drain: bool) -> None:
        """Stop after the queued calls (`drain`) or at once."""
        self._queue.put_nowait(None)
        if self._task is asyncio.current_task():
            return  # a callback closing its own Elector: the loop ends after it returns
        if not drain:
            self._task.cancel()
        await asyncio.wait([self._task])
