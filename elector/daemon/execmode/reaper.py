"""The orphan reaper: reaps zombies reparented to this process (as PID 1 or a subreaper).

It shares an `AwaitedChildren` with the child supervisor, so that it never reaps a child that
asyncio waits for on a supervisor's behalf (see elector/daemon/execmode/supervisor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterable
from typing import Self

from elector.daemon.execmode.proctree import (
    AwaitedChildren,
    SupervisorLogger,
    all_procs,
    default_logger,
    reap,
)

#: While a child is being spawned (its pid not yet protected), how soon to look again.
_POLL_S = 0.01


class OrphanReaper:
    """Reaps zombies reparented to this process (as PID 1 or a subreaper), by pid, on SIGCHLD and
    every `sweep_interval_s`; never a child asyncio waits for on behalf of a supervisor.

    Use as `async with OrphanReaper():` or `await start()` / `await stop()`. `exclude` names the
    pids (one, several or None) of other children that some code waits for by pid; a supervisor's
    child needs no excluding.
    """

    def __init__(
        self,
        *,
        sweep_interval_s: float = 5.0,
        exclude: Callable[[], int | Iterable[int] | None] | None = None,
        children: AwaitedChildren | None = None,
        logger: SupervisorLogger | None = None,
    ) -> None:
        self._children = AwaitedChildren() if children is None else children
        self.sweep_interval_s = sweep_interval_s
        self._exclude = exclude
        self.reaped_total = 0
        self._log = logger if logger is not None else default_logger()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._on_sigchld = False

    @property
    def uses_sigchld(self) -> bool:
        """Whether SIGCHLD triggers a sweep (otherwise only the periodic sweep runs)."""
        return self._on_sigchld

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the reaper is already running")
        self._on_sigchld = self._install_sigchld(asyncio.get_running_loop())
        self._task = asyncio.create_task(self._sweep_forever(), name="elector-orphan-reaper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if self._on_sigchld:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGCHLD)
            self._on_sigchld = False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.sweep()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _install_sigchld(self, loop: asyncio.AbstractEventLoop) -> bool:
        if signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, None):
            # Another handler (a SIGCHLD-based asyncio child watcher) would be replaced and break.
            self._log.warning("reaper_sigchld_taken", effect=f"sweeping every {self.sweep_interval_s}s only")
            return False
        try:
            loop.add_signal_handler(signal.SIGCHLD, self._wake.set)
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # not the main thread
            self._log.warning("reaper_no_sigchld", error=str(exc), sweep_interval_s=self.sweep_interval_s)
            return False
        return True

    async def _sweep_forever(self) -> None:
        deferred = False
        while True:
            # asyncio.timeout, not wait_for: in 3.11 wait_for loses a cancel that comes as the
            # wait ends (a SIGCHLD as stop() cancels us), and stop() would wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._children.spawning:
                # A child is being forked, its pid not yet protected: look again right after.
                await asyncio.sleep(_POLL_S)
                self._wake.set()
                continue
            if not deferred and _first_zombie_child() in self._protected():
                # A child asyncio waits for (a keeper that just exited): its thread reaps it in a
                # moment, and the zombie may hide others from the look. Sweep a little later, off
                # the path from the stop to the release that the exit may be part of. Once.
                deferred = True
                await asyncio.sleep(_POLL_S)
                self._wake.set()
                continue
            deferred = False
            self.sweep()

    def _protected(self) -> set[int]:
        excluded = None if self._exclude is None else self._exclude()
        return self._children.waited | ({excluded} if isinstance(excluded, int) else set(excluded or ()))

    def sweep(self) -> tuple[int, ...]:
        """Reap the zombie children that nobody waits for now; their pids."""
        if self._children.spawning:
            return ()
        protected = self._protected()
        if _first_zombie_child() is None:
            return ()  # no zombie child: nothing to reap, no /proc scan
        me, reaped = os.getpid(), []
        for proc in all_procs():
            orphan = proc.ppid == me and not proc.alive and proc.pid not in protected
            if orphan and reap(proc.pid) is not None:
                reaped.append(proc.pid)
        if reaped:
            self.reaped_total += len(reaped)
            self._log.info("orphans_reaped", pids=reaped)
        return tuple(reaped)


def _first_zombie_child() -> int | None:
    """A zombie child of ours (the first the kernel shows, not reaped), -1 when the look failed,
    None when there is none.

    waitid(WNOWAIT) shows one zombie child without reaping it. None at all: a sweep's /proc scan
    (every process's stat: milliseconds on a busy host) would find nothing. A zombie that asyncio
    waits for may hide others behind it.
    """
    try:
        seen = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None  # no children at all
    except OSError:
        return -1
    return None if seen is None or seen.si_pid == 0 else seen.si_pid
