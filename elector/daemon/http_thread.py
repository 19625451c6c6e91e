"""The daemon's HTTP side, off the election's event loop: its own thread, its own asyncio loop.

The rule (docs/design.md, "Isolation"): the election never waits on anyone else's work. Probes,
/metrics renders, a scanner pipelining thousands of requests or a slowloris crowd all run here,
in the thread `HttpThread` starts. The election side never calls into this thread and this
thread never calls into the election or touches its loop's objects; the only things they share:

- `PublishedStatus`: each election's latest `ElectionStatus` (a frozen dataclass), published by
  the election side at every cycle and hook (`publish`, one reference assignment, atomic under
  the GIL) and read here, aged to the reader's clock (`as_of`) exactly as `Election.status()`
  would compute it: a leader's remaining validity counts down, and when it runs out the
  snapshot says "not leading" without waiting for the next publication. A snapshot that is not
  republished (the election loop is stuck) ages, and liveness fails as it should.
- prometheus_client's metric objects, which are thread-safe: the election side increments
  counters under their short locks; this side renders the registry (in its own render thread,
  see `metrics_handler`).

What the two sides cannot avoid sharing is the GIL: CPU work here slows the election by at most
one switch interval (5 ms) per turn it waits for, never by a whole render or a whole flood.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence

from elector.daemon.http_server import Application, HttpServer, HttpSettings, HttpStats
from elector.election.clock import boottime
from elector.election.outcome import ElectionStatus

#: How long `stop` waits for the thread to wind down its servers before leaving it (a daemon
#: thread) to the process's exit.
STOP_WAIT_S = 5.0
#: How long `start` waits for the thread to bind its listeners.
START_WAIT_S = 10.0
#: The HTTP thread's CPU budget: at most this share of a core, measured over each window.
HTTP_CPU_SHARE = 0.5
CPU_WINDOW_S = 0.05
#: The governor's window while the thread is idle (used under IDLE_CPU_SHARE of the last one).
IDLE_WINDOW_S = 0.2
IDLE_CPU_SHARE = 0.02
#: The longest the governor idles the thread at once, seconds.
MAX_IDLE_S = 0.1


def as_of(status: ElectionStatus, now: float) -> ElectionStatus:
    """`status` as `Election.status()` would have computed it at `now`, had nothing happened since.

    Only time moves: a leader's validity and a holder's remaining time count down, leadership
    ends when the validity does. Anything else changes only through a new publication.
    """
    elapsed = now - status.now
    if elapsed <= 0:
        return status
    remaining = status.lease_remaining_s
    if remaining is not None:
        remaining = max(0.0, remaining - elapsed)
    is_leader = status.is_leader and remaining is not None and remaining > 0
    return dataclasses.replace(
        status,
        now=now,
        lease_remaining_s=remaining,
        is_leader=is_leader,
        fencing_token=status.fencing_token if is_leader else None,
    )


class PublishedStatus:
    """One election's latest status: `publish` on the election side, call from any thread.

    Calling it returns the snapshot aged to now (`as_of`): the status provider of the probes,
    /leader and the metrics' gauges, which therefore never reach into the election.
    """

    __slots__ = ("_clock", "_snapshot")

    def __init__(self, snapshot: ElectionStatus, *, clock: Callable[[], float] = boottime) -> None:
        self._snapshot = snapshot
        self._clock = clock

    def publish(self, snapshot: ElectionStatus) -> None:
        # One reference swap: a reader sees the old snapshot or the new one, whole.
        self._snapshot = snapshot

    @property
    def latest(self) -> ElectionStatus:
        """The snapshot as published (not aged)."""
        return self._snapshot

    def __call__(self) -> ElectionStatus:
        return as_of(self._snapshot, self._clock())


@dataclasses.dataclass(frozen=True, slots=True)
class Listener:
    """One server of the HTTP thread: an application on an address."""

    name: str
    app: Application
    settings: HttpSettings
    #: Where the server counts what its connection budget did (for the metrics).
    stats: HttpStats | None = None
    #: Work of the application that runs beside its server, in this thread (the compat
    #: listener's watch for a new leader); cancelled when the server stops.
    background: Callable[[], Coroutine[object, object, None]] | None = None


class HttpThread:
    """Serves listeners from a thread of their own with an asyncio loop of its own.

    `start()` returns once every listener is bound (or raises `HttpBindError`, with nothing left
    running); `stop()` closes them and ends the thread. Both may be awaited from the election's
    loop: they wait on the thread through futures, never by blocking the loop.
    """

    def __init__(self, listeners: Sequence[Listener], *, logger: logging.Logger | None = None) -> None:
        if not listeners:
            raise ValueError("HttpThread needs at least one listener")
        self._listeners = tuple(listeners)
        self._log = logging.getLogger("elector.http") if logger is None else logger
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._started: concurrent.futures.Future[dict[str, int]] = concurrent.futures.Future()
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._ports: dict[str, int] = {}

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def bound_port(self, name: str) -> int:
        """The port listener `name` listens on (the system's choice when port 0 was asked)."""
        if name not in self._ports:
            raise RuntimeError(f"HTTP listener {name!r} is not started")
        return self._ports[name]

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the HTTP thread is already started")
        self._thread = threading.Thread(target=self._main, name="elector-http", daemon=True)
        self._thread.start()
        async with asyncio.timeout(START_WAIT_S):
            self._ports = await asyncio.wrap_future(self._started)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run `callback` in the HTTP thread, on its loop (for tests and diagnostics)."""
        if self._loop is None:
            raise RuntimeError("the HTTP thread is not started")
        self._loop.call_soon_threadsafe(callback)

    async def stop(self) -> None:
        """Close every listener and end the thread; idempotent. A thread that does not end within
        STOP_WAIT_S (a handler stuck in C code) is left behind: it is a daemon thread."""
        loop, stop_requested = self._loop, self._stop_requested
        if self._thread is None or loop is None or stop_requested is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the thread has ended
            loop.call_soon_threadsafe(stop_requested.set)
        try:
            async with asyncio.timeout(STOP_WAIT_S):
                await asyncio.wrap_future(self._finished)
        except TimeoutError:
            self._log.warning("http_thread_stuck", extra={"waited_s": STOP_WAIT_S})
        self._ports = {}

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start() when it failed to start
            if not self._started.done():
                self._started.set_exception(exc)
            else:
                self._log.exception("http_thread_failed")
        finally:
            if not self._finished.done():
                self._finished.set_result(None)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        # A render of /metrics runs in the loop's default executor: one thread, this side's own.
        self._loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="elector-http-render")
        )
        self._stop_requested = asyncio.Event()
        servers: list[HttpServer] = []
        try:
            for listener in self._listeners:
                server = HttpServer(
                    listener.app, settings=listener.settings, logger=self._log, stats=listener.stats
                )
                await server.start()  # raises HttpBindError: the finally below closes the others
                servers.append(server)
            self._started.set_result(
                {
                    listener.name: server.bound_port
                    for listener, server in zip(self._listeners, servers, strict=True)
                }
            )
            governor = asyncio.create_task(_govern_cpu(), name="http-cpu-governor")
            beside = [
                asyncio.create_task(listener.background(), name=f"http-{listener.name}-background")
                for listener in self._listeners
                if listener.background is not None
            ]
            try:
                await self._stop_requested.wait()
            finally:
                governor.cancel()
                for task in beside:
                    task.cancel()
        finally:
            await asyncio.gather(*(server.stop() for server in servers), return_exceptions=True)


async def _govern_cpu() -> None:
    """Keep the HTTP thread to HTTP_CPU_SHARE of a core: past its budget, it idles (a blocking
    sleep of this thread, which releases the GIL) until its share is back under the budget.

    A flood that keeps the HTTP thread busy would otherwise take half the process's CPU and
    hold the GIL whenever the election wants it: on a loaded machine a
    pipelining flood can make a renewal's answer wait past its request timeout and the leader
    step down. Probes wait for the thread's next turn meanwhile, at most MAX_IDLE_S.
    """
    loop = asyncio.get_running_loop()
    cpu, wall = time.thread_time(), loop.time()
    window_s = IDLE_WINDOW_S
    while True:
        await asyncio.sleep(window_s)
        used, elapsed = time.thread_time() - cpu, loop.time() - wall
        # After an idle window a flood may have had all of it: paid back in full (at most that
        # window), so that the share holds from the flood's first moment.
        idle_s = min(max(MAX_IDLE_S, window_s), used / HTTP_CPU_SHARE - elapsed)
        if idle_s > 0:
            time.sleep(idle_s)  # noqa: ASYNC251 - deliberately blocking: this thread's own budget
        # An idle thread is looked at seldom (frequent wake-ups would be most of an idle daemon's
        # CPU); one that worked, every CPU_WINDOW_S. A flood is caught within IDLE_WINDOW_S.
        window_s = CPU_WINDOW_S if used > IDLE_CPU_SHARE * elapsed else IDLE_WINDOW_S
        cpu, wall = time.thread_time(), loop.time()
