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
* `park()` starts a keeper ahead of time, while idle; the next `start()` with a keeper sends it
  the start order instead of starting an interpreter (see keeper.py), saving that much of a
  handoff. A parked keeper that is gone or cannot take the order is replaced by a fresh one.
* Stopping does not poll: exits are seen through pidfds and the child's own exit, and the tree
  is looked at again after each (treestop.py).
* A keeper that exits without reporting its tree gone (SIGKILLed alone, an OOM kill) leaves the
  command unwatched: its tree is killed at once (SIGKILL, no grace), whatever the caller's policy
  (`keeper_lost` in the logs, `on_keeper_lost`), before `on_exit` hears of it. The command gets
  PR_SET_PDEATHSIG towards its keeper too, so it is usually dead already. A keeper that dies of
  the stop's own SIGKILL of the group (it is a member) is not lost: `keeper_killed_by_stop`, info.

Reaping: asyncio waits for the child by pid (a thread per child in Python 3.11, unless the daemon
switched it to pidfds: `watch_children_with_pidfds`, 3.12's default), so nothing here
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

from elector.daemon.execmode.child import (
    KILL_REAP_SLACK_S,
    ChildExit,
    ChildStartError,
    Parked,
    Run,
    child_exit,
    stop_budget_s,
)
from elector.daemon.execmode.keeper_link import KeeperLink
from elector.daemon.execmode.proctree import (
    AwaitedChildren,
    SupervisorLogger,
    all_procs,
    become_subreaper,
    default_logger,
    read_proc,
    send_signal,
    watch_children_with_pidfds,
)
from elector.daemon.execmode.reaper import OrphanReaper
from elector.daemon.execmode.treestop import TreeStopper

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
    "watch_children_with_pidfds",
]


class ChildSupervisor:
    """Starts the command on demand and stops it with its whole process tree. See the module doc.

    `on_exit` is called exactly once, from the event loop, when the child exits before `stop()`
    began; the caller then decides what to do: `stop()` kills what the child left behind, and so
    does `start()` before it starts the command again. `on_keeper_lost` is called when a keeper
    exited without reporting its tree gone (its tree is then being killed at once).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        kill_grace_s: float,
        on_exit: Callable[[ChildExit], None],
        children: AwaitedChildren | None = None,
        logger: SupervisorLogger | None = None,
        on_keeper_lost: Callable[[], None] | None = None,
    ) -> None:
        self._children = AwaitedChildren() if children is None else children
        if not command:
            raise ValueError("the command is empty")
        if not (math.isfinite(kill_grace_s) and kill_grace_s >= 0):
            raise ValueError(f"kill_grace_s must be a finite number >= 0, not {kill_grace_s!r}")
        self.command = tuple(command)
        self.kill_grace_s = kill_grace_s
        self._on_exit = on_exit
        self._on_keeper_lost = on_keeper_lost
        self._log = logger if logger is not None else default_logger()
        self._stopper = TreeStopper(kill_grace_s=kill_grace_s, children=self._children, logger=self._log)
        self._run: Run | None = None
        #: The start() in flight (it runs as a task of its own, so that a cancelled caller never
        #: loses a spawned child); a stop() meanwhile waits for it and stops what it started.
        self._starting: asyncio.Task[bool] | None = None
        #: Set by a stop() during a start(): a start that has not spawned yet must not.
        self._start_aborted = False
        #: What a clean-up found that no stop() returned yet (of an aborted start, or of a lost
        #: keeper's tree): the next stop() reports it.
        self._unreported: ChildExit | None = None
        self._stopping: asyncio.Task[ChildExit] | None = None
        self._parked: Parked | None = None
        #: The watchers of stopped runs whose keeper reported its tree gone but had not exited yet
        #: (the stop does not wait for that exit: see treestop.py); `settle()` waits for them.
        self._exiting: set[asyncio.Task[None]] = set()

    @property
    def idle(self) -> bool:
        """No run (not even an exited one awaiting its clean-up), start or stop under way."""
        return self._run is None and self._starting is None and self._stopping is None

    @property
    def parked_pid(self) -> int | None:
        return self._parked.process.pid if self._parked is not None else None

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
        if self._run is None and keeper is not None and self._parked is not None:
            # Nothing to clean up and a keeper parked: the start is one write to it, done here
            # (nothing in it awaits, so nothing can come between), without a task and the loop
            # iteration that would start it. Otherwise (it does not fit, it died) as below.
            if still_wanted is not None and not still_wanted():
                keeper.close()
                return False
            try:
                self._check_runnable(merged)
            except ChildStartError:
                keeper.close()
                raise
            if self._launch_parked(merged, keeper=keeper):
                return True
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
                self._unreported = cleaned or self._unreported
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
        try:
            if keeper is not None:
                self._check_runnable(env)
                if self._launch_parked(env, keeper=keeper):
                    return
            process, foreign, started_at = await self._exec(env, keeper=keeper)
        except (OSError, ValueError, ChildStartError) as exc:
            if keeper is not None:
                keeper.close()
            if isinstance(exc, ChildStartError):
                raise
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ChildStartError(f"cannot start {self.command[0]!r}: {reason}") from exc
        info = read_proc(process.pid)
        self._begin(Run(process, started_at, info.start_ticks if info else 0, foreign, keeper=keeper))

    async def _exec(
        self, env: Mapping[str, str], *, keeper: KeeperLink | None
    ) -> tuple[asyncio.subprocess.Process, frozenset[int], float]:
        """Start the command, or the keeper that runs it; (process, our other children, when)."""
        argv = self.command if keeper is None else tuple(keeper.argv(self.command))
        self._children.spawning += 1
        try:
            me = os.getpid()
            foreign = frozenset(proc.pid for proc in all_procs() if proc.ppid == me)
            started_at = time.monotonic()
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                pass_fds=() if keeper is None else keeper.pass_fds,
            )
            self._children.waited.add(process.pid)
        finally:
            self._children.spawning -= 1
        if keeper is not None:
            keeper.spawned()
        return process, foreign, started_at

    def _begin(self, run: Run) -> None:
        self._unreported = None  # a new run: what the last one's clean-up found is old news
        run.watcher = asyncio.create_task(self._watch(run), name=f"elector-child-{run.pid}")
        self._run = run

    # -- the parked keeper ---------------------------------------------------------------------

    async def park(self, *, keeper: KeeperLink, env: Mapping[str, str]) -> bool:
        """Start a keeper (`KeeperLink.parked()`) that waits for the next `start()`; `env` is the
        keeper's own environment (the command gets the one `start()` is given). False, starting
        nothing, unless idle with nothing parked; OSError if it cannot be started."""
        if not keeper.waiting or not self.idle or self._parked is not None:
            keeper.close()
            return False
        try:
            process, foreign, _ = await self._exec(env, keeper=keeper)
        except BaseException:
            keeper.close()
            raise
        info = read_proc(process.pid)
        parked = Parked(process, keeper, info.start_ticks if info else 0, foreign)
        if not self.idle or self._parked is not None:  # a start or another park came meanwhile
            self._discard(parked)
            return False
        parked.watcher = asyncio.create_task(self._watch_parked(parked), name=f"elector-parked-{process.pid}")
        self._parked = parked
        return True

    def _launch_parked(self, env: Mapping[str, str], *, keeper: KeeperLink) -> bool:
        """Hand the parked keeper (if it fits `keeper`) its start order and make it the run."""
        parked, self._parked = self._parked, None
        if parked is None:
            return False
        fits = (parked.link.kill_grace_s, parked.link.margin_s) == (keeper.kill_grace_s, keeper.margin_s)
        if parked.watcher is not None:
            parked.watcher.cancel()
        assert keeper.valid_until is not None, "a fresh link carries the first validity end"
        if (
            not fits
            or parked.process.returncode is not None
            or not parked.link.launch(valid_until=keeper.valid_until, env=env)
        ):
            self._discard(parked)
            return False
        keeper.close()  # its pipe is not used: the parked keeper's is
        run = Run(parked.process, time.monotonic(), parked.start_ticks, parked.foreign, keeper=parked.link)
        self._begin(run)
        return True

    async def _watch_parked(self, parked: Parked) -> None:
        await parked.process.wait()
        if self._parked is parked:  # it died while parked (killed, or no interpreter): forget it
            self._parked = None
            self._log.warning("parked_keeper_exited", pid=parked.process.pid, code=parked.process.returncode)
        self._children.waited.discard(parked.process.pid)
        parked.link.close()

    def _discard(self, parked: Parked) -> None:
        """Let a parked keeper go: EOF on its pipe ends it (a task reaps it)."""
        parked.link.close()
        if parked.process.returncode is None:
            parked.watcher = asyncio.create_task(self._watch_parked(parked), name="elector-unparked")
        else:
            self._children.waited.discard(parked.process.pid)

    async def unpark(self) -> None:
        """End the parked keeper, if any (it starts nothing), and wait until it is gone."""
        parked, self._parked = self._parked, None
        if parked is None:
            return
        self._discard(parked)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_REAP_SLACK_S * 10):
                await parked.process.wait()
            return
        send_signal(parked.process.pid, signal.SIGKILL)  # stuck: it has started nothing

    async def settle(self) -> None:
        """Wait until the keepers of stopped runs have exited too (each reported its tree gone,
        so only its own exit was left), bounded like `unpark()`: a daemon about to exit leaves
        no keeper behind, not even a dying one."""
        if not self._exiting:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_REAP_SLACK_S * 10):
                await asyncio.wait(set(self._exiting))

    def extend_validity(self, valid_until: float) -> bool:
        """Pass a renewal's validity end to the running child's keeper; False if there is none or
        it could not take it now (see `KeeperLink.send`)."""
        run = self._run
        if run is None or run.keeper is None or run.exited.is_set() or run.stopping:
            return False
        return run.keeper.send(valid_until)

    async def _watch(self, run: Run) -> None:
        returncode = await run.process.wait()
        run.ended_at = time.monotonic()
        self._children.waited.discard(run.pid)
        run.exited.set()
        run.wake.set()
        keeper_lost = deadline_passed = False
        if run.keeper is not None:
            keeper_lost, deadline_passed = not run.keeper.tree_gone(), run.keeper.deadline_passed()
            run.keeper.close()  # the keeper is gone: nobody reads the pipe any more
        if keeper_lost and run.killed_by_stop and returncode == -signal.SIGKILL:
            # Our own stop's SIGKILL of the group reached the keeper before it could report:
            # not a lost keeper (no ERROR, nothing counted). The stop still follows the escaped
            # chains itself, since the keeper no longer does.
            run.keeper_lost = True
            self._log.info("keeper_killed_by_stop", pid=run.pid)
        elif keeper_lost:
            self._keeper_lost(run, returncode)
        if run.stopping:
            return
        exit_ = child_exit(run.pid, returncode, stopped_by_us=False, runtime_s=run.ended_at - run.started_at)
        run.natural_exit = exit_ = dataclasses.replace(
            exit_, keeper_lost=keeper_lost, deadline_passed=deadline_passed
        )
        if keeper_lost:
            # Whatever the caller decides (a restart waits for its back-off), the tree goes now;
            # the next stop() (or start()) waits for this one and reports what it found.
            run.report_later = True
            self._stop_task(run)
        try:
            self._on_exit(exit_)
        except Exception:  # the callback's bug must not kill the watcher, nor go unseen
            self._log.error("child_on_exit_failed", pid=run.pid, exc_info=True)

    def _keeper_lost(self, run: Run, returncode: int) -> None:
        """The keeper exited without reporting its tree gone: nothing watches the command now."""
        self._log.error(
            "keeper_lost",
            pid=run.pid,
            code=returncode,
            detail="the keeper exited without reporting its command's tree gone (killed alone?)",
            effect="the command's group and session are killed at once",
        )
        run.keeper_lost = True  # the stop follows escaped chains itself (treestop.py)
        run.hurry.set()  # a stop in its grace goes to SIGKILL now; a new one skips the grace
        run.wake.set()
        if self._on_keeper_lost is not None:
            try:
                self._on_keeper_lost()
            except Exception:
                self._log.error("keeper_lost_callback_failed", pid=run.pid, exc_info=True)

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
        unreported, self._unreported = self._unreported, None
        return unreported if result is None else result

    def _hurry(self) -> None:
        if self._run is not None:
            self._run.hurry.set()
            self._run.wake.set()

    async def _stop_run(self) -> ChildExit | None:
        if self._stopping is None:
            if self._run is None:
                return None
            self._stop_task(self._run)
        assert self._stopping is not None
        return await asyncio.shield(self._stopping)

    def _stop_task(self, run: Run) -> None:
        if self._stopping is None:
            # Set before any await, so that an exit seen from now on is not reported to on_exit.
            run.stopping = True
            self._stopping = asyncio.create_task(self._stop(run), name=f"elector-stop-{run.pid}")

    async def _stop(self, run: Run) -> ChildExit:
        try:
            # After a natural exit this only cleans up leftovers: immediate when there are none.
            survivors = await self._stopper.terminate(run)
            runtime_s = (run.ended_at or time.monotonic()) - run.started_at
            ended = run.natural_exit or child_exit(
                run.pid, run.returncode, stopped_by_us=True, runtime_s=runtime_s
            )
            result = dataclasses.replace(ended, survivors=survivors)
            if survivors:
                self._log.error("child_tree_survived_kill", pid=run.pid, survivors=list(survivors))
            if run.returncode is None and run.watcher is not None:
                # A child stuck past SIGKILL: asyncio still reaps it whenever it dies (its pid
                # stays protected from the reaper); nobody is left to report that exit.
                run.watcher.cancel()
            elif run.process.returncode is None and run.watcher is not None and not run.watcher.done():
                # A keeper that reported its tree gone and is exiting: its watcher reaps it.
                self._exiting.add(run.watcher)
                run.watcher.add_done_callback(self._exiting.discard)
            if run.report_later:
                self._unreported = result
            return result
        finally:
            if run.keeper is not None:
                run.keeper.close()
            self._run = None
            self._stopping = None
