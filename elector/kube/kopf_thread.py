"""One term's kopf operator, in a thread of its own with its own event loop, stoppable in bounded time.

kopf's `operator()` treats every task of its loop that it did not start with as its own: run in
the caller's loop it would cancel (or wait 5 s for) the caller's tasks at exit. kopf's embedding
docs recommend a thread with its own loop; that also keeps a busy operator from delaying the
lease's renewals. The stop has two phases inside one budget: kopf's stop flag (handlers get
`settings.queueing.exit_timeout`, which is capped to fit), then a cancellation of the whole
operator. Only synchronous handlers stuck in kopf's executor can outlive both: threads cannot be
killed, and `stop()` reports them instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Collection
from typing import Any

import kopf

logger = logging.getLogger(__name__)

#: Share of the stop budget for the graceful phase (kopf's stop flag); the rest is for the cancel.
GRACEFUL_SHARE = 0.6


class _ThreadWarningFilter(logging.Filter):
    """Drops kopf's warning that a thread gets no OS signals: here that is the design, not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("OS signals are ignored: running not in the main thread")


_THREAD_WARNING_FILTER = _ThreadWarningFilter()


def _install_filter() -> None:
    running_logger = logging.getLogger("kopf._core.reactor.running")
    if _THREAD_WARNING_FILTER not in running_logger.filters:
        running_logger.addFilter(_THREAD_WARNING_FILTER)


def term_settings(settings: kopf.OperatorSettings | None, *, stop_budget_s: float) -> kopf.OperatorSettings:
    """A copy of `settings` (never mutated: kopf writes into it) whose own timeouts fit the budget."""
    base = settings if settings is not None else kopf.OperatorSettings()
    exit_timeout_s = min(base.queueing.exit_timeout, GRACEFUL_SHARE * stop_budget_s * 0.8)
    return dataclasses.replace(
        base,
        queueing=dataclasses.replace(base.queueing, exit_timeout=exit_timeout_s),
        # kopf writes the peering mode into these; a copy keeps the caller's object untouched.
        peering=dataclasses.replace(base.peering),
        # kopf SIGKILLs its thread (so: the process) if cancelled without its stop flag: we always
        # raise the flag first, and turn the kill off anyway.
        process=dataclasses.replace(base.process, ultimate_exiting_timeout=None),
    )


class KopfThread:
    """Runs `kopf.operator(standalone=True, ...)` once, in a daemon thread; `stop()` ends it."""

    def __init__(
        self,
        *,
        name: str,
        registry: kopf.OperatorRegistry | None,
        settings: kopf.OperatorSettings,
        namespaces: Collection[str],
        clusterwide: bool,
        memo: object | None = None,
    ) -> None:
        self._kwargs: dict[str, Any] = {
            "registry": registry,
            "settings": settings,
            "namespaces": namespaces,
            "clusterwide": clusterwide,
            "memo": memo,
        }
        self._caller_loop = asyncio.get_running_loop()
        #: Done (in the caller's loop) when the thread has finished; its result is kopf's outcome.
        self.finished: asyncio.Future[BaseException | None] = self._caller_loop.create_future()
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._stop_flag: asyncio.Event | None = None
        self._stop_requested = False
        self._thread = threading.Thread(target=self._run_thread, name=f"kopf:{name}", daemon=True)

    def start(self) -> None:
        _install_filter()
        self._thread.start()

    async def stop(self, *, budget_s: float) -> bool:
        """Stop kopf within `budget_s`: stop flag, then cancellation. False if it is still running."""
        deadline = time.monotonic() + budget_s
        self._call_in_thread(self._raise_stop_flag)
        await asyncio.wait([self.finished], timeout=GRACEFUL_SHARE * budget_s)
        if not self.finished.done():
            logger.warning("kopf did not stop gracefully in %.3fs; cancelling it", GRACEFUL_SHARE * budget_s)
            self._call_in_thread(self._cancel_main)
            await asyncio.wait([self.finished], timeout=max(0.0, deadline - time.monotonic()))
        if not self.finished.done():
            logger.error(
                "kopf did not stop within %.3fs (a synchronous handler or daemon that ignores cancellation?)",
                budget_s,
            )
            return False
        return True

    # -- inside the thread ---------------------------------------------------------------------

    def _call_in_thread(self, callback: Any) -> None:
        with self._guard:
            self._stop_requested = True
            loop = self._loop
            if loop is not None:
                loop.call_soon_threadsafe(callback)

    def _raise_stop_flag(self) -> None:
        if self._stop_flag is not None:
            self._stop_flag.set()

    def _cancel_main(self) -> None:
        self._raise_stop_flag()  # first: kopf's "ultimate termination" spares a flagged operator
        if self._main is not None:
            self._main.cancel()

    def _run_thread(self) -> None:
        outcome: BaseException | None = None
        loop = asyncio.new_event_loop()
        try:
            asyncio.set_event_loop(loop)
            self._stop_flag = asyncio.Event()
            self._main = loop.create_task(self._operator(), name="kopf operator")
            with self._guard:
                if self._stop_requested:
                    self._stop_flag.set()  # stopped before it started: let it exit at once
                self._loop = loop
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass  # our own hard stop
        except BaseException as exc:
            outcome = exc
        finally:
            with self._guard:
                self._loop = None
            try:
                _cancel_leftovers(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
            self._report(outcome)

    async def _operator(self) -> None:
        assert self._stop_flag is not None
        await kopf.operator(standalone=True, stop_flag=self._stop_flag, **self._kwargs)

    def _report(self, outcome: BaseException | None) -> None:
        def settle() -> None:
            if not self.finished.done():
                self.finished.set_result(outcome)

        # A closed caller's loop raises RuntimeError: nobody waits for this thread any more.
        with contextlib.suppress(RuntimeError):
            self._caller_loop.call_soon_threadsafe(settle)


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and reap the tasks kopf left behind (none, normally), so the loop closes cleanly."""
    leftovers = asyncio.all_tasks(loop)
    for task in leftovers:
        task.cancel()
    if leftovers:
        loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
