"""The errors of the library's Elector (async and sync alike), and what a stopped one says."""

from __future__ import annotations

from elector.election import StepDownReason


class LeaderWorkNotStopped(Exception):
    """Leader work outlived `stop_work_s`: raised to the election, which withholds the release."""


class LeadershipLost(Exception):
    """The body of `leadership()` was cancelled (or, sync, told) because the term ended; `reason`
    says why."""

    def __init__(self, reason: StepDownReason, *, lock: str, fencing_token: int) -> None:
        super().__init__(f"leadership of lock {lock!r} (fencing token {fencing_token}) ended: {reason}")
        self.reason = reason
        self.lock = lock
        self.fencing_token = fencing_token


class LeadershipTimeout(TimeoutError):
    """`leadership(timeout=...)` / `wait_for_leadership(timeout=...)` gave up waiting to lead.

    Nothing else happened: the Elector keeps contending, and no body was started. `redis_reached`
    tells a lock held by someone else from a Redis that never answered (`last_error` then says why).
    """

    def __init__(
        self, *, lock: str, timeout_s: float, holder: str | None, redis_reached: bool, last_error: str | None
    ) -> None:
        if not redis_reached:
            why = f"Redis was not reached ({last_error or 'no answer yet'})"
        elif holder is not None:
            why = f"the lock is held by {holder!r}"
        else:
            why = "another candidate was preferred"
        super().__init__(f"not leading lock {lock!r} after {timeout_s:g}s: {why}")
        self.lock = lock
        self.timeout_s = timeout_s
        self.holder = holder
        self.redis_reached = redis_reached
        self.last_error = last_error


def not_running_message(lock: str, *, started: bool, closed: bool, crashed: BaseException | None) -> str:
    """Why an Elector cannot give leadership, in words that say what happened to it."""
    if crashed is not None:
        why = f"its election crashed ({type(crashed).__name__}: {crashed}; see the log)"
    elif closed:
        why = (
            "it was closed (aclose(), or the end of its `with` block); an Elector runs once: "
            "make a new one to contend again"
        )
    elif not started:
        why = "it is not started; use `async with` (sync: `with`) or start()"
    else:
        why = "it is closing"
    return f"the Elector of lock {lock!r} is not running: {why}"
