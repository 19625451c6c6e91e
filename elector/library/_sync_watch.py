"""The sync form of the leader watch: `elector.sync.watch(lock, redis=URL, on_change=callback)`.

The watch (`elector.library.watch.LeaderWatch`) runs on a thread of its own with its own loop;
`on_change(leader)` is called on that thread for each change (a slow callback delays only the
watch; one that raises is logged). `leader` is the latest `Leader` seen, for polling code.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType

from elector.library._params import ElectorConfigError, factory_of
from elector.library.errors import refuse_pickling
from elector.library.watch import Leader, LeaderWatch

logger = logging.getLogger("elector.api")


class LeaderWatcher:
    """Follows a lock's leader on a background thread; `close()` (or `with`) stops it."""

    def __init__(
        self,
        lock: str,
        *,
        on_change: Callable[[Leader], object],
        redis: str | None = None,
        cluster: bool = False,
        redlock: Sequence[str] | None = None,
        ttl_s: float = 10.0,
        request_timeout_s: float | None = None,
        key_prefix: str = "elector",
    ) -> None:
        if redis is not None and not isinstance(redis, str):
            raise ElectorConfigError("redis", f"elector.sync.watch takes a URL, got {type(redis).__name__}")
        if not callable(on_change):
            raise ElectorConfigError("on_change", f"must be callable, got {on_change!r}")
        self._watch = LeaderWatch(
            lock,
            redis=redis,
            cluster=cluster,
            redlock=redlock,
            ttl_s=ttl_s,
            request_timeout_s=request_timeout_s,
            key_prefix=key_prefix,
        )
        self._on_change = on_change
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, name=f"elector:{lock}:watch", daemon=True)
        self._thread.start()

    @property
    def leader(self) -> Leader | None:
        """The latest leader seen (None before the first look answered); refused in a fork's
        copy, whose watching thread does not exist (`elector.ForkedElectorError`)."""
        self._watch._process.check()
        return self._watch.leader

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise refuse_pickling("watch", self._watch.lock)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._task = self._loop.create_task(self._follow())
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        finally:
            self._loop.close()

    async def _follow(self) -> None:
        async with self._watch as leaders:
            async for leader in leaders:
                try:
                    self._on_change(leader)
                except Exception:
                    logger.exception("on_change callback of the watch of lock %r failed", self._watch.lock)

    def close(self) -> None:
        """Stop watching and wait for the thread (its connections are closed)."""
        self._watch._process.check()
        if self._thread.is_alive():
            task = self._task
            if task is not None:
                self._loop.call_soon_threadsafe(task.cancel)
            self._thread.join()

    def __enter__(self) -> LeaderWatcher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


watch = factory_of(
    LeaderWatcher,
    name="watch",
    doc="Call `on_change(leader)` on a background thread at each change of `lock`'s leader.",
)
