"""Exec mode: `elector run ... -- COMMAND` runs COMMAND only while this replica leads.

The election's hooks drive a `ChildSupervisor`: `on_started_leading` starts the command with the
lease in its environment, `on_stopped_leading` stops it (SIGTERM to its process group, SIGKILL
after the kill grace, wait until the whole group is gone). The election awaits that hook before
it releases, and the kill grace is part of the timing's safety margin, so the command is gone
before the lease could expire on Redis, whatever ended the term.

When the command exits by itself while we lead, `ChildExitPolicy` decides: release (resign and
stand back for a back-off), restart (after a back-off, still leading), or exit the daemon with
the command's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping

import structlog

from elector.config import ChildExitPolicy, ExecSettings
from elector.election import Election, StepDownReason
from elector.lease import Lease
from elector.supervisor import ChildExit, ChildRegistry, ChildStartError, ChildSupervisor

#: Exit code reported for a command that could not be started (as a shell does).
EXIT_CANNOT_START = 127
#: Environment variables of the daemon's own settings: never passed on (a URL may hold a password).
_DAEMON_ENV_PREFIX = "ELECTOR_"


class Backoff:
    """Exponential back-off for a command that keeps exiting; reset once it ran long enough."""

    def __init__(self, *, initial_s: float = 1.0, max_s: float = 60.0, reset_after_s: float = 60.0) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._reset_after_s = reset_after_s
        self._next_s = initial_s

    def after_run(self, runtime_s: float) -> float:
        """The delay to wait after a run that lasted `runtime_s`."""
        if runtime_s >= self._reset_after_s:
            self._next_s = self._initial_s
        delay = self._next_s
        self._next_s = min(self._max_s, self._next_s * 2)
        return delay


def exit_code_of(child_exit: ChildExit) -> int:
    """The shell's convention: the exit status, or 128 + N for a death by signal N."""
    if child_exit.signal is not None:
        return 128 + child_exit.signal
    return child_exit.returncode if child_exit.returncode is not None else 1


def child_environment(lease: Lease, *, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ours without the daemon's settings, plus the lease."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith(_DAEMON_ENV_PREFIX)
    }
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
        children: ChildRegistry,
    ) -> None:
        self._settings = settings
        self._log = log
        self._request_exit = request_exit
        self._supervisor = ChildSupervisor(
            settings.command,
            kill_grace_s=settings.kill_grace_s,
            on_exit=self._child_exited,
            children=children,
            logger=log,
        )
        self._election: Election | None = None
        self._lease: Lease | None = None
        self._backoff = Backoff()
        self._restart: asyncio.Task[None] | None = None
        self._exiting = False
        # Start and stop never interleave: a restart that is spawning finishes before a stop.
        self._spawn_lock = asyncio.Lock()

    def attach(self, election: Election) -> None:
        self._election = election

    @property
    def child_pid(self) -> int | None:
        return self._supervisor.pid

    async def on_started_leading(self, lease: Lease) -> None:
        self._lease = lease
        await self._start()

    async def on_stopped_leading(self, reason: StepDownReason) -> None:
        self._lease = None
        if self._restart is not None:
            self._restart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._restart
            self._restart = None
        async with self._spawn_lock:
            ended = await self._supervisor.stop()
        if ended is not None and ended.stopped_by_us:
            self._log.info(
                "command_stopped",
                reason=reason.value,
                pid=ended.pid,
                exit_code=exit_code_of(ended),
                runtime_s=round(ended.runtime_s, 3),
                survivors=list(ended.survivors) or None,
            )

    async def close(self) -> None:
        """Stop the command if it still runs (the election's own hook normally did already)."""
        await self.on_stopped_leading(StepDownReason.SHUTDOWN)

    async def _start(self) -> None:
        async with self._spawn_lock:
            lease = self._lease
            if lease is None or self._exiting:
                return
            try:
                await self._supervisor.start(env=child_environment(lease), inherit_env=False)
            except ChildStartError as exc:
                self._log.error("command_failed_to_start", error=str(exc))
                started = False
            else:
                self._log.info("command_started", pid=self._supervisor.pid, fencing_token=lease.fencing_token)
                started = True
        if not started:
            self._after_exit(EXIT_CANNOT_START, runtime_s=0.0)

    def _child_exited(self, child_exit: ChildExit) -> None:
        code = exit_code_of(child_exit)
        self._log.warning(
            "command_exited",
            pid=child_exit.pid,
            exit_code=code,
            runtime_s=round(child_exit.runtime_s, 3),
            on_child_exit=self._settings.on_child_exit.value,
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
        await asyncio.sleep(delay_s)
        self._restart = None
        await self._start()
