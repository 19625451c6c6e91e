"""Stopping a run's whole process tree: SIGTERM, SIGKILL after the grace, and the wait until
every process of it is gone (see supervisor.py for the guarantees).

* One killpg reaches the group atomically; members that moved to another group of the session
  are found in /proc by session id, and orphans reparented to us (a subreaper) by parent, and
  signalled one by one; each newcomer once.
* Under a keeper, the stop first waits for the keeper's report that its tree is gone, which
  comes with the command's status right before the keeper exits (keeper.py): then no /proc scan
  is needed at all, and the stop returns without waiting for the keeper's own exit (asyncio
  reaps it a moment later). Without the report, it waits for the keeper's exit and looks.
* Exits are seen through pidfds (`ExitWatch`) and the child's own exit, the tree looked at again
  after each; without pidfds, every `_POLL_S`. After SIGKILL the wait is bounded by
  `KILL_REAP_SLACK_S`: what is still alive then is returned (survivors).
* A process still there at that deadline but already dying (a SIGKILL pending on it, or in its
  exit) is not a survivor unless it sleeps uninterruptibly (state D): it can never run its own
  code again, which is all that "gone" ever promised (a gone process's last writes may be in
  flight too). Under load, 200 SIGKILLed processes took over the 0.1 s slack just to be scheduled
  to die: reported as survivors, they withheld the release, and the lease was left to lapse.
  A process in D is still reported: its syscall (a write to a network file system) can complete
  long after.
* With its keeper lost (`Run.keeper_lost`), nobody else follows the command's escaped chains: the
  whole /proc table is read and the closure of the tree's descendants taken (keeper.py's
  `closure`, the keeper's own), so a chain whose parents live goes in one pass, within the
  SIGKILL slack.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from elector.daemon.execmode.child import KILL_REAP_SLACK_S, Run
from elector.daemon.execmode.keeper import closure
from elector.daemon.execmode.proctree import (
    HAVE_PROC,
    AwaitedChildren,
    ExitWatch,
    Proc,
    SupervisorLogger,
    all_procs,
    reap,
    send_signal,
)

#: Without pidfds: how often stop() looks at /proc while waiting for the tree to go.
_POLL_S = 0.01
#: With pidfds, exits wake stop() at once; this only bounds how long a process forked by a member
#: that ignores SIGTERM goes unsignalled (no exit announces it).
_RESCAN_S = 0.1
#: /proc/PID/stat's flags: the task is in do_exit().
_PF_EXITING = 0x4
#: SIGKILL's bit in /proc/PID/status's SigPnd (the thread's pending set) and ShdPnd (the process's).
_SIGKILL_PENDING = 1 << (signal.SIGKILL - 1)


def dying(pid: int) -> bool:
    """Whether `pid` can never run its own code again: gone, exiting, or a SIGKILL pending on it,
    and not in uninterruptible sleep. Unreadable for another reason (not Linux's format, a
    permission): not dying, the cautious answer."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
        with open(f"/proc/{pid}/status", "rb") as status_file:
            status = status_file.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False
    return dying_from(stat, status)


def dying_from(stat: bytes, status: bytes) -> bool:
    """`dying`, from the contents of /proc/PID/stat and /proc/PID/status."""
    try:
        fields = stat[stat.rindex(b")") + 2 :].split(maxsplit=8)
        state, flags = fields[0], int(fields[6])
        pending = 0
        for line in status.splitlines():
            if line.startswith((b"SigPnd:", b"ShdPnd:")):
                pending |= int(line.split()[1], 16)
    except (ValueError, IndexError):
        return False
    if state in (b"Z", b"X", b"x"):
        return True
    if state == b"D":
        return False
    return bool(flags & _PF_EXITING or pending & _SIGKILL_PENDING)


class TreeStopper:
    """Stops the process tree of a supervisor's runs (one per `ChildSupervisor`)."""

    def __init__(self, *, kill_grace_s: float, children: AwaitedChildren, logger: SupervisorLogger) -> None:
        self.kill_grace_s = kill_grace_s
        self._children = children
        self._log = logger

    async def terminate(self, run: Run) -> tuple[int, ...]:
        """SIGTERM (unless hurried or no grace), SIGKILL after the grace; the survivors' pids."""
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

    async def _signal_until_gone(self, run: Run, sig: signal.Signals, *, deadline: float) -> tuple[int, ...]:
        """Signal the tree, then each newcomer once; the pids still alive at `deadline` (or
        when a SIGTERM phase is hurried: then SIGKILL follows at once)."""
        signalled: set[int] = set()
        if sig is signal.SIGKILL and not run.killed_by_stop:
            # Ours only if the keeper is still alive and no other SIGKILL is on its way to it: a
            # keeper killed alone while the daemon was frozen is found dead (or dying) here, and
            # that loss must still be reported (supervisor.py, `_watch`).
            run.killed_by_stop = not run.exited.is_set() and not dying(run.pid)
        run.wake.clear()  # before the look: what happens from now on wakes the wait below
        # One killpg reaches the group atomically, even members forked while we scan. Only while
        # the group's id cannot belong to a stranger: the child is not reaped yet (it holds its
        # pid), or a member of its group is seen. Not reaped: the signal goes before the look.
        group_signalled = not run.exited.is_set() and send_signal(run.pid, sig, group=True)
        watch = ExitWatch(run.wake)
        try:
            if group_signalled and run.keeper is not None and watch.available:
                # The keeper signals the rest of its tree and reports it gone once all of it is:
                # wait for that before looking at /proc (a look costs ms that the dying tree
                # could use). The report comes with the command's status, right before the
                # keeper's exit: no need to wait for that exit too (see keeper.py).
                watch.watch([run.pid])
                run.keeper.watch_report(run.wake.set)
                # Until its report or its exit is known (through the pidfd, or asyncio's report
                # when its thread reaped the keeper first), a hurry, or the deadline: a wake-up
                # can come before the exit code can be read, and deciding then would scan for
                # nothing.
                while not run.hurry.is_set() and not self.reported(run) and not self.exited(run, watch):
                    try:
                        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                            await run.wake.wait()
                    except TimeoutError:
                        break
                    run.wake.clear()
                # It reported its tree gone right before it exited: no scan (see keeper.py).
                if run.keeper.tree_gone() and (self.reported(run) or self.exited(run, watch)):
                    return ()
            tree = self.tree(run)
            group = [proc.pid for proc in tree if proc.pgid == run.pid and proc.alive]
            if group and (group_signalled or send_signal(run.pid, sig, group=True)):
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
                now = time.monotonic()
                if not alive:
                    # The child is dead too (always in its session), and its orphans were ours
                    # before it turned zombie: only its reaping is left, which asyncio does.
                    if self.exited(run, watch):
                        return ()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, deadline - now)):
                            await run.exited.wait()
                    return ()
                if now >= deadline or (sig is signal.SIGTERM and run.hurry.is_set()):
                    if sig is not signal.SIGKILL:
                        return tuple(sorted(alive))
                    survivors = [pid for pid in alive if not dying(pid)]
                    if len(survivors) < len(alive):
                        self._log.info(
                            "child_tree_dying_after_kill", pid=run.pid, dying=len(alive) - len(survivors)
                        )
                    return tuple(sorted(survivors))
                # Look again once all of them exited (each exit is announced; one that exits
                # between the look and here fires at once), on a hurry, or after a while for
                # what was forked since; without pidfds, every _POLL_S.
                watch.watch(alive)
                step = _RESCAN_S if watch.available else _POLL_S
                with contextlib.suppress(TimeoutError):  # asyncio.timeout: see reaper.py
                    async with asyncio.timeout(min(step, deadline - now)):
                        await run.wake.wait()
                run.wake.clear()
                tree = self.tree(run)
        finally:
            watch.close()
            if run.keeper is not None:
                run.keeper.unwatch_report()

    @staticmethod
    def reported(run: Run) -> bool:
        """Whether the keeper reported its tree gone with the command's status; that status is
        then the run's exit code (the keeper exits like the command, a moment later)."""
        if run.keeper is None:
            return False
        code = run.keeper.reported_exit_code()
        if code is None:
            return False
        if run.returncode is None:
            run.seen_returncode = code
        return True

    @staticmethod
    def exited(run: Run, watch: ExitWatch) -> bool:
        """Whether the child has exited, its code known: reported by asyncio, or read through its
        pidfd (asyncio's report comes a thread hop later, and the stop need not wait for it)."""
        if run.returncode is None and not run.exited.is_set():
            run.seen_returncode = watch.exit_code(run.pid)
        return run.returncode is not None

    def tree(self, run: Run) -> list[Proc]:
        """The child's session, plus what left it and got reparented to us (see the module doc)."""
        if not HAVE_PROC:
            # Without /proc only the group can be followed: is anyone left in it?
            if send_signal(run.pid, 0, group=True):
                return [Proc(run.pid, "?", -1, run.pid, run.pid, 0)]
            return []
        me = os.getpid()
        # With its keeper lost, the tree's escaped chains are ours alone to find: the whole table,
        # to follow them (else only the session and our children: cheaper to read).
        procs = all_procs() if run.keeper_lost else all_procs(session=run.pid, parent=me)
        tree = [
            proc
            for proc in procs
            if proc.sid == run.pid
            or (
                proc.ppid == me
                and proc.pid not in run.foreign
                and proc.pid not in self._children.waited
                and proc.start_ticks >= run.start_ticks
            )
        ]
        if not run.keeper_lost:
            return tree
        by_pid = {proc.pid: proc for proc in procs}
        related = closure([proc.pid for proc in tree], ((p.pid, p.ppid, p.pgid, p.sid) for p in procs))
        return [by_pid[pid] for pid in related]
