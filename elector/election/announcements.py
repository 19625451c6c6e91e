"""The announcement listener and the waits it cuts short.

A follower subscribes to the lock's announcements before its first try and then sleeps until the
holder's lease would run out, a release announcement, or a re-check cap: no fixed polling period.
A leader is woken by a handoff request or a later grant (then its renewal asks Redis, which alone
is trusted). The subscription is kept for the whole run, re-subscribing with a back-off that keeps
a link which breaks right after each subscribe from becoming a request loop.

Part of `Election` (machine.py), which starts `_listen` as a task and sleeps with `_sleep_until`.
"""

from __future__ import annotations

import asyncio
import contextlib

from elector.backoff import backoff_delay_s
from elector.election.core import ElectionCore, describe_error, logger
from elector.election.outcome import State
from elector.election.policy import FAILURE_BACKOFF_JITTER
from elector.election.timers import SharedTimer, StartGate, StartTurn
from elector.lease import LeaseBackendError, LeaseEventKind
from elector.tasks import await_chain, cancel_until_done

#: A flood of announcements must not become a flood of requests.
MIN_ATTEMPT_SPACING_S = 0.005
#: Waits shorter than this are due now (like asyncio's own clock resolution); sleeping them can
#: spin on clocks that round timers.
CLOCK_RESOLUTION_S = 1e-4
#: Re-subscribing to announcements: the first wait, the longest, and the same half-range jitter
#: as the retries of failed requests.
RESUBSCRIBE_FIRST_S = 0.4
RESUBSCRIBE_MAX_S = 30.0
#: How long the end of a run waits for its listener, which is sent its cancellation again
#: meanwhile, before it names it and goes on (a run's end must never hang on it).
LISTENER_STOP_S = 5.0


class AnnouncementListener(ElectionCore):
    """Keeps the subscription to the lock's announcements and applies them to the waits."""

    async def _sleep_until(self, when: float) -> None:
        """Sleep until `when`, a stop request, or an announcement that calls for a cycle now."""
        while not self._stop_requested and self._resign_stand_back_s is None and not self._hold_lifted:
            if self._handle_announcements():
                earliest = (self._last_attempt_at or 0.0) + MIN_ATTEMPT_SPACING_S
                when = min(when, max(earliest, self._clock()))
            remaining = when - self._clock()
            if remaining <= CLOCK_RESOLUTION_S:
                return
            self._wakeup.clear()
            if self._events or self._resubscribed:
                continue
            # A timer that sets the event, rather than asyncio.timeout: a timeout cancels the
            # task and raises through it, which costs more than the rest of a renewal's cycle
            # in a daemon of thousands of locks. Many elections share their wake-up's timer.
            timer: asyncio.TimerHandle | SharedTimer
            if self._shared_timers is not None:
                timer = self._shared_timers.call_at(when, self._wakeup.set)
            else:
                timer = asyncio.get_running_loop().call_later(remaining, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    async def _wait_for_turn(self, gate: StartGate) -> StartTurn:
        """Wait for a turn of `gate` (or a stop). No cycle is due meanwhile: the wait is as long
        as the earlier starts take, and liveness must not take it for a stuck loop."""
        admitted = False

        def admit() -> None:
            nonlocal admitted
            admitted = True
            self._wakeup.set()

        turn = gate.request(admit)
        self._cycle_due_by = None
        while not admitted and not self._stop_requested:
            self._wakeup.clear()
            await self._wakeup.wait()
        return turn

    def _handle_announcements(self) -> bool:
        """Apply queued announcements; True when the next cycle should run now."""
        run_now = False
        if self._resubscribed:
            # Announcements may have been missed while unsubscribed: look again.
            self._resubscribed = False
            run_now = self._state is State.FOLLOWER
        while self._events:
            event = self._events.popleft()
            if self._state is State.LEADER and self._lease is not None:
                if event.kind is LeaseEventKind.HANDOFF and event.holder == self._lease.holder:
                    # Asked to hand over: the renewal reads the request from Redis (a message
                    # alone is not trusted) and steps down if it is real.
                    run_now = True
                elif event.kind is LeaseEventKind.ACQUIRED and (
                    event.holder.fencing_token > self._lease.fencing_token
                ):
                    # A later grant means our key is gone. Announcements can be late or forged
                    # (anyone allowed to PUBLISH), so renew now and let Redis say: lost, or ours.
                    run_now = True
            elif self._state is State.FOLLOWER:
                if event.kind is LeaseEventKind.RELEASED:
                    if self._holder is None or event.holder.fencing_token >= self._holder.fencing_token:
                        self._observe_holder(None, expires_at=None)
                    run_now = True
                elif event.kind is LeaseEventKind.HANDOFF:
                    continue
                elif self._holder is None or event.holder.fencing_token > self._holder.fencing_token:
                    self._observe_holder(event.holder, expires_at=self._holder_expires_at)
        return run_now

    async def _stop_listener(self, listener: asyncio.Task[None]) -> None:
        """End the listener at the end of a run. Cancelled until it ends, not once: inside a
        redis-py write (a client given by the caller, a subscribe or a keepalive PING) CPython
        3.11's wait_for can drop the cancellation (elector/tasks.py), and the listener, which loops
        until cancelled, would then listen on while the run waited for it for ever."""
        # A second cancellation of the run itself ends this wait, not the run's cleanup after it.
        # Sent again only after a request timeout: sooner, it could cut short the listener's
        # close of its subscription (its `finally`), which a loaded loop can take a while to run.
        with contextlib.suppress(asyncio.CancelledError):
            left = await cancel_until_done(
                [listener], within_s=LISTENER_STOP_S, resend_s=self._timing.request_timeout_s
            )
            for task in left:
                logger.error(
                    "announcement listener did not end within %.1fs of its cancellation (left "
                    "behind); it waits at %s", LISTENER_STOP_S, "; ".join(await_chain(task)),
                    extra={"lock": self.lock},
                )  # fmt: skip
        if listener.done() and not listener.cancelled():
            listener.exception()  # retrieved, as before; the run has ended and does not need it

    async def _listen(self) -> None:
        """Keep a subscription to the lock's announcements for as long as the election runs.

        Every new subscription makes a follower look at the lock once (it may have missed a
        release), so a link that breaks right after each subscribe (an idle-timeout proxy) must
        not turn into a request loop: the back-off keeps growing until a subscription has stayed
        up for `_stable_subscription_s`.
        """
        failures = 0
        while True:
            try:
                async with asyncio.timeout(2 * self._timing.request_timeout_s):
                    subscription = await self._backend.subscribe(keepalive_s=self._keepalive_s)
            except (LeaseBackendError, TimeoutError) as exc:
                failures += 1
                self._subscribe_tried.set()
                logger.debug("cannot subscribe to announcements: %s", describe_error(exc))
                await asyncio.sleep(self._resubscribe_delay_s(failures))
                continue
            if failures or self._subscribed.is_set():
                self._resubscribed = True
                self._wakeup.set()
            self._subscribed.set()
            self._subscribe_tried.set()
            subscribed_at = self._clock()
            try:
                while True:
                    event = await subscription.next_event(timeout_s=self._keepalive_s)
                    if event is not None:
                        self._events.append(event)
                        self._wakeup.set()
            except LeaseBackendError as exc:
                logger.debug("announcement subscription broke: %s", exc)
            except Exception:
                # A bug or hostile data must not silently end the subscription for good.
                logger.exception("announcement listener failed; re-subscribing")
            finally:
                await subscription.close()
            stable = self._clock() - subscribed_at >= self._stable_subscription_s
            failures = 1 if stable else failures + 1
            await asyncio.sleep(self._resubscribe_delay_s(failures))

    @property
    def _stable_subscription_s(self) -> float:
        """How long a subscription must have lasted for its break to count as a first failure."""
        return max(5.0, self._timing.ttl_s)

    def _resubscribe_delay_s(self, failures: int) -> float:
        return backoff_delay_s(
            failures,
            base_s=RESUBSCRIBE_FIRST_S,
            cap_s=RESUBSCRIBE_MAX_S,
            jitter=FAILURE_BACKOFF_JITTER,
            rng=self._rng,
        )
