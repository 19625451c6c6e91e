"""The errors of the library's Elector (async and sync alike), and what a stopped one says."""

from __future__ import annotations

import logging
import os
from typing import Any

from elector.election import StepDownReason


class LeaderWorkNotStopped(Exception):
    """Leader work outlived `stop_work_s`: raised to the election, which withholds the release."""


class WithheldReleaseFilter(logging.Filter):
    """Drops the election's "on_stopped_leading failed" record (with its traceback) when the stop
    hook raised `LeaderWorkNotStopped`: that is how the library withholds a release, and the
    library's own ERROR line ("release withheld") says it once, with what did not stop."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], LeaderWorkNotStopped))


class RedisSetupError(Exception):
    """`fail_fast=True`: Redis answered, refusing this Elector in a way retrying cannot cure (a
    wrong or missing password, an ACL, a DB index it does not have, a topology that is not the
    server's). Raised by `leadership()` and `wait_for_leadership()` while it lasts; `error` is
    what Redis said. Without `fail_fast` the Elector retries (and logs it) instead.
    """

    def __init__(self, *, lock: str, error: str) -> None:
        super().__init__(
            f"lock {lock!r}: Redis answered, and refused us in a way retrying cannot cure ({error}): "
            "fix the URL (password, database), the ACL or the topology (cluster=...)"
        )
        self.lock = lock
        self.error = error
        #: Always True: an unreachable Redis is retried, never raised as this.
        self.redis_answered = True


class LeadershipLost(Exception):
    """The body of `leadership()` was cancelled (or, sync, told) because the term ended; `reason`
    says why.

    User code may raise it too (`raise elector.LeadershipLost()`, or with its own reason, such as
    a write the fence refused): every argument is optional, and it pickles (a worker process may
    send it back).
    """

    def __init__(
        self,
        reason: StepDownReason | str = StepDownReason.LOST,
        *,
        lock: str | None = None,
        fencing_token: int | None = None,
    ) -> None:
        if isinstance(reason, str) and reason in StepDownReason._value2member_map_:
            reason = StepDownReason(reason)
        term = "leadership" if lock is None else f"leadership of lock {lock!r}"
        if fencing_token is not None:
            term += f" (fencing token {fencing_token})"
        super().__init__(f"{term} ended: {reason}")
        self.reason = reason
        self.lock = lock
        self.fencing_token = fencing_token

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments are lost by BaseException's own pickling.
        return _rebuild_lost, (self.reason, self.lock, self.fencing_token)


def _rebuild_lost(
    reason: StepDownReason | str, lock: str | None, fencing_token: int | None
) -> LeadershipLost:
    return LeadershipLost(reason, lock=lock, fencing_token=fencing_token)


#: What to do instead, said by every refusal of an Elector in another process than its own.
_AFTER_FORK = (
    "create it in the process that uses it, after the fork: in gunicorn's post_fork hook "
    "(or an ASGI lifespan; never at import with --preload), in Celery's worker_process_init or "
    "worker_ready signal, in the target or initializer of a multiprocessing Process or Pool "
    "(docs/library.md, 'Fork and process managers')"
)


class ForkedElectorError(RuntimeError):
    """An Elector (or a term of it) used in a process other than the one that created it.

    A forked child inherits a copy of the Elector, not its election: the thread or task that
    renews the lease, its connections and its lease belong to the parent. The copy is refused
    at once instead of reporting the parent's leadership or waiting for ever.
    """

    def __init__(self, *, lock: str, created_in_pid: int, what: str = "Elector") -> None:
        held = "connections" if what == "watch" else "election, connections and lease"
        super().__init__(
            f"the {what} of lock {lock!r} was created in process {created_in_pid} and is used in "
            f"process {os.getpid()}, a fork of it (multiprocessing, gunicorn --preload, Celery's prefork "
            f"pool): its {held} stay with process {created_in_pid}. "
            f"To use one in this process, {_AFTER_FORK}"
        )
        self.lock = lock
        self.created_in_pid = created_in_pid


class ProcessBound:
    """The pid an object was created in, and the check that it is still used there."""

    def __init__(self, *, lock: str, what: str) -> None:
        self._lock, self._what, self._pid = lock, what, os.getpid()

    def check(self) -> None:
        """Raise `ForkedElectorError` in any process but the creator's."""
        if os.getpid() != self._pid:
            raise ForkedElectorError(lock=self._lock, created_in_pid=self._pid, what=self._what)

    @property
    def forked(self) -> bool:
        return os.getpid() != self._pid


def refuse_pickling(what: str, lock: str) -> TypeError:
    """Why an Elector (or a term) cannot go to another process by pickle (spawn, forkserver)."""
    return TypeError(
        f"cannot pickle the {what} of lock {lock!r}: what it runs on belongs to the process that "
        f"created it. To use one in another process, {_AFTER_FORK}"
    )


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
        elif last_error is not None:
            why = f"Redis answered with an error ({last_error})"
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
