"""What the child supervisor keeps of a run: its record (`Run`), a parked keeper (`Parked`),
and what it reports (`ChildExit`, `ChildStartError`, `stop_budget_s`). See supervisor.py."""

from __future__ import annotations

import asyncio
import dataclasses

from elector.daemon.execmode.keeper_link import KeeperLink

#: How long `stop()` waits after SIGKILL for the tree to be gone and the child reaped.
KILL_REAP_SLACK_S = 0.1


def stop_budget_s(kill_grace_s: float) -> float:
    """The longest `stop()` takes with this grace: the daemon adds it to its lease safety margin."""
    return kill_grace_s + KILL_REAP_SLACK_S


class ChildStartError(Exception):
    """The command could not be started (not found, not executable, no permission)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChildExit:
    """How a run of the child ended."""

    pid: int
    #: The child's exit status as asyncio reports it (negative: killed by a signal); None if it was
    #: not known within the stop budget: the child still dying (on a loaded machine a SIGKILLed
    #: process can wait that long to be scheduled), or its report still on its way from Python
    #: 3.11's per-child watcher thread (the daemon watches its children through pidfds instead).
    returncode: int | None
    #: The signal that killed the child, if one did.
    signal: int | None
    #: True when `stop()` began before the child was seen to exit (then `on_exit` is not called).
    stopped_by_us: bool
    runtime_s: float
    #: Pids of the tree still alive when `stop()` gave up; empty when everything is gone.
    survivors: tuple[int, ...] = ()
    #: The keeper exited without reporting its tree gone (killed alone): the tree was killed at once.
    keeper_lost: bool = False
    #: The keeper refused to start the command: the lease's validity end had passed (nothing ran).
    deadline_passed: bool = False


def child_exit(pid: int, returncode: int | None, *, stopped_by_us: bool, runtime_s: float) -> ChildExit:
    killed_by = -returncode if returncode is not None and returncode < 0 else None
    return ChildExit(pid, returncode, killed_by, stopped_by_us, runtime_s)


@dataclasses.dataclass(eq=False, slots=True)
class Run:
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
    #: Set on anything stop() waits for: an exit in the tree, the child's exit, a hurry.
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    watcher: asyncio.Task[None] | None = None
    ended_at: float | None = None
    stopping: bool = False
    #: The stop was begun by the supervisor itself (a lost keeper): its result waits for stop().
    report_later: bool = False
    #: The keeper exited without reporting its tree gone: the stop must find all of it alone.
    keeper_lost: bool = False
    #: stop() sent SIGKILL while the keeper was alive and no other SIGKILL was pending on it: the
    #: keeper is in the group it kills, so if it then dies of SIGKILL without its report, that
    #: was our own kill (see `ChildSupervisor._watch`).
    killed_by_stop: bool = False
    natural_exit: ChildExit | None = None
    #: The child's exit code as stop() read it through its pidfd, or as its keeper reported it
    #: with its tree gone, before asyncio reported it.
    seen_returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        code = self.process.returncode
        return code if code is not None else self.seen_returncode

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclasses.dataclass(eq=False, slots=True)
class Parked:
    """A keeper started ahead of time, waiting for its start order (see `ChildSupervisor.park`)."""

    process: asyncio.subprocess.Process
    link: KeeperLink
    start_ticks: int
    foreign: frozenset[int]
    watcher: asyncio.Task[None] | None = None
