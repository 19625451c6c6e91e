"""A kernel timer that SIGKILLs this process at a deadline: a hard stop that needs no Python code.

Private (the sync API's `on_overrun="exit"` uses it, see _sync_overrun.py). A Python thread cannot
be relied on to end the process in time: a C call that holds the GIL (a regex that backtracks,
a C extension's long loop) keeps every other thread of the process from running, and with them
any watchdog thread and the `signal` module's handlers (SIGALRM from `setitimer` included). A
POSIX timer (`timer_create(2)`) whose notification is SIGKILL is different: when it expires the
kernel itself queues SIGKILL to the process, which dies without running another instruction of
user code, whatever holds the GIL, and even while it is stopped (SIGSTOP).

* The deadline is absolute, on CLOCK_BOOTTIME (the election's clock, elector/election/clock.py),
  so a suspended host resumes with the timer expired: the process dies at once, as it must.
* One timer per `KillTimer`; the process may have others (unlike `setitimer`'s one ITIMER_REAL,
  which the program may be using).
* POSIX timers are not inherited across fork() and are deleted by execve(): a child of the owning
  process has no timer aimed at it, and a `KillTimer` copied into a child does nothing there
  (timer ids are per process: the child's own timer may have the very same id).
* Re-arming is one `timer_settime` call through ctypes, cheap enough for every renewal (its cost:
  docs/benchmarks.md, overrun_kill). ctypes is imported only when a timer is created.

Linux only (glibc or musl). Elsewhere `KillTimer.create` raises `KillTimerUnavailable`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from elector.election.clock import COUNTS_SUSPEND

if TYPE_CHECKING:
    import ctypes

_SIGEV_SIGNAL = 0
_TIMER_ABSTIME = 1
_SIGKILL = 9


class KillTimerUnavailable(OSError):
    """This platform or sandbox offers no kernel timer that delivers SIGKILL (the reason says why)."""


class KillTimer:
    """A POSIX timer of this process that delivers SIGKILL at an absolute `boottime()` deadline.

    Thread-safe. Armed with `arm_at`, disarmed with `disarm`, deleted with `close` (idempotent).
    """

    def __init__(self, *, api: _TimerApi, timer_id: Any, clock_id: int) -> None:
        self._api = api
        self._timer_id = timer_id
        self._clock_id = clock_id
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        #: The deadline armed now (election clock seconds), None when disarmed.
        self.armed_at: float | None = None

    @classmethod
    def create(cls) -> KillTimer:
        """A new, disarmed timer; `KillTimerUnavailable` where the kernel or libc offers none."""
        api = _TimerApi.load()
        clock_id = time.CLOCK_BOOTTIME if COUNTS_SUSPEND else time.CLOCK_MONOTONIC
        return cls(api=api, timer_id=api.create(clock_id), clock_id=clock_id)

    def arm_at(self, deadline: float) -> None:
        """SIGKILL this process at `deadline` (the election's clock); replaces an earlier arming.
        A deadline already past kills at once."""
        if not math.isfinite(deadline):
            raise ValueError(f"deadline must be a finite clock reading, not {deadline!r}")
        if not self._owned():
            return
        with self._lock:
            # A zero it_value would disarm: the earliest arming is one nanosecond after boot.
            seconds = max(deadline, 1e-9)
            self._api.settime(self._timer_id, seconds)
            self.armed_at = deadline

    def disarm(self) -> None:
        if not self._owned():
            return
        with self._lock:
            if self.armed_at is None:
                return
            self._api.settime(self._timer_id, 0.0)
            self.armed_at = None

    def close(self) -> None:
        """Disarm and delete the timer (in a forked child: nothing, the child has none)."""
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.armed_at = None
            self._api.delete(self._timer_id)

    def _owned(self) -> bool:
        """Whether the timer is this process's own, not a copy made by fork; looked at before
        the lock, which a fork may have copied held."""
        if os.getpid() != self._owner_pid:
            return False
        if self._closed:
            raise RuntimeError("the kill timer was closed")
        return True


class _TimerApi:
    """timer_create / timer_settime / timer_delete of the C library, through ctypes."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        import ctypes  # here, not at the top: nothing of it is loaded unless a timer is made

        self._libc = libc
        self._ctypes = ctypes

        class Timespec(ctypes.Structure):
            _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))

        class Itimerspec(ctypes.Structure):
            _fields_ = (("it_interval", Timespec), ("it_value", Timespec))

        # Linux's struct sigevent: a sigval union (pointer-sized), signo, notify, then padding to
        # 64 bytes (SIGEV_MAX_SIZE) for the unions SIGEV_SIGNAL does not use.
        pad = (64 - ctypes.sizeof(ctypes.c_void_p) - 2 * ctypes.sizeof(ctypes.c_int)) // 4

        class Sigevent(ctypes.Structure):
            _fields_ = (
                ("sigev_value", ctypes.c_void_p),
                ("sigev_signo", ctypes.c_int),
                ("sigev_notify", ctypes.c_int),
                ("_pad", ctypes.c_int * pad),
            )

        self._timespec, self._itimerspec, self._sigevent = Timespec, Itimerspec, Sigevent

    @classmethod
    def load(cls) -> _TimerApi:
        if not sys.platform.startswith("linux"):
            raise KillTimerUnavailable(f"no timer_create(2) on {sys.platform}: Linux only")
        import ctypes
        import platform

        if platform.machine().startswith("mips"):  # its struct sigevent puts notify first
            raise KillTimerUnavailable("struct sigevent of MIPS is not supported")
        # glibc >= 2.34 and musl have the timer calls in libc; older glibc in librt.
        for name in (None, "librt.so.1"):
            try:
                libc = ctypes.CDLL(name, use_errno=True)
                libc.timer_create, libc.timer_settime, libc.timer_delete  # noqa: B018
            except (OSError, AttributeError):
                continue
            return cls(libc)
        raise KillTimerUnavailable("the C library has no timer_create(2)")

    def create(self, clock_id: int) -> Any:
        ctypes = self._ctypes
        event = self._sigevent(sigev_signo=_SIGKILL, sigev_notify=_SIGEV_SIGNAL)
        timer_id = ctypes.c_void_p()
        if self._libc.timer_create(clock_id, ctypes.byref(event), ctypes.byref(timer_id)) != 0:
            errno = ctypes.get_errno()
            raise KillTimerUnavailable(errno, f"timer_create(2) refused: {os.strerror(errno)}")
        return timer_id

    def settime(self, timer_id: Any, deadline: float) -> None:
        """Arm at the absolute `deadline` (seconds on the timer's clock); 0.0 disarms."""
        seconds = math.floor(deadline)
        value = self._timespec(seconds, min(999_999_999, round((deadline - seconds) * 1e9)))
        spec = self._itimerspec(self._timespec(0, 0), value)
        if self._libc.timer_settime(timer_id, _TIMER_ABSTIME, self._ctypes.byref(spec), None) != 0:
            errno = self._ctypes.get_errno()
            raise OSError(errno, f"timer_settime(2) failed: {os.strerror(errno)}")

    def delete(self, timer_id: Any) -> None:
        self._libc.timer_delete(timer_id)
