"""What the child supervisor and the orphan reaper share: the process table as /proc shows it,
the children asyncio waits for, safe signalling and reaping by pid, and the subreaper switch.

Nothing here ever calls `waitpid(-1)`: that would steal the exit status of a child that asyncio
(or other code) waits for by pid. See elector/daemon/execmode/supervisor.py for the whole picture.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import errno
import os
import sys
from collections.abc import Iterable
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


def watch_children_with_pidfds(loop: asyncio.AbstractEventLoop) -> bool:
    """On Python 3.11, have asyncio wait for its children through pidfds in `loop` (3.12's
    default), instead of a thread per child blocked in waitpid (3.11's default): each exit is
    then seen by the loop itself, with no thread to start per spawn and no GIL hand-over from
    that thread when the child exits (on a loaded host, a wait of milliseconds right when a
    stopped keeper's exit meets the release). False, changing nothing, where pidfds are missing
    (Linux < 5.3, a seccomp profile) or on later Pythons. Call before any child is started."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(loop)
    asyncio.set_child_watcher(watcher)
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


def _stat_bytes(pid: int) -> bytes | None:
    try:
        # os.open/os.read: a third of the cost of pathlib's (a stop reads every process's stat).
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:  # gone meanwhile (ENOENT, ESRCH)
        return None


def _parse(pid: int, raw: bytes) -> Proc | None:
    try:
        # The command name (field 2) may hold blanks and parentheses: split after the last ')'.
        fields = raw[raw.rindex(b")") + 2 :].split(maxsplit=20)
        return Proc(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (ValueError, IndexError):  # not Linux's format
        return None


def read_proc(pid: int) -> Proc | None:
    raw = _stat_bytes(pid)
    return None if raw is None else _parse(pid, raw)


def all_procs(*, session: int | None = None, parent: int | None = None) -> list[Proc]:
    """Every process; with `session` or `parent`, only the members of that session and the
    children of that parent (filtered before parsing: a stop looks at every process)."""
    try:
        names = os.listdir(_PROC)
    except OSError:
        return []
    wanted = None if session is None and parent is None else (session, parent)
    found = []
    for name in names:
        if not name.isdigit():
            continue
        raw = _stat_bytes(int(name))
        if raw is None:
            continue
        if wanted is not None:
            # After the name: state ppid pgrp session; the ids as bytes, compared without parsing.
            ids = raw[raw.rfind(b")") + 2 :].split(maxsplit=5)[1:4]
            if len(ids) < 3:
                continue
            if not (session is not None and ids[2] == b"%d" % session) and not (
                parent is not None and ids[0] == b"%d" % parent
            ):
                continue
        if (proc := _parse(int(name), raw)) is not None:
            found.append(proc)
    return found


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


class ExitWatch:
    """Sets `wake` once every watched process has exited, without polling: a pidfd per process,
    watched by the event loop (Linux >= 5.3; unlike waitpid it works for processes that are not
    our children, and unlike SIGCHLD it steals no one's exit status).

    `watch(pids)` makes the given processes the watched ones (and forgets the others). Where
    pidfds are missing or refused (ENOSYS: an older kernel; EPERM: a seccomp profile),
    `available` turns False and nothing is watched: the caller must poll. Close it when done.
    """

    def __init__(self, wake: asyncio.Event) -> None:
        self._wake = wake
        self._loop = asyncio.get_running_loop()
        self._fds: dict[int, int] = {}
        #: Watched processes not seen to exit yet.
        self._pending: set[int] = set()
        self.available = hasattr(os, "pidfd_open") and HAVE_PROC

    def watch(self, pids: Iterable[int]) -> None:
        wanted = set(pids)
        for pid in [pid for pid in self._fds if pid not in wanted]:
            self._forget(pid)
        self._pending &= wanted
        for pid in wanted - self._pending:
            if pid in self._fds:  # announced its exit, yet seen alive: its pid was reused
                self._forget(pid)
            if not self.available:
                return
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # gone since it was seen: nothing to wait for
            except OSError as exc:
                if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EINVAL, errno.EMFILE):
                    raise
                self.available = False
                self.close()
                return
            self._fds[pid] = fd
            self._pending.add(pid)
            self._loop.add_reader(fd, self._fired, pid)
        if not self._pending:
            self._wake.set()

    def exit_code(self, pid: int) -> int | None:
        """The exit code (negative: the killing signal, as asyncio reports it) of our child `pid`
        once it has exited, read without reaping it (WNOWAIT: asyncio still reaps and reports
        it, later: a thread hop in 3.11); None while it runs, or when that cannot be read."""
        fd = self._fds.get(pid)
        opened = -1
        try:
            if fd is None:
                if not self.available:
                    return None
                fd = opened = os.pidfd_open(pid)
            found = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except OSError:  # gone (reaped meanwhile), not our child, or no pidfd support
            return None
        finally:
            if opened >= 0:
                os.close(opened)
        if found is None or found.si_pid != pid:
            return None
        if found.si_code == os.CLD_EXITED:
            return found.si_status
        return -found.si_status if found.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else None

    def _fired(self, pid: int) -> None:
        # Readable for good once the process exited: stop watching it, or the loop would spin.
        self._loop.remove_reader(self._fds[pid])
        self._pending.discard(pid)
        if not self._pending:
            self._wake.set()

    def _forget(self, pid: int) -> None:
        fd = self._fds.pop(pid)
        self._pending.discard(pid)
        self._loop.remove_reader(fd)
        os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self._forget(pid)
