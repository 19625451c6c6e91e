"""`on_overrun="exit"` of the sync API: the process ends before a running body can outlive its lease.

Private (elector.sync uses it). Two stops, one behind the other:

* The guard thread ends the process with `os._exit(OVERRUN_EXIT_CODE)`, after a CRITICAL log line,
  once a body is still running at its deadline: the earlier of its term's end plus `stop_work_s`
  and the validity end of its term's last renewal.
* A kernel timer (_kill_timer.py) SIGKILLs the process `kill_grace_s` after the latest validity end,
  for when no Python thread of the process can run then: a C call holding the GIL, a SIGSTOP.
  It is armed while a body runs in a term and re-armed by the election's loop at each renewal,
  first thing in the Elector's outcome hook; disarmed when the last body has left its block;
  deleted at `close()`. A forked child inherits no timer (and a copied `KillTimer` does nothing there).

The kernel timer never fires before the guard thread's own deadline (it is `kill_grace_s` past
the validity end, which bounds that deadline), so it never ends a process the guard would let
live; and it fires inside the safety margin, before Redis can expire the key: the validity end
is `ttl - (1% of ttl + 5 ms + stop_work_s)` after a renewal's send time, and `kill_grace_s` is at
most half of `stop_work_s`. What it needs of this process is nothing: the kernel delivers SIGKILL.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Protocol

from elector.election import CycleOutcome, ElectionTiming, StepDownReason
from elector.election.clock import boottime
from elector.library._kill_timer import KillTimer, KillTimerUnavailable
from elector.library.term import Leadership

logger = logging.getLogger("elector.api")

#: The exit status of a process ended by `on_overrun="exit"` (EX_SOFTWARE).
OVERRUN_EXIT_CODE = 70
#: The kernel timer's delay after the validity end, at most: long enough for the guard thread,
#: when it can run, to end the process first with its log line; short next to the margin.
MAX_KILL_GRACE_S = 0.05


class OverrunBody(Protocol):
    """What the guard reads of a sync body (`elector.sync`'s `_ThreadBody`)."""

    #: Set (on the election's loop) when the body's term ended under it.
    lost: StepDownReason | None
    lost_at: float | None  # CLOCK_BOOTTIME


def kill_grace_s(timing: ElectionTiming) -> float:
    """How long after the validity end the kernel timer fires: half the stop-work time, at most
    MAX_KILL_GRACE_S (the rest of the safety margin is left for the kill to land)."""
    return min(timing.stop_work_s / 2, MAX_KILL_GRACE_S)


class OverrunGuard:
    """Ends the process when a body outlives its term's bounds (module doc)."""

    def __init__(self, *, lock: str, timing: ElectionTiming) -> None:
        self._owner_pid = os.getpid()
        self._timing = timing
        self._grace_s = kill_grace_s(timing)
        self._lock = threading.Lock()
        self._bodies: dict[OverrunBody, tuple[Leadership, float]] = {}  # -> (term, valid until)
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"elector:{lock}:overrun", daemon=True)
        self._timer: KillTimer | None = None
        try:
            self._timer = KillTimer.create()
        except KillTimerUnavailable as exc:
            warnings.warn(
                f"on_overrun='exit' of lock {lock!r}: no kernel timer here ({exc}); a C call that "
                "holds the GIL or a stopped process can outlive the lease",
                RuntimeWarning,
                stacklevel=3,  # the caller of Elector.start()
            )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the guard thread and delete the kernel timer."""
        self._stopped = True
        if os.getpid() != self._owner_pid:
            return  # a forked child has neither the thread nor the timer
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._bodies.clear()
            if self._timer is not None:
                self._timer.close()

    def watch(self, body: OverrunBody, term: Leadership) -> None:
        """`body` runs in `term` from now on (called right after it entered)."""
        if os.getpid() != self._owner_pid:
            return  # a forked child: no guard thread, no timer (and a lock fork may have copied held)
        now = boottime()  # read first: now + remaining never passes the real validity end
        valid_until = now + term.remaining()
        with self._lock:
            self._bodies[body] = (term, valid_until)
            self._rearm()
        self._wake.set()

    def forget(self, body: OverrunBody) -> None:
        """`body` left its block: nothing of it to stop any more."""
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            if self._bodies.pop(body, None) is not None:
                self._rearm()

    def renewed(self, outcome: CycleOutcome) -> None:
        """On the election's loop, for every outcome: a renewal moves its term's bodies' validity."""
        if outcome.valid_until is None or outcome.holder is None:
            return
        token = outcome.holder.fencing_token
        with self._lock:
            moved = False
            for body, (term, valid_until) in self._bodies.items():
                if term.active and term.fencing_token == token and outcome.valid_until > valid_until:
                    self._bodies[body] = (term, outcome.valid_until)
                    moved = True
            if moved:
                self._rearm()

    def _rearm(self) -> None:
        """The kernel timer at the earliest validity end of a running body, plus the grace (or
        disarmed without one). Called with the lock held."""
        if self._timer is None or self._stopped:
            return
        if self._bodies:
            self._timer.arm_at(min(valid_until for _, valid_until in self._bodies.values()) + self._grace_s)
        else:
            self._timer.disarm()

    def _run(self) -> None:
        period_s = min(self._timing.renew_interval_s / 2, max(self._timing.stop_work_s, 0.01))
        while not self._stopped:
            now = boottime()
            next_look = now + period_s
            overrun: tuple[Leadership, OverrunBody] | None = None
            with self._lock:
                for body, (term, valid_until) in self._bodies.items():
                    deadline = valid_until
                    if body.lost is not None:
                        assert body.lost_at is not None
                        deadline = min(body.lost_at + self._timing.stop_work_s, valid_until)
                    if now >= deadline:
                        overrun = term, body
                    next_look = min(next_look, deadline)
            if overrun is not None:
                self._exit(*overrun)  # outside the lock: the election's loop takes it at renewals
            self._wake.wait(max(0.0, next_look - boottime()))
            self._wake.clear()

    def _exit(self, term: Leadership, body: OverrunBody) -> None:
        logger.critical(
            "lock %r: leader work of fencing token %s still running %s; ending the process "
            "(on_overrun='exit') before the lease can expire",
            term.lock,
            term.fencing_token,
            f"after its term ended ({body.lost})" if body.lost else "when its validity ran out",
            extra={"lock": term.lock, "identity": term.identity, "fencing_token": term.fencing_token},
        )
        os._exit(OVERRUN_EXIT_CODE)
