"""Exec mode: `elector run ... -- COMMAND` runs COMMAND only while this replica leads.

The election's hooks drive a `ChildSupervisor`: `on_started_leading` starts the command with the
lease in its environment, `on_stopped_leading` stops it (SIGTERM to its process group, SIGKILL
after the kill grace, wait until the whole group is gone). The election awaits that hook before
it releases, and the kill grace is part of the timing's safety margin, so the command is gone
before the lease could expire on Redis, whatever ended the term.

When the command exits by itself while we lead, `ChildExitPolicy` decides: release (resign and
stand back for a back-off), restart (after a back-off, still leading), or exit the daemon with
the command's code.

The command runs under a keeper (elector/daemon/execmode/keeper.py) that kills it by the lease's deadline even
when this daemon is SIGKILLed, frozen or its event loop stalls: `observe` (an outcome hook)
passes every renewal's validity end on. While not leading, a keeper is kept parked (started and
waiting for its start order: `ChildSupervisor.park`), so that an acquisition does not wait for an
interpreter to start; it is (re)started from `observe`, after a cycle that did not lead, so off
the path from a step-down to its release. Not after a shutdown's step-down. Other safety rules:

* A step-down whose reason means the lease may already be gone (`lost`, `lease_expired`) kills
  the command at once, without the grace.
* A step-down cancels a pending restart, even one whose start is under way; a restart never
  spawns the command for a lease that is no longer current.
* When the command could not be stopped (processes survived SIGKILL), `on_stopped_leading`
  raises `CommandNotStopped`: the election then withholds the release and lets the lease lapse.
* A keeper that dies without reporting its tree gone (SIGKILLed alone, an OOM kill) has its
  command's tree killed at once by the supervisor, whatever the policy; it is logged
  (`keeper_lost`) and counted (`elector_keeper_lost_total`) before the policy applies.
* A keeper that got its validity end too late (frozen while parked, or the daemon slow) starts
  nothing and exits with `EXIT_DEADLINE_PASSED`: logged as `command_not_started`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter

from elector.backoff import Backoff
from elector.daemon.execmode.keeper_link import KeeperLink
from elector.daemon.execmode.supervisor import (
    KILL_REAP_SLACK_S,
    AwaitedChildren,
    ChildExit,
    ChildStartError,
    ChildSupervisor,
)
from elector.daemon.settings import ChildExitPolicy, ExecSettings
from elector.election import CycleOutcome, ElectionStatus, StepDownReason
from elector.lease import Lease

#: Exit code reported for a command that could not be started (as a shell does).
EXIT_CANNOT_START = 127
#: Environment variables of the daemon's own settings: never passed on (a URL may hold a password).
_DAEMON_ENV_PREFIX = "ELECTOR_"
#: Step-downs after which the lease may already belong to someone else: no grace for the command.
LEASE_MAYBE_GONE = frozenset({StepDownReason.LOST, StepDownReason.LEASE_EXPIRED})


class CommandNotStopped(Exception):
    """Processes of the command survived SIGKILL: the lease must not be released (let it lapse)."""


class LeaderElection(Protocol):
    """What exec mode needs of the election (an `Election`)."""

    def status(self) -> ElectionStatus: ...
    def resign(self, *, stand_back_s: float) -> None: ...


def keeper_margin_s(stop_work_s: float) -> float:
    """How long after a validity end the keeper may let the command live: the stop time the
    lease timing reserves (`ElectionTiming.stop_work_s`), less the time SIGKILL takes to reap."""
    return max(0.0, stop_work_s - KILL_REAP_SLACK_S)


def command_backoff() -> Backoff:
    """The wait after the command exited by itself: 1 s, doubling up to 60 s, and from 1 s again
    after a run of 60 s or more (a command that ran that long was healthy)."""
    return Backoff(base_s=1.0, cap_s=60.0, reset_after_s=60.0)


def exit_code_of(child_exit: ChildExit) -> int:
    """The shell's convention: the exit status, or 128 + N for a death by signal N."""
    if child_exit.signal is not None:
        return 128 + child_exit.signal
    return child_exit.returncode if child_exit.returncode is not None else 1


def keeper_environment(*, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A parked keeper's environment: ours without the daemon's settings."""
    return {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith(_DAEMON_ENV_PREFIX)
    }


def child_environment(lease: Lease, *, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ours without the daemon's settings, plus the lease."""
    env = keeper_environment(base=base)
    env.update(
        ELECTOR_LOCK=lease.lock,
        ELECTOR_IDENTITY=lease.identity,
        ELECTOR_FENCING_TOKEN=str(lease.fencing_token),
        ELECTOR_LEASE_TTL_MS=str(lease.ttl_ms),
    )
    return env


class ExecMode:
    """Runs the leader's command for one election. Build it, `attach` the election, use its hooks."""

    def __init__(
        self,
        settings: ExecSettings,
        *,
        log: structlog.stdlib.BoundLogger,
        request_exit: Callable[[int], None],
        children: AwaitedChildren,
        keeper_margin_s: float | None,
        park_keeper: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """`keeper_margin_s`: see `keeper_margin_s()`; None runs the command without a keeper
        (then nothing stops it if this process dies or stalls). `park_keeper`: keep a keeper
        parked while not leading (a bare interpreter's memory, for a faster takeover).
        `registry`: where `elector_keeper_lost_total` is registered (none: not counted)."""
        self._keepers_lost = (
            None
            if registry is None
            else Counter(
                "elector_keeper_lost",
                "Keepers that exited without reporting their command's tree gone (killed alone, "
                "an OOM kill); the daemon killed the command's tree at once",
                registry=registry,
            )
        )
        self._settings = settings
        self._keeper_margin_s = keeper_margin_s
        self._park_keeper = park_keeper and keeper_margin_s is not None
        self._parking: asyncio.Task[None] | None = None
        #: Set by a shutdown's step-down: no keeper is parked any more.
        self._closing = False
        self._log = log
        self._request_exit = request_exit
        self._supervisor = ChildSupervisor(
            settings.command,
            kill_grace_s=settings.kill_grace_s,
            on_exit=self._child_exited,
            children=children,
            logger=log,
            on_keeper_lost=self._keeper_lost,
        )
        self._election: LeaderElection | None = None
        self._lease: Lease | None = None
        self._backoff = command_backoff()
        self._restart: asyncio.Task[None] | None = None
        self._exiting = False
        # Two starts never interleave (a grant's and a restart's); a stop aborts either (see stop()).
        self._spawn_lock = asyncio.Lock()

    def attach(self, election: LeaderElection) -> None:
        """The election whose lease the command runs under. Its clock must be CLOCK_BOOTTIME
        (`elector.election.clock.boottime`): the keeper compares validity ends with that clock."""
        self._election = election

    def observe(self, outcome: CycleOutcome) -> None:
        """An outcome hook: hands every renewal's validity end to the command's keeper; after a
        cycle that did not lead, parks a keeper for the next term if none is."""
        if outcome.valid_until is not None:
            self._supervisor.extend_validity(outcome.valid_until)
        elif self._lease is None:
            self._park_soon()

    @property
    def parked_keeper_pid(self) -> int | None:
        return self._supervisor.parked_pid

    def _park_soon(self) -> None:
        if not self._park_keeper or self._closing or self._exiting or self._parking is not None:
            return
        if self._supervisor.parked_pid is not None or not self._supervisor.idle:
            return
        self._parking = asyncio.create_task(self._park(), name="elector:park-keeper")

    async def _park(self) -> None:
        try:
            assert self._keeper_margin_s is not None
            link = KeeperLink.parked(kill_grace_s=self._settings.kill_grace_s, margin_s=self._keeper_margin_s)
            await self._supervisor.park(keeper=link, env=keeper_environment())
        except Exception as exc:  # the command starts with a keeper of its own, as without parking
            self._park_keeper = False
            self._log.warning("keeper_park_failed", error=str(exc), effect="no keeper is parked any more")
        finally:
            self._parking = None

    @property
    def child_pid(self) -> int | None:
        return self._supervisor.pid

    async def on_started_leading(self, lease: Lease) -> None:
        self._lease = lease
        await self._start()

    async def on_stopped_leading(self, reason: StepDownReason) -> None:
        """Stop the command (and any restart); CommandNotStopped if some of it survived."""
        self._lease = None  # from here on no start, restart or spawn goes ahead
        if reason is StepDownReason.SHUTDOWN:
            self._closing = True
        restart, self._restart = self._restart, None
        if restart is not None:
            restart.cancel()
        # Not under the spawn lock: a start under way is aborted (or its child stopped) by stop().
        ended = await self._supervisor.stop(kill_now=reason in LEASE_MAYBE_GONE)
        if restart is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await restart
        if ended is not None and ended.stopped_by_us:
            self._log.info(
                "command_stopped",
                reason=reason.value,
                pid=ended.pid,
                exit_code=exit_code_of(ended),
                runtime_s=round(ended.runtime_s, 3),
                survivors=list(ended.survivors) or None,
            )
        if ended is not None and ended.survivors:
            raise CommandNotStopped(
                f"{len(ended.survivors)} process(es) of the command survived SIGKILL "
                f"(pids {', '.join(map(str, ended.survivors))}); the lease is left to lapse"
            )

    async def close(self) -> None:
        """Stop the command if it still runs (the election's own hook normally did already), end
        the parked keeper, and wait for the exit of a stopped command's keeper (after the release:
        the stop itself went on at the keeper's report that the tree is gone)."""
        try:
            await self.on_stopped_leading(StepDownReason.SHUTDOWN)
        finally:
            if self._parking is not None:
                with contextlib.suppress(Exception):
                    await self._parking
            await self._supervisor.unpark()
            await self._supervisor.settle()

    async def _start(self) -> None:
        if self._parking is not None:
            # A keeper being parked: wait for the spawn (not its interpreter), then launch it.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._parking)
        async with self._spawn_lock:
            lease = self._lease
            if lease is None or self._exiting:
                return
            try:
                started = await self._supervisor.start(
                    env=child_environment(lease),
                    inherit_env=False,
                    keeper=self._keeper_for(lease),
                    still_wanted=lambda: self._lease_current(lease),
                )
            except ChildStartError as exc:
                self._log.error("command_failed_to_start", error=str(exc))
            else:
                if started:
                    self._log.info(
                        "command_started", pid=self._supervisor.pid, fencing_token=lease.fencing_token
                    )
                else:
                    self._log.info("command_start_abandoned", detail="the lease is no longer current")
                return
        self._after_exit(EXIT_CANNOT_START, runtime_s=0.0)

    def _lease_current(self, lease: Lease) -> bool:
        """Whether `lease` is still the one we lead under, and still valid."""
        if self._lease is not lease or self._exiting:
            return False
        if self._election is None:
            return True
        status = self._election.status()
        return status.is_leader and status.fencing_token == lease.fencing_token

    def _keeper_for(self, lease: Lease) -> KeeperLink | None:
        if self._keeper_margin_s is None or self._election is None:
            return None
        status = self._election.status()
        if not status.is_leader or status.lease_remaining_s is None:
            return None  # no validity to give it: still_wanted() refuses the spawn anyway
        return KeeperLink(
            valid_until=status.now + status.lease_remaining_s,
            kill_grace_s=self._settings.kill_grace_s,
            margin_s=self._keeper_margin_s,
        )

    def _keeper_lost(self) -> None:
        if self._keepers_lost is not None:
            self._keepers_lost.inc()

    def _child_exited(self, child_exit: ChildExit) -> None:
        code = exit_code_of(child_exit)
        if child_exit.deadline_passed:
            self._log.warning(
                "command_not_started",
                reason="deadline_passed",
                detail="the keeper got the lease's validity end after it had passed",
                exit_code=code,
                on_child_exit=self._settings.on_child_exit.value,
            )
            self._after_exit(code, runtime_s=child_exit.runtime_s)
            return
        self._log.warning(
            "command_exited",
            pid=child_exit.pid,
            exit_code=code,
            runtime_s=round(child_exit.runtime_s, 3),
            on_child_exit=self._settings.on_child_exit.value,
            keeper_lost=child_exit.keeper_lost or None,
        )
        self._after_exit(code, runtime_s=child_exit.runtime_s)

    def _after_exit(self, code: int, *, runtime_s: float) -> None:
        policy = self._settings.on_child_exit
        if self._lease is None:
            return  # exited while we were stopping it anyway
        if policy is ChildExitPolicy.EXIT:
            self._exiting = True
            self._request_exit(code)
            return
        delay_s = self._backoff.after_run(runtime_s)
        if policy is ChildExitPolicy.RESTART:
            self._log.info("command_restart_scheduled", delay_s=delay_s)
            self._restart = asyncio.create_task(self._restart_after(delay_s), name="elector:command-restart")
            return
        assert self._election is not None, "attach() the election before it runs"
        self._log.info("resigning_after_command_exit", stand_back_s=delay_s)
        self._election.resign(stand_back_s=delay_s)

    async def _restart_after(self, delay_s: float) -> None:
        # self._restart stays set until the start is done: a step-down must be able to cancel it.
        await asyncio.sleep(delay_s)
        try:
            await self._start()
        finally:
            if self._restart is asyncio.current_task():
                self._restart = None
