"""What the child supervisor and the orphan reaper share: the process table as /proc shows it,
the children asyncio waits for, safe signalling and reaping by pid, and the subreaper switch.

Nothing here ever calls `waitpid(-1)`: that would steal the exit status of a child that asyncio
(or other code) waits for by pid. See elector/daemon/execmode/supervisor.py for the whole picture.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Protocol

import structlog

_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")
HAVE_PROC = (_PROC / "self" / "stat").exists()


class SupervisorLogger(Protocol):
    """The part of a structlog BoundLogger the supervisor uses."""

    def info(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def warning(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def error(self, event: str, *args: Any, **kw: Any) -> Any: ...


def default_logger() -> SupervisorLogger:
    logger: SupervisorLogger = structlog.stdlib.get_logger("elector.supervisor")
    return logger


def become_subreaper(*, logger: SupervisorLogger | None = None) -> bool:
    """Make orphaned descendants reparent to this process (Linux); False, with a warning, elsewhere.

    Permanent for the process (and not inherited by its children).
    """
    log = logger if logger is not None else default_logger()
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


@dataclasses.dataclass(frozen=True, slots=True)
class Proc:
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


def read_proc(pid: int) -> Proc | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
        # The command name (field 2) may hold blanks and parentheses: split after the last ')'.
        fields = raw[raw.rindex(b")") + 2 :].split()
        return Proc(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (OSError, ValueError, IndexError):  # gone meanwhile (ENOENT, ESRCH), or not Linux's format
        return None


def all_procs() -> list[Proc]:
    try:
        names = os.listdir(_PROC)
    except OSError:
        return []
    return [proc for name in names if name.isdigit() and (proc := read_proc(int(name))) is not None]


class AwaitedChildren:
    """The children asyncio waits for on behalf of supervisors (no one else may reap them), and
    how many spawns are in flight (whose pids are not known yet).

    Reaping is process-wide, so a supervisor and an `OrphanReaper` of one process must share one
    set: pass the same object to both.
    """

    def __init__(self) -> None:
        self.waited: set[int] = set()
        self.spawning = 0


def send_signal(pid: int, sig: int, *, group: bool = False) -> bool:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):  # gone meanwhile; or not ours to signal
        return False
    return True


def reap(pid: int) -> int | None:
    """Collect one zombie child by pid; its wait status, or None if it was not ours to collect."""
    try:
        found, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped meanwhile by someone else
        return None
    return status if found else None
