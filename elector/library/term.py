"""One term of leadership, and the bodies that run in it (async blocks and sync threads alike).

A term keeps the set of bodies running in it. When it ends, the Elector tells each body to stop
(`cancel_body`: a task is cancelled, a thread is told through its `check()`), then waits for their
`exited` futures, up to `stop_work_s`, before the lease may be released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from elector.election import ElectionStatus, StepDownReason
from elector.lease import Lease
from elector.library.errors import LeadershipLost, ProcessBound, refuse_pickling


class TermBody(Protocol):
    """What a term needs of a body running in it."""

    #: Done when the body left its block; set on the Elector's loop.
    exited: asyncio.Future[None]

    def cancel_body(self, reason: StepDownReason) -> None:
        """Tell the body its term ended (called on the Elector's loop)."""

    def cancel_again(self) -> None:
        """The body outlived `stop_work_s`: tell it once more (a cancellation can be lost)."""


class TermOwner(Protocol):
    """What a block needs of its Elector (elector.library.elector.Elector)."""

    lock: str

    async def _enter_term(self, body: TermBody, *, timeout_s: float | None) -> Leadership: ...

    async def _resign(self, term: Leadership, *, stand_back_s: float | None, wait: bool) -> None: ...


class Leadership:
    """One term of leadership, from a grant to its step-down. Never shows the lease's secret.

    Shared by the async and the sync API: `remaining()` and `check()` may be called from any thread.
    """

    def __init__(self, lease: Lease, *, status: Callable[[], ElectionStatus], process: ProcessBound) -> None:
        self._lease = lease
        self._process = process
        self._status = status
        self._end_reason: StepDownReason | None = None
        self._scopes: set[TermBody] = set()
        # Set once the step-down is complete (released, or found lost), not when it begins.
        self._finished = asyncio.Event()

    @property
    def lock(self) -> str:
        return self._lease.lock

    @property
    def identity(self) -> str:
        return self._lease.identity

    @property
    def fencing_token(self) -> int:
        """Greater than every earlier term's token of this lock: pass it along with writes."""
        return self._lease.fencing_token

    @property
    def active(self) -> bool:
        """False once the term has begun to end (leader work is being stopped)."""
        return self._end_reason is None

    @property
    def end_reason(self) -> StepDownReason | None:
        return self._end_reason

    def remaining(self) -> float:
        """Seconds this process may still act as leader; 0.0 once it may not.

        Counted on CLOCK_BOOTTIME from the send time of the last successful renewal, minus the
        safety margin. In a forked child (a copy of the term): `ForkedElectorError`.
        """
        self._process.check()
        status = self._status()
        if not self.active or not status.is_leader or status.fencing_token != self.fencing_token:
            return 0.0
        return status.lease_remaining_s or 0.0

    def check(self) -> None:
        """Raise `LeadershipLost` unless this process may still act as leader of this term.

        Call it before each step of leader work that cannot be cancelled (a sync body, a thread):
        a process resumed after a pause past its validity fails it before it writes.
        """
        reason = self._end_reason
        if reason is None and self.remaining() <= 0.0:
            reason = StepDownReason.LEASE_EXPIRED
        if reason is not None:
            raise LeadershipLost(reason, lock=self.lock, fencing_token=self.fencing_token)

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise refuse_pickling("term (Leadership)", self.lock)

    def __repr__(self) -> str:
        return f"Leadership(lock={self.lock!r}, fencing_token={self.fencing_token}, active={self.active})"

    def _end(self, reason: StepDownReason) -> list[asyncio.Future[None]]:
        """Mark the term over and stop the bodies running in it; futures of their exits."""
        self._end_reason = reason
        for scope in self._scopes:
            scope.cancel_body(reason)
        return [scope.exited for scope in self._scopes]


class LeadershipScope:
    """One `async with elector.leadership()` block: the task running a body inside a term."""

    def __init__(
        self,
        elector: TermOwner,
        *,
        resign_on_exit: bool,
        stand_back_s: float | None,
        timeout_s: float | None,
    ) -> None:
        self._elector = elector
        self._resign_on_exit = resign_on_exit
        self._stand_back_s = stand_back_s
        self._timeout_s = timeout_s
        # The task running the body, its term, and how many cancellations it had pending then.
        self._entered: tuple[asyncio.Task[Any], Leadership, int] | None = None
        self._lost: StepDownReason | None = None
        self._cancels = 0  # our own cancellations of the task, taken back at the exit
        #: Done when the body left the block; a step-down waits for it (up to stop_work_s).
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def __aenter__(self) -> Leadership:
        task = asyncio.current_task()
        if task is None or self._entered is not None:
            raise RuntimeError("enter each leadership() block once, from inside an asyncio task")
        # The timeout covers the wait to lead only: once entered, nothing times the body out.
        term = await self._elector._enter_term(self, timeout_s=self._timeout_s)
        self._entered = (task, term, task.cancelling())
        return term

    def cancel_body(self, reason: StepDownReason) -> None:
        assert self._entered is not None
        self._lost = reason
        self._cancels += 1
        self._entered[0].cancel(msg=f"leadership of lock {self._elector.lock!r} ended: {reason}")

    def cancel_again(self) -> None:
        # A library the body awaits may swallow a cancellation (redis-py's asyncio client does
        # when it lands inside a command: redis/redis-py#2028); another one may land elsewhere.
        if self._lost is not None and not self.exited.done():
            self.cancel_body(self._lost)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._entered is not None
        task, term, cancelling = self._entered
        # Unregister before any await: from now on a step-down neither cancels nor waits for us.
        term._scopes.discard(self)
        self.exited.set_result(None)
        cancelled = isinstance(exc, asyncio.CancelledError)
        if self._lost is not None:
            # Like asyncio.timeout(): absorb our own cancellation only if nobody else cancelled
            # the task meanwhile; an outside cancel keeps propagating.
            left = task.cancelling()
            for _ in range(min(self._cancels, left)):
                left = task.uncancel()
            if left <= cancelling and (exc is None or cancelled):
                raise LeadershipLost(self._lost, lock=term.lock, fencing_token=term.fencing_token) from exc
            if exc is not None and not cancelled:
                exc.add_note(f"(raised while stopping after leadership ended: {self._lost})")
        elif self._resign_on_exit and not term._scopes and not _expired(exc, term):
            # An outside cancel must not wait for the release: the task is being torn down.
            await self._elector._resign(term, stand_back_s=self._stand_back_s, wait=not cancelled)


def _expired(exc: BaseException | None, term: Leadership) -> bool:
    """A `check()` found the validity run out: not resigned, since the election steps down for
    `lease_expired` by itself, and the log then says what the exception says."""
    return isinstance(exc, LeadershipLost) and term.remaining() <= 0.0
