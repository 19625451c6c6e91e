"""Exec mode's child supervisor: run one command while this replica leads, and leave nothing behind.

`elector run -- COMMAND` must guarantee that, once it stops leading, no process of the old
leader's workload keeps running: the lease goes to another replica only after `stop()` returns.
So stopping is about the whole process tree, not the one pid we started:

* The child gets its own session (and process group). `stop()` sends SIGTERM to the group, then
  SIGKILL after `kill_grace_s`, and waits until every member is gone - zombies count as gone, they
  run no code. Members that moved to another process group of the session (`set -m` shells) are
  found in /proc by session id and signalled one by one.
* Processes that leave the session (`setsid`, double-forking daemons) cannot be found by group or
  session. With `become_subreaper()` such orphans are reparented to this process instead of to
  init, so `stop()` also treats as part of the tree every process whose parent is us, that started
  after the child, that was not already our child when it was started, and that no other
  supervisor waits for.
* `stop()` is bounded: after SIGKILL it waits at most `KILL_REAP_SLACK_S` more, so it returns
  within `stop_budget_s(kill_grace_s)` (plus scheduling noise). What is still alive then (a process
  stuck in uninterruptible sleep) is logged as an error and reported in `ChildExit.survivors`.

Reaping: asyncio waits for the child by pid (a thread per child in Python 3.11), so nothing here
ever calls `waitpid(-1)`, which would steal the child's exit status. Orphans reparented to us are
reaped by pid: by `stop()` for the tree it kills, and by `OrphanReaper` for everything else that
dies while we are PID 1 or a subreaper. Both skip the pids asyncio waits on for a supervisor, and
the reaper does not sweep while a child is being spawned (its pid is not known yet).

Assumption: this process starts no other children (true of `elector run`): another child could
be reaped by the `OrphanReaper` before its owner waits for it (unless `exclude`d), or be taken
for part of the tree if started while the child runs. So: one `ChildSupervisor` per process.

Logs go to a structlog-style logger (`.info/.warning/.error(event, **fields)`: `SupervisorLogger`;
a plain `logging.Logger` takes no such fields), by default `elector.supervisor`'s. Starts, exits and
stops are the caller's to log (it has the context); this logs escalations, survivors and reaping.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, Self

import structlog

#: How long `stop()` waits after SIGKILL for the tree to be gone and the child reaped.
KILL_REAP_SLACK_S = 0.1
_POLL_S = 0.01  # how often stop() looks at /proc while waiting for the tree to go
_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")
_HAVE_PROC = (_PROC / "self" / "stat").exists()


def stop_budget_s(kill_grace_s: float) -> float:
    """The longest `stop()` takes with this grace: the daemon adds it to its lease safety margin."""
    return kill_grace_s + KILL_REAP_SLACK_S


class SupervisorLogger(Protocol):
    """The part of a structlog BoundLogger the supervisor uses."""

    def info(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def warning(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def error(self, event: str, *args: Any, **kw: Any) -> Any: ...


def _default_logger() -> SupervisorLogger:
    logger: SupervisorLogger = structlog.stdlib.get_logger("elector.supervisor")
    return logger


def become_subreaper(*, logger: SupervisorLogger | None = None) -> bool:
    """Make orphaned descendants reparent to this process (Linux); False, with a warning, elsewhere.

    Permanent for the process (and not inherited by its children).
    """
    log = logger if logger is not None else _default_logger()
    if not sys.platform.startswith("linux"):
        log.warning("subreaper_unsupported", platform=sys.platform, effect="escaped daemons are not killed")
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    # prctl is variadic: pass unsigned longs so that no register holds garbage in its upper half.
    args = (ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, *args) != 0:
        log.warning("subreaper_failed", error=os.strerror(ctypes.get_errno()))
        return False
    return True


class ChildStartError(Exception):
    """The command could not be started (not found, not executable, no permission)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChildExit:
    """How a run of the child ended."""

    pid: int
    #: The child's exit status as asyncio reports it (negative: killed by a signal); None if the
    #: child could not be reaped within the stop budget.
    returncode: int | None
    #: The signal that killed the child, if one did.
    signal: int | None
    #: True when `stop()` began before the child was seen to exit (then `on_exit` is not called).
    stopped_by_us: bool
    runtime_s: float
    #: Pids of the tree still alive when `stop()` gave up; empty when everything is gone.
    survivors: tuple[int, ...] = ()


def _child_exit(pid: int, returncode: int | None, *, stopped_by_us: bool, runtime_s: float) -> ChildExit:
    killed_by = -returncode if returncode is not None and returncode < 0 else None
    return ChildExit(pid, returncode, killed_by, stopped_by_us, runtime_s)


@dataclasses.dataclass(frozen=True, slots=True)
class _Proc:
    """The fields of /proc/<pid>/stat the supervisor needs."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    start_ticks: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def _read_proc(pid: int) -> _Proc | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
        # The command name (field 2) may hold blanks and parentheses: split after the last ')'.
        fields = raw[raw.rindex(b")") + 2 :].split()
        return _Proc(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (OSError, ValueError, IndexError):  # gone meanwhile (ENOENT, ESRCH), or not Linux's format
        return None


def _all_procs() -> list[_Proc]:
    try:
        names = os.listdir(_PROC)
    except OSError:
        return []
    return [proc for name in names if name.isdigit() and (proc := _read_proc(int(name))) is not None]


class ChildRegistry:
    """The children asyncio waits for on behalf of supervisors (no one else may reap them), and
    how many spawns are in flight (whose pids are not known yet).

    Reaping is process-wide, so a supervisor and an `OrphanReaper` of one process must share one
    registry: pass the same object to both.
    """

    def __init__(self) -> None:
        self.waited: set[int] = set()
        self.spawning = 0


def _send(pid: int, sig: int, *, group: bool = False) -> bool:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):  # gone meanwhile; or not ours to signal
        return False
    return True


def _reap(pid: int) -> int | None:
    """Collect one zombie child by pid; its wait status, or None if it was not ours to collect."""
    try:
        found, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped meanwhile by someone else
        return None
    return status if found else None


@dataclasses.dataclass(eq=False, slots=True)
class _Run:
    """One started child and what `stop()` needs to find its tree."""

    process: asyncio.subprocess.Process
    started_at: float
    #: The child's start time (clock ticks since boot): its descendants cannot be older.
    start_ticks: int
    #: Our children before the spawn: never part of this child's tree.
    foreign: frozenset[int]
    exited: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    watcher: asyncio.Task[None] | None = None
    ended_at: float | None = None
    stopping: bool = False
    natural_exit: ChildExit | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


class ChildSupervisor:
    """Starts the command on demand and stops it with its whole process tree. See the module doc.

    `on_exit` is called exactly once, from the event loop, when the child exits before `stop()`
    began; the caller then decides what to do: `stop()` kills what the child left behind, and so
    does `start()` before it starts the command again.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        kill_grace_s: float,
        on_exit: Callable[[ChildExit], None],
        children: ChildRegistry | None = None,
        logger: SupervisorLogger | None = None,
    ) -> None:
        self._children = ChildRegistry() if children is None else children
        if not command:
            raise ValueError("the command is empty")
        if not (math.isfinite(kill_grace_s) and kill_grace_s >= 0):
            raise ValueError(f"kill_grace_s must be a finite number >= 0, not {kill_grace_s!r}")
        self.command = tuple(command)
        self.kill_grace_s = kill_grace_s
        self._on_exit = on_exit
        self._log = logger if logger is not None else _default_logger()
        self._run: _Run | None = None
        #: Set while a start() is in flight, so that a stop() meanwhile also stops what it starts.
        self._start_done: asyncio.Event | None = None
        self._stopping: asyncio.Task[ChildExit] | None = None

    @property
    def running(self) -> bool:
        """A child was started and has not been seen to exit yet."""
        return self._run is not None and not self._run.exited.is_set()

    @property
    def pid(self) -> int | None:
        return self._run.pid if self._run is not None and self.running else None

    async def start(self, *, env: Mapping[str, str], inherit_env: bool = True) -> None:
        """Start the command with `env` merged over os.environ (or alone: `inherit_env=False`, for
        a caller that must hide some of ours); ChildStartError if it cannot run.

        After a natural exit, first cleans up the previous run's leftovers as `stop()` would (so
        this may take up to `stop_budget_s(kill_grace_s)`). RuntimeError if the child is running.
        """
        if self._start_done is not None or self.running:
            raise RuntimeError("the child is running (or starting): await stop() first")
        self._start_done = done = asyncio.Event()
        try:
            if self._run is not None:
                # Leftovers of the last run must not overlap the new one, nor be taken for its tree.
                await self._stop_run()
            await self._spawn({**os.environ, **env} if inherit_env else dict(env))
        finally:
            self._start_done = None
            done.set()

    async def _spawn(self, env: Mapping[str, str]) -> None:
        self._children.spawning += 1
        try:
            me = os.getpid()
            foreign = frozenset(proc.pid for proc in _all_procs() if proc.ppid == me)
            started_at = time.monotonic()
            process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
            self._children.waited.add(process.pid)
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ChildStartError(f"cannot start {self.command[0]!r}: {reason}") from exc
        finally:
            self._children.spawning -= 1
        info = _read_proc(process.pid)
        run = _Run(process, started_at, info.start_ticks if info is not None else 0, foreign)
        run.watcher = asyncio.create_task(self._watch(run), name=f"elector-child-{process.pid}")
        self._run = run

    async def _watch(self, run: _Run) -> None:
        returncode = await run.process.wait()
        run.ended_at = time.monotonic()
        self._children.waited.discard(run.pid)
        run.exited.set()
        if run.stopping:
            return
        exit_ = _child_exit(run.pid, returncode, stopped_by_us=False, runtime_s=run.ended_at - run.started_at)
        run.natural_exit = exit_
        try:
            self._on_exit(exit_)
        except Exception:  # the callback's bug must not kill the watcher, nor go unseen
            self._log.error("child_on_exit_failed", pid=run.pid, exc_info=True)

    async def stop(self) -> ChildExit | None:
        """Stop the child and its tree; see the module doc for the guarantees and the time bound.

        Returns how the run ended (after a natural exit: the `on_exit` value with the survivors of
        the clean-up), or None if no run was started since the last stop. Concurrent calls share
        one stop; a cancelled caller does not interrupt it. A start() in flight is let finish first.
        """
        if self._start_done is not None:
            await self._start_done.wait()
        return await self._stop_run()

    async def _stop_run(self) -> ChildExit | None:
        if self._stopping is None:
            run = self._run
            if run is None:
                return None
            # Set before any await, so that an exit seen from now on is not reported to on_exit.
            run.stopping = True
            self._stopping = asyncio.create_task(self._stop(run), name=f"elector-stop-{run.pid}")
        return await asyncio.shield(self._stopping)

    async def _stop(self, run: _Run) -> ChildExit:
        try:
            # After a natural exit this only cleans up leftovers: immediate when there are none.
            survivors = await self._terminate(run)
            runtime_s = (run.ended_at or time.monotonic()) - run.started_at
            ended = run.natural_exit or _child_exit(
                run.pid, run.process.returncode, stopped_by_us=True, runtime_s=runtime_s
            )
            result = dataclasses.replace(ended, survivors=survivors)
            if survivors:
                self._log.error("child_tree_survived_kill", pid=run.pid, survivors=list(survivors))
            if not run.exited.is_set() and run.watcher is not None:
                # A child stuck past SIGKILL: asyncio still reaps it whenever it dies (its pid
                # stays protected from the reaper); nobody is left to report that exit.
                run.watcher.cancel()
            return result
        finally:
            self._run = None
            self._stopping = None

    async def _terminate(self, run: _Run) -> tuple[int, ...]:
        if self.kill_grace_s > 0:
            grace_deadline = time.monotonic() + self.kill_grace_s
            if not await self._signal_until_gone(run, signal.SIGTERM, deadline=grace_deadline):
                return ()
            self._log.warning("child_kill_after_grace", pid=run.pid, kill_grace_s=self.kill_grace_s)
        kill_deadline = time.monotonic() + KILL_REAP_SLACK_S
        return await self._signal_until_gone(run, signal.SIGKILL, deadline=kill_deadline)

    async def _signal_until_gone(self, run: _Run, sig: signal.Signals, *, deadline: float) -> tuple[int, ...]:
        """Signal the tree, then each newcomer once; the pids still alive at `deadline`."""
        signalled: set[int] = set()
        tree = self._tree(run)
        # One killpg reaches the group atomically, even members forked while we scanned. Only
        # while a member is seen: then the group's id cannot have been reused by a stranger.
        group = [proc.pid for proc in tree if proc.pgid == run.pid and proc.alive]
        if group and _send(run.pid, sig, group=True):
            signalled.update(group)
        while True:
            me, alive = os.getpid(), []
            for proc in tree:
                if not proc.alive:
                    if proc.ppid == me and proc.pid != run.pid and proc.pid not in self._children.waited:
                        _reap(proc.pid)  # an orphan reparented to us: nobody else will
                    continue
                alive.append(proc.pid)
                if proc.pid not in signalled:
                    signalled.add(proc.pid)
                    _send(proc.pid, sig)
            if not alive and run.exited.is_set():
                return ()
            now = time.monotonic()
            if now >= deadline:
                return tuple(sorted(alive))
            await asyncio.sleep(min(_POLL_S, deadline - now))
            tree = self._tree(run)

    def _tree(self, run: _Run) -> list[_Proc]:
        """The child's session, plus what left it and got reparented to us (see the module doc)."""
        if not _HAVE_PROC:
            # Without /proc only the group can be followed: is anyone left in it?
            if _send(run.pid, 0, group=True):
                return [_Proc(run.pid, "?", -1, run.pid, run.pid, 0)]
            return []
        me = os.getpid()
        return [
            proc
            for proc in _all_procs()
            if proc.sid == run.pid
            or (
                proc.ppid == me
                and proc.pid not in run.foreign
                and proc.pid not in self._children.waited
                and proc.start_ticks >= run.start_ticks
            )
        ]


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
        children: ChildRegistry | None = None,
        logger: SupervisorLogger | None = None,
    ) -> None:
        self._children = ChildRegistry() if children is None else children
        self.sweep_interval_s = sweep_interval_s
        self._exclude = exclude
        self.reaped_total = 0
        self._log = logger if logger is not None else _default_logger()
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
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.sweep_interval_s)
            self._wake.clear()
            if self._children.spawning:
                # A child is being forked, its pid not yet protected: look again right after.
                await asyncio.sleep(_POLL_S)
                self._wake.set()
                continue
            self.sweep()

    def sweep(self) -> tuple[int, ...]:
        """Reap the zombie children that nobody waits for now; their pids."""
        if self._children.spawning:
            return ()
        excluded = None if self._exclude is None else self._exclude()
        protected = self._children.waited | ({excluded} if isinstance(excluded, int) else set(excluded or ()))
        me, reaped = os.getpid(), []
        for proc in _all_procs():
            orphan = proc.ppid == me and not proc.alive and proc.pid not in protected
            if orphan and _reap(proc.pid) is not None:
                reaped.append(proc.pid)
        if reaped:
            self.reaped_total += len(reaped)
            self._log.info("orphans_reaped", pids=reaped)
        return tuple(reaped)
