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
  `stop(kill_now=True)` skips the grace (SIGKILL at once): for a lease that may already be gone.
* A `stop()` while a `start()` is in flight wins: a start still cleaning up the last run's
  leftovers does not spawn at all, and one already spawning is let finish and then stopped.
* With a `KeeperLink` (exec mode) the child is the keeper (elector/daemon/execmode/keeper.py), which runs the
  command in its own process group and kills it by the lease's deadline even if this process
  dies or stalls; `extend_validity()` feeds it the renewals. The keeper is transparent here: it
  ignores the group's SIGTERM and exits with the command's status.

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
import dataclasses
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from elector.daemon.execmode.keeper import KeeperLink
from elector.daemon.execmode.proctree import (
    HAVE_PROC,
    AwaitedChildren,
    Proc,
    SupervisorLogger,
    all_procs,
    become_subreaper,
    default_logger,
    read_proc,
    reap,
    send_signal,
)
from elector.daemon.execmode.reaper import OrphanReaper

__all__ = [
    "KILL_REAP_SLACK_S",
    "AwaitedChildren",
    "ChildExit",
    "ChildStartError",
    "ChildSupervisor",
    "OrphanReaper",
    "SupervisorLogger",
    "become_subreaper",
    "stop_budget_s",
]

#: How long `stop()` waits after SIGKILL for the tree to be gone and the child reaped.
KILL_REAP_SLACK_S = 0.1
_POLL_S = 0.01  # how often stop() looks at /proc while waiting for the tree to go


def stop_budget_s(kill_grace_s: float) -> float:
    """The longest `stop()` takes with this grace: the daemon adds it to its lease safety margin."""
    return kill_grace_s + KILL_REAP_SLACK_S


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


@dataclasses.dataclass(eq=False, slots=True)
class _Run:
    """One started child and what `stop()` needs to find its tree."""

    process: asyncio.subprocess.Process
    started_at: float
    #: The child's start time (clock ticks since boot): its descendants cannot be older.
    start_ticks: int
    #: Our children before the spawn: never part of this child's tree.
    foreign: frozenset[int]
    keeper: KeeperLink | None = None
    exited: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    #: Set by stop(kill_now=True): skip (or cut short) the grace and SIGKILL at once.
    hurry: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
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
        children: AwaitedChildren | None = None,
        logger: SupervisorLogger | None = None,
    ) -> None:
        self._children = AwaitedChildren() if children is None else children
        if not command:
            raise ValueError("the command is empty")
        if not (math.isfinite(kill_grace_s) and kill_grace_s >= 0):
            raise ValueError(f"kill_grace_s must be a finite number >= 0, not {kill_grace_s!r}")
        self.command = tuple(command)
        self.kill_grace_s = kill_grace_s
        self._on_exit = on_exit
        self._log = logger if logger is not None else default_logger()
        self._run: _Run | None = None
        #: The start() in flight (it runs as a task of its own, so that a cancelled caller never
        #: loses a spawned child); a stop() meanwhile waits for it and stops what it started.
        self._starting: asyncio.Task[bool] | None = None
        #: Set by a stop() during a start(): a start that has not spawned yet must not.
        self._start_aborted = False
        #: What the clean-up of an aborted start found: the stop() that aborted it reports it.
        self._aborted_cleanup: ChildExit | None = None
        self._stopping: asyncio.Task[ChildExit] | None = None

    @property
    def running(self) -> bool:
        """A child was started and has not been seen to exit yet."""
        return self._run is not None and not self._run.exited.is_set()

    @property
    def pid(self) -> int | None:
        return self._run.pid if self._run is not None and self.running else None

    async def start(
        self,
        *,
        env: Mapping[str, str],
        inherit_env: bool = True,
        keeper: KeeperLink | None = None,
        still_wanted: Callable[[], bool] | None = None,
    ) -> bool:
        """Start the command with `env` merged over os.environ (or alone: `inherit_env=False`, for
        a caller that must hide some of ours); ChildStartError if it cannot run.

        After a natural exit, first cleans up the previous run's leftovers as `stop()` would (so
        this may take up to `stop_budget_s(kill_grace_s)`). Returns False, having started nothing,
        when a `stop()` came meanwhile or `still_wanted()` (asked right before the spawn) says no.
        With `keeper`, the command runs under the keeper (the link is closed when the run ends).
        A cancelled caller does not cancel a spawn under way: the next `stop()` stops that child.
        RuntimeError if the child is running.
        """
        if self._starting is not None or self.running:
            raise RuntimeError("the child is running (or starting): await stop() first")
        self._start_aborted = False
        merged = {**os.environ, **env} if inherit_env else dict(env)
        self._starting = starting = asyncio.create_task(
            self._start(merged, keeper=keeper, still_wanted=still_wanted), name="elector-child-start"
        )
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            self._start_aborted = True  # not spawned yet: never; spawning: stop() will end it
            raise

    async def _start(
        self, env: Mapping[str, str], *, keeper: KeeperLink | None, still_wanted: Callable[[], bool] | None
    ) -> bool:
        try:
            cleaned = None
            if self._run is not None:
                # Leftovers of the last run must not overlap the new one, nor be taken for its tree.
                cleaned = await self._stop_run()
            if self._start_aborted or (still_wanted is not None and not still_wanted()):
                self._aborted_cleanup = cleaned
                if keeper is not None:
                    keeper.close()
                return False
            await self._spawn(env, keeper=keeper)
            return True
        finally:
            self._starting = None

    def _check_runnable(self, env: Mapping[str, str]) -> None:
        """Under a keeper the command is spawned later, by the keeper: refuse what cannot run now,
        with the error a direct spawn would give."""
        program = self.command[0]
        if shutil.which(program, path=env.get("PATH", os.defpath)) is not None:
            return
        reason = (
            "Permission denied"
            if os.sep in program and os.path.exists(program)
            else "No such file or directory"
        )
        raise ChildStartError(f"cannot start {program!r}: {reason}")

    async def _spawn(self, env: Mapping[str, str], *, keeper: KeeperLink | None) -> None:
        argv = self.command if keeper is None else tuple(keeper.argv(self.command))
        self._children.spawning += 1
        try:
            if keeper is not None:
                self._check_runnable(env)
            me = os.getpid()
            foreign = frozenset(proc.pid for proc in all_procs() if proc.ppid == me)
            started_at = time.monotonic()
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                pass_fds=() if keeper is None else (keeper.read_fd,),
            )
            self._children.waited.add(process.pid)
        except (OSError, ValueError, ChildStartError) as exc:
            if keeper is not None:
                keeper.close()
            if isinstance(exc, ChildStartError):
                raise
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ChildStartError(f"cannot start {self.command[0]!r}: {reason}") from exc
        finally:
            self._children.spawning -= 1
        if keeper is not None:
            keeper.spawned()
        info = read_proc(process.pid)
        run = _Run(process, started_at, info.start_ticks if info is not None else 0, foreign, keeper=keeper)
        run.watcher = asyncio.create_task(self._watch(run), name=f"elector-child-{process.pid}")
        self._run = run

    def extend_validity(self, valid_until: float) -> bool:
        """Pass a renewal's validity end to the running child's keeper; False if there is none or
        it could not take it now (see `KeeperLink.send`)."""
        run = self._run
        if run is None or run.keeper is None or run.exited.is_set() or run.stopping:
            return False
        return run.keeper.send(valid_until)

    async def _watch(self, run: _Run) -> None:
        returncode = await run.process.wait()
        run.ended_at = time.monotonic()
        self._children.waited.discard(run.pid)
        run.exited.set()
        if run.keeper is not None:
            run.keeper.close()  # the keeper is gone: nobody reads the pipe any more
        if run.stopping:
            return
        exit_ = _child_exit(run.pid, returncode, stopped_by_us=False, runtime_s=run.ended_at - run.started_at)
        run.natural_exit = exit_
        try:
            self._on_exit(exit_)
        except Exception:  # the callback's bug must not kill the watcher, nor go unseen
            self._log.error("child_on_exit_failed", pid=run.pid, exc_info=True)

    async def stop(self, *, kill_now: bool = False) -> ChildExit | None:
        """Stop the child and its tree; see the module doc for the guarantees and the time bound.

        `kill_now`: SIGKILL at once, no grace (also cuts short a stop already in its grace).
        Returns how the run ended (after a natural exit: the `on_exit` value with the survivors of
        the clean-up), or None if no run was started since the last stop. Concurrent calls share
        one stop; a cancelled caller does not interrupt it. A start() in flight does not spawn if
        it has not yet; if it has, it is let finish and what it started is stopped.
        """
        starting = self._starting
        if starting is not None:
            self._start_aborted = True
            if kill_now:
                self._hurry()  # the start may be cleaning up the last run's leftovers
            with contextlib.suppress(Exception):  # a start error is the starter's to report
                await asyncio.shield(starting)
        if kill_now:
            self._hurry()
        result = await self._stop_run()
        if result is None:
            result, self._aborted_cleanup = self._aborted_cleanup, None
        return result

    def _hurry(self) -> None:
        if self._run is not None:
            self._run.hurry.set()

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
            if run.keeper is not None:
                run.keeper.close()
            self._run = None
            self._stopping = None

    async def _terminate(self, run: _Run) -> tuple[int, ...]:
        if self.kill_grace_s > 0 and not run.hurry.is_set():
            grace_deadline = time.monotonic() + self.kill_grace_s
            if not await self._signal_until_gone(run, signal.SIGTERM, deadline=grace_deadline):
                return ()
            if run.hurry.is_set():
                self._log.warning("child_kill_now", pid=run.pid, detail="the grace was cut short")
            else:
                self._log.warning("child_kill_after_grace", pid=run.pid, kill_grace_s=self.kill_grace_s)
        kill_deadline = time.monotonic() + KILL_REAP_SLACK_S
        return await self._signal_until_gone(run, signal.SIGKILL, deadline=kill_deadline)

    async def _signal_until_gone(self, run: _Run, sig: signal.Signals, *, deadline: float) -> tuple[int, ...]:
        """Signal the tree, then each newcomer once; the pids still alive at `deadline` (or
        when a SIGTERM phase is hurried: then SIGKILL follows at once)."""
        signalled: set[int] = set()
        tree = self._tree(run)
        # One killpg reaches the group atomically, even members forked while we scanned. Only
        # while a member is seen: then the group's id cannot have been reused by a stranger.
        group = [proc.pid for proc in tree if proc.pgid == run.pid and proc.alive]
        if group and send_signal(run.pid, sig, group=True):
            signalled.update(group)
        while True:
            me, alive = os.getpid(), []
            for proc in tree:
                if not proc.alive:
                    if proc.ppid == me and proc.pid != run.pid and proc.pid not in self._children.waited:
                        reap(proc.pid)  # an orphan reparented to us: nobody else will
                    continue
                alive.append(proc.pid)
                if proc.pid not in signalled:
                    signalled.add(proc.pid)
                    send_signal(proc.pid, sig)
            if not alive and run.exited.is_set():
                return ()
            now = time.monotonic()
            if now >= deadline or (alive and sig is signal.SIGTERM and run.hurry.is_set()):
                return tuple(sorted(alive))
            await asyncio.sleep(min(_POLL_S, deadline - now))
            tree = self._tree(run)

    def _tree(self, run: _Run) -> list[Proc]:
        """The child's session, plus what left it and got reparented to us (see the module doc)."""
        if not HAVE_PROC:
            # Without /proc only the group can be followed: is anyone left in it?
            if send_signal(run.pid, 0, group=True):
                return [Proc(run.pid, "?", -1, run.pid, run.pid, 0)]
            return []
        me = os.getpid()
        return [
            proc
            for proc in all_procs()
            if proc.sid == run.pid
            or (
                proc.ppid == me
                and proc.pid not in run.foreign
                and proc.pid not in self._children.waited
                and proc.start_ticks >= run.start_ticks
            )
        ]
