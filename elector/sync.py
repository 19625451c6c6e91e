"""Leader election for sync programs (threads, Django, Flask, scripts): `elector.sync.Elector`.

    import elector.sync

    def main() -> None:
        with elector.sync.Elector("nightly-report", redis="redis://redis:6379/0", ttl_s=10) as e:
            while True:
                try:
                    with e.leadership() as lease:  # blocks until this process leads
                        for batch in batches():
                            lease.check()  # raises LeadershipLost once the term ended
                            write(batch, fencing_token=lease.fencing_token)
                except elector.LeadershipLost as exc:
                    log.warning("lost the lead (%s)", exc.reason)

    elector.sync.run(main)  # SIGTERM releases the lease, as Ctrl-C does

One core: the election is the asyncio `elector.Elector`, run on a thread of its own with its own
event loop, so nothing the program's threads do delays a renewal. A sync body is registered in
its term like an async one: the step-down tells it to stop and waits up to `stop_work_s` for it to
leave its `with` block before the release, and a body still running then makes the release
withheld (the lease lapses by its ttl) and this Elector does not contend again until the body has
left.

What a sync body can and cannot be made to stop: Python cannot cancel a thread. The body is told
(`lease.check()` raises `LeadershipLost`, `lease.remaining()` is 0.0, `lease.active` is False) and
must look: before each step of work, and with each write's fencing token. A body blocked in a call
(a socket, a C extension, `time.sleep`) only sees it when the call returns. For work that cannot be
interrupted that way, `on_overrun="exit"` ends the whole process (`os._exit(OVERRUN_EXIT_CODE)`)
when a body is still running at `stop_work_s` after its term ended, or when the validity runs out
under it, before the lease can expire on Redis; the process manager restarts it. When no thread of
the process can run then (a C call holding the GIL, a SIGSTOP), a kernel timer SIGKILLs it at
the validity end instead (library/_sync_overrun.py).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import signal
import threading
import warnings
from collections.abc import Callable, Coroutine, Sequence
from types import FrameType, TracebackType
from typing import Any, Literal, TypeVar

from prometheus_client import CollectorRegistry

from elector.election import ElectionStatus, StepDownReason
from elector.election.clock import boottime
from elector.library import elector as api_elector
from elector.library._params import ElectorConfigError, checked_stand_back, checked_timeout
from elector.library._sync_fencing import FencedStore
from elector.library._sync_overrun import OVERRUN_EXIT_CODE, OverrunGuard
from elector.library._sync_watch import LeaderWatcher, watch
from elector.library.errors import LeadershipLost, refuse_pickling
from elector.library.signals import SIGTERM_EXIT_CODE
from elector.library.term import Leadership
from elector.library.watch import Leader

__all__ = [
    "OVERRUN_EXIT_CODE",
    "Elector",
    "FencedStore",
    "Leader",
    "LeaderWatcher",
    "SyncLeadershipScope",
    "run",
    "watch",
]

logger = logging.getLogger("elector.api")

T = TypeVar("T")

OnOverrun = Literal["withhold", "exit"]


class _ThreadBody:
    """A sync body in a term (a `library.term.TermBody`): told to stop, never cancelled."""

    def __init__(self) -> None:
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lost: StepDownReason | None = None
        self.lost_at: float | None = None  # CLOCK_BOOTTIME

    def cancel_body(self, reason: StepDownReason) -> None:
        self.lost, self.lost_at = reason, boottime()

    def cancel_again(self) -> None:
        """Nothing more to do: a thread is told once (its `check()` keeps failing)."""


class Elector:
    """Contends for one lock on Redis from a sync program; the election runs on its own thread.

    The parameters are `elector.Elector`'s (docs/library.md), except:

    * `redis`: a URL (or `redlock=[...]`): the election builds its own connections on its thread.
      A client object is refused (a sync `redis.Redis` cannot serve an event loop).
    * the callbacks may be plain functions; they run in a worker thread, one at a time, never on
      the election's loop.
    * `on_overrun`: `"withhold"` (default) withholds the release while a body overruns, as the
      async API does; `"exit"` also ends the process before the lease could expire (module doc).
    """

    def __init__(
        self,
        lock: str,
        *,
        redis: str | None = None,
        cluster: bool = False,
        redlock: Sequence[str] | None = None,
        identity: str | None = None,
        ttl_s: float = 10.0,
        renew_interval_s: float | None = None,
        renew_deadline_s: float | None = None,
        request_timeout_s: float | None = None,
        stop_work_s: float | None = None,
        priority: int = 0,
        key_prefix: str = "elector",
        on_started_leading: Callable[[Leadership], object] | None = None,
        on_stopped_leading: Callable[[StepDownReason], object] | None = None,
        on_new_leader: Callable[[str | None], object] | None = None,
        registry: CollectorRegistry | None = None,
        on_overrun: OnOverrun = "withhold",
        fail_fast: bool = False,
    ) -> None:
        if redis is not None and not isinstance(redis, str):
            raise ElectorConfigError(
                "redis",
                f"elector.sync.Elector takes a URL, got {type(redis).__name__}: its election runs on a "
                "thread of its own, on connections of its own (elector.Elector takes a redis.asyncio.Redis)",
            )
        if on_overrun not in ("withhold", "exit"):
            raise ElectorConfigError("on_overrun", f"must be 'withhold' or 'exit', got {on_overrun!r}")
        self._on_overrun = on_overrun
        self._core = api_elector.Elector(
            lock,
            redis=redis,
            cluster=cluster,
            redlock=redlock,
            identity=identity,
            ttl_s=ttl_s,
            renew_interval_s=renew_interval_s,
            renew_deadline_s=renew_deadline_s,
            request_timeout_s=request_timeout_s,
            stop_work_s=stop_work_s,
            priority=priority,
            key_prefix=key_prefix,
            on_started_leading=_in_thread(on_started_leading),
            on_stopped_leading=_in_thread(on_stopped_leading),
            on_new_leader=_in_thread(on_new_leader),
            registry=registry,
            fail_fast=fail_fast,
        )
        self.lock, self.identity, self.timing = self._core.lock, self._core.identity, self._core.timing
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard: OverrunGuard | None = None
        self._closed = False

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise refuse_pickling("elector.sync.Elector", self.lock)

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Elector:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the election's thread and contend.

        The Elector is closed at the interpreter's exit if the program has not closed it (a
        gunicorn or Celery worker that ends with `sys.exit`): the lease is released, not left
        to lapse.
        """
        self._core._process.check()
        self._warn_if_on_a_loop("start")
        if self._loop is not None:
            raise RuntimeError(f"the Elector of lock {self.lock!r} was already started")
        self._loop = loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name=f"elector:{self.lock}", daemon=True)
        self._thread.start()
        try:
            self._call(self._core.start())
        except BaseException:
            self._stop_loop()
            raise
        if self._on_overrun == "exit":
            self._guard = OverrunGuard(lock=self.lock, timing=self.timing)
            self._core._outcome_listeners.append(self._guard.renewed)  # re-armed at each renewal
            self._guard.start()
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        # Inherited by a forked child too: only the creator's process may release its lease.
        if not self._core._process.forked:
            self.close()

    def close(self) -> None:
        """Tell running bodies to stop, release a held lease, stop the election's thread."""
        self._core._process.check()  # a fork's copy must never release the parent's lease
        if self._loop is None or self._closed:
            return
        atexit.unregister(self._close_at_exit)
        if threading.current_thread() is self._thread:
            raise RuntimeError("close() from a callback would wait for itself: call it from another thread")
        self._closed = True
        try:
            self._call(self._core.aclose())
        finally:
            if self._guard is not None:
                self._guard.stop()
            self._stop_loop()

    def _stop_loop(self) -> None:
        assert self._loop is not None
        assert self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _warn_if_on_a_loop(self, method: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        warnings.warn(
            f"elector.sync.Elector.{method}() of lock {self.lock!r} called on a thread that runs an "
            "event loop: it blocks that loop while it waits (use elector.Elector in async code, or "
            "call this from a worker thread: asyncio.to_thread)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the election's loop and wait for it."""
        if self._loop is None or self._loop.is_closed():
            coro.close()
            raise RuntimeError(self._core._not_running())
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted (Ctrl-C, SIGTERM through `run`): the task goes too
            raise

    def _on_loop(self, call: Callable[[], object]) -> None:
        """Run `call` on the election's loop, soon (after what was scheduled before it)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(call)

    # -- observation and leadership ------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._core.is_leader  # refused in a fork's copy

    @property
    def releases_withheld(self) -> int:
        return self._core.releases_withheld

    def status(self) -> ElectionStatus:
        return self._core.status()

    def wait_for_leadership(self, *, timeout: float | None = None) -> Leadership:
        """Block until this process leads; the term (nothing is told to stop when it ends).

        `timeout`: seconds, then `elector.LeadershipTimeout` (it says whether Redis was reached).
        """
        self._core._process.check()
        self._warn_if_on_a_loop("wait_for_leadership")
        return self._call(self._core.wait_for_leadership(timeout=timeout))

    def leadership(
        self, *, resign_on_exit: bool = True, stand_back_s: float | None = None, timeout: float | None = None
    ) -> SyncLeadershipScope:
        """`with` this: block until this process leads, run the body as leader.

        When the term ends under the body, `lease.check()` raises `LeadershipLost`, and so does
        the end of the block if the body did not raise. A body that returns resigns the term
        (unless `resign_on_exit=False`), standing back `stand_back_s` (default: one ttl).
        `timeout` bounds the wait to lead (`elector.LeadershipTimeout`), never the body.
        """
        self._core._process.check()
        checked_stand_back(stand_back_s)
        checked_timeout(timeout)
        return SyncLeadershipScope(
            self, resign_on_exit=resign_on_exit, stand_back_s=stand_back_s, timeout=timeout
        )


class SyncLeadershipScope:
    """One `with elector.leadership()` block of a sync Elector: a thread's body inside a term."""

    def __init__(
        self, elector: Elector, *, resign_on_exit: bool, stand_back_s: float | None, timeout: float | None
    ) -> None:
        self._elector = elector
        self._resign_on_exit = resign_on_exit
        self._stand_back_s = stand_back_s
        self._timeout = timeout
        self._entered: tuple[_ThreadBody, Leadership] | None = None

    def __enter__(self) -> Leadership:
        if self._entered is not None:
            raise RuntimeError("enter each leadership() block once")
        core = self._elector._core
        core._process.check()
        self._elector._warn_if_on_a_loop("leadership")
        pending: list[tuple[_ThreadBody, Leadership]] = []

        async def enter() -> tuple[_ThreadBody, Leadership]:
            body = _ThreadBody()
            term = await core._enter_term(body, timeout_s=self._timeout)
            pending.append((body, term))  # same step as the registration
            return body, term

        try:
            self._entered = body, term = self._elector._call(enter())
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM) while waiting: a body registered meanwhile must not
            # hold up the step-down. Runs after the cancellation, which the loop takes first.
            def abandon() -> None:
                for entry in pending:
                    _leave(*entry)

            self._elector._on_loop(abandon)
            raise
        if self._elector._guard is not None:
            self._elector._guard.watch(body, term)
        return term

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._entered is not None
        body, term = self._entered
        # Unregister first, and in a call nothing can cancel: from now on a step-down neither
        # tells nor waits for us (nor ends the process for us: the guard forgets us before that).
        if self._elector._guard is not None:
            self._elector._guard.forget(body)
        self._elector._on_loop(lambda: _leave(body, term))
        # Not resigned: a block left by SIGTERM or Ctrl-C (the Elector's close follows and steps
        # down for `shutdown`), or by a `check()` that found the validity run out (the election
        # steps down for `lease_expired`): the log says what the exception says.
        expired = isinstance(exc, LeadershipLost) and term.remaining() <= 0.0
        ending = expired or isinstance(exc, SystemExit | KeyboardInterrupt)
        if body.lost is None and self._resign_on_exit and not ending:
            core = self._elector._core

            async def resign() -> None:
                if not term._scopes:  # the last block of the term
                    await core._resign(term, stand_back_s=self._stand_back_s, wait=True)

            self._elector._call(resign())
        if body.lost is not None:
            if exc is None:
                raise LeadershipLost(body.lost, lock=term.lock, fencing_token=term.fencing_token)
            if not isinstance(exc, LeadershipLost):
                exc.add_note(f"(raised after leadership ended: {body.lost})")


def _leave(body: _ThreadBody, term: Leadership) -> None:
    """On the loop: `body` left its term."""
    term._scopes.discard(body)
    if not body.exited.done():
        body.exited.set_result(None)


def _in_thread(callback: Callable[[Any], object] | None) -> Callable[[Any], Coroutine[Any, Any, None]] | None:
    """A sync callback as an async one that runs it in a worker thread (the loop never blocks)."""
    if callback is None:
        return None

    async def call(arg: Any) -> None:
        result = await asyncio.to_thread(callback, arg)
        if asyncio.iscoroutine(result):
            await result

    return call


def run(main: Callable[[], T]) -> T:
    """Call `main()` with SIGTERM turned into `SystemExit(143)`, so that it unwinds like Ctrl-C.

    The `with` blocks of the Elector and of `leadership()` then release the lease on their way
    out, instead of the process dying with it held. The previous handler is restored after.
    Call it from the main thread (Python delivers signals there only).
    """

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(SIGTERM_EXIT_CODE)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return main()
    finally:
        signal.signal(signal.SIGTERM, previous)
