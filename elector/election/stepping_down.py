"""Stepping down and releasing: leader work is stopped first, while the lease is still ours,
and only then is the lease released (or, when the work could not be seen to stop, left to lapse).

    leader --(a reason)--> stepping_down --release--> follower, or stopped after stop()

Part of `Election` (machine.py): the leader cycle decides *that* it steps down and why; this
module does it, and runs the release cycle that completes it. See machine.py's module doc for
RELEASE_WITHHELD.
"""

from __future__ import annotations

import asyncio

from elector.election.core import ElectionCore, describe_error, error_kind_of, logger
from elector.election.outcome import CycleOutcome, OutcomeKind, State, StepDownReason
from elector.election.policy import ms, withheld_stand_back_until
from elector.lease import Holder, LeaseBackendError

#: Step-downs asked for from outside a cycle; their outcome is the release that completes them.
REQUESTED_STEP_DOWNS = frozenset(
    {StepDownReason.SHUTDOWN, StepDownReason.RESIGNED, StepDownReason.APP_UNHEALTHY}
)


class SteppingDown(ElectionCore):
    """Ends a term: stops leader work, then releases the lease (or withholds the release)."""

    async def _begin_step_down(self, reason: StepDownReason, *, release: bool) -> None:
        """Stop leader work first (the lease is still ours meanwhile), then drop the lease.

        When the work could not be stopped (the hook raised), nothing is released: see machine.py.
        """
        lease = self._lease
        self._state = State.STEPPING_DOWN
        self._prefetched = None  # a renewal round's answer (rounds.py) was for the term that ends
        stopped, error = await self._stop_leader_work(reason)
        self._lease = None
        self._valid_until = 0.0
        if not stopped:
            # The old lease lapses on Redis no later than its last renewal's send time + ttl.
            lapse_at = self._last_renew_sent_at + self._timing.ttl_s
            stand_back_until = withheld_stand_back_until(
                last_renew_sent_at=self._last_renew_sent_at, ttl_s=self._timing.ttl_s, reason=reason
            )
            self._contend_not_before = max(self._contend_not_before, stand_back_until)
            self._pending_handoff_to = None
            self._state = State.STOPPED if reason is StepDownReason.SHUTDOWN else State.FOLLOWER
            now = self._clock()
            self._emit(
                CycleOutcome(
                    kind=OutcomeKind.RELEASE_WITHHELD,
                    state=self._state,
                    at=now,
                    holder=None if lease is None else lease.holder,
                    remaining_ms=ms(lapse_at - now),
                    step_down_reason=reason if reason in REQUESTED_STEP_DOWNS else None,
                    error=f"leader work did not stop ({error}); the lease is left to lapse by its ttl",
                )
            )
            return
        if release and lease is not None:
            self._pending_release = lease
            self._pending_release_reason = reason
        else:
            self._state = State.FOLLOWER

    async def _stop_leader_work(self, reason: StepDownReason) -> tuple[bool, str]:
        """Await `on_stopped_leading`; (False, why) when it raised."""
        try:
            await self._hooks.on_stopped_leading(reason)
        except Exception as exc:
            self._stop_hook_called = True
            logger.error(
                "on_stopped_leading failed: leader work may still run; not releasing the lease",
                exc_info=True,
                extra={"lock": self.lock},
            )
            return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        # Set only once the call finished: one cut short by cancelling the run is made again, with
        # SHUTDOWN, by the run's cleanup (the lease is still set then), so the work still stops.
        self._stop_hook_called = True
        return True, ""

    def _stepped_down(
        self,
        kind: OutcomeKind,
        reason: StepDownReason,
        *,
        at: float,
        duration_s: float | None = None,
        holder: Holder | None = None,
        error: str | None = None,
        identity_clash: bool = False,
    ) -> CycleOutcome:
        # After a step-down, release at once (pending) or contend again at once.
        return CycleOutcome(
            kind=kind,
            state=self._state,
            at=at,
            duration_s=duration_s,
            holder=holder,
            step_down_reason=reason,
            error=error,
            next_cycle_at=self._clock(),
            identity_clash=identity_clash,
        )

    async def _release_cycle(self) -> CycleOutcome:
        lease, reason = self._pending_release, self._pending_release_reason
        handoff_to, self._pending_handoff_to = self._pending_handoff_to, None
        assert lease is not None
        self._pending_release = None
        self._pending_release_reason = None
        sent = self._clock()
        self._cycle_due_by = sent + self._timing.request_timeout_s
        kind = OutcomeKind.RELEASED
        error: str | None = None
        error_kind: str | None = None
        try:
            async with asyncio.timeout(self._timing.request_timeout_s):
                if handoff_to is None:
                    released = await self._backend.release(lease)
                else:
                    # Everyone but the rival stands back for a ttl: it is awake (it just
                    # refreshed its entry) and takes the lease on the release announcement.
                    released = await self._backend.release(
                        lease, handoff_to=handoff_to, handoff_window_ms=self._timing.ttl_ms
                    )
            self._backend_ok(self._clock())
            if not released:
                kind, error = OutcomeKind.RELEASE_FAILED, "the lease was no longer ours"
        except (LeaseBackendError, TimeoutError) as exc:
            kind, error, error_kind = OutcomeKind.RELEASE_FAILED, describe_error(exc), error_kind_of(exc)
            self._note_failure()
        received = self._clock()
        self._state = State.STOPPED if reason is StepDownReason.SHUTDOWN else State.FOLLOWER
        self._observe_holder(None, expires_at=None)
        return CycleOutcome(
            kind=kind,
            state=self._state,
            at=sent,
            duration_s=received - sent,
            holder=lease.holder,
            # A requested step-down (shutdown, resign) is reported here, where it completes.
            step_down_reason=reason if reason in REQUESTED_STEP_DOWNS else None,
            error=error,
            error_kind=error_kind,
            next_cycle_at=None if reason is StepDownReason.SHUTDOWN else received,
        )

    # -- the end of a run --------------------------------------------------------------------

    async def _close_run(self) -> None:
        """The run's own `on_stopped_leading(SHUTDOWN)`; nothing is released, so a raise is only logged."""
        self._stop_hook_called = True
        await self._call_hook("on_stopped_leading", self._hooks.on_stopped_leading(StepDownReason.SHUTDOWN))

    async def _withdraw(self) -> None:
        """Drop our candidate entry so status and handoffs stop listing us (best effort)."""
        try:
            async with asyncio.timeout(self._timing.request_timeout_s):
                await self._backend.withdraw(self._identity)
        except (LeaseBackendError, TimeoutError) as exc:
            logger.debug("could not withdraw the candidate entry: %s", describe_error(exc))
