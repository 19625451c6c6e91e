"""A lock's announcements: the subscription an election keeps for its whole run, and the events
it queues for the election's waits.

A follower subscribes before its first try and then sleeps until the holder's lease would run out,
a release announcement, or a re-check cap: no fixed polling period. A leader is woken by a
handoff request or a later grant (then its renewal asks Redis, which alone is trusted). The
subscription is re-made with a back-off that keeps a link which breaks right after each subscribe
from becoming a request loop. What an event means for the election is the election's to decide
(`Election._apply_announcements`, machine.py): this object only listens, queues and wakes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import Callable

from elector.backoff import backoff_delay_s
from elector.election.outcome import describe_error
from elector.election.policy import FAILURE_BACKOFF_JITTER
from elector.lease import LeaseBackend, LeaseBackendError, LeaseEvent
from elector.tasks import await_chain, cancel_until_done

#: Re-subscribing to announcements: the first wait, the longest, and the same half-range jitter
#: as the retries of failed requests.
RESUBSCRIBE_FIRST_S = 0.4
RESUBSCRIBE_MAX_S = 30.0
#: How long the end of a run waits for its listener, which is sent its cancellation again
#: meanwhile, before it names it and goes on (a run's end must never hang on it).
LISTENER_STOP_S = 5.0
#: How many announcements wait for the election at most (the oldest go first: a flood of them
#: must not grow without bound, and the next cycle asks Redis anyway).
QUEUED_EVENTS = 64

#: The election's logger: its records keep the name they always had.
logger = logging.getLogger("elector.election.machine")


class Announcements:
    """Keeps the subscription to one lock's announcements and queues what arrives.

    `wake` is called whenever something arrives (an event, a new subscription after a break);
    the election then takes what is queued with `take_events` and `take_resubscribed`.
    """

    def __init__(
        self,
        backend: LeaseBackend,
        *,
        request_timeout_s: float,
        stable_after_s: float,
        keepalive_s: float,
        clock: Callable[[], float],
        rng: random.Random,
        wake: Callable[[], None],
    ) -> None:
        self._backend = backend
        self._request_timeout_s = request_timeout_s
        #: How long a subscription must have lasted for its break to count as a first failure.
        self._stable_subscription_s = stable_after_s
        self._keepalive_s = keepalive_s
        self._clock = clock
        self._rng = rng
        self._wake = wake
        self._events: collections.deque[LeaseEvent] = collections.deque(maxlen=QUEUED_EVENTS)
        self._subscribed = asyncio.Event()
        #: Set once the first subscription succeeded or failed: a failure need not be waited out
        #: (a wrong URL or password then shows in the first acquire, within a request timeout).
        self._subscribe_tried = asyncio.Event()
        self._resubscribed = False
        self._listener: asyncio.Task[None] | None = None

    @property
    def pending(self) -> bool:
        """Whether anything waits to be taken."""
        return bool(self._events) or self._resubscribed

    def take_resubscribed(self) -> bool:
        """Whether a new subscription was made after a break since last asked (announcements may
        have been missed meanwhile)."""
        resubscribed, self._resubscribed = self._resubscribed, False
        return resubscribed

    def take_events(self) -> list[LeaseEvent]:
        """The announcements queued since last asked, oldest first."""
        events = list(self._events)
        self._events.clear()
        return events

    def start(self, *, name: str) -> None:
        """Start listening, in a task of its own."""
        self._listener = asyncio.create_task(self._listen(), name=name)

    async def first_try(self, *, within_s: float) -> None:
        """Wait until the first subscription succeeded or failed, at most `within_s`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await self._subscribe_tried.wait()

    async def stop(self, *, lock: str) -> None:
        """End the listener at the end of a run (see `_stop_listener`)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await self._stop_listener(listener, lock=lock)

    async def _stop_listener(self, listener: asyncio.Task[None], *, lock: str) -> None:
        """End the listener at the end of a run. Cancelled until it ends, not once: inside a
        redis-py write (a client given by the caller, a subscribe or a keepalive PING) CPython
        3.11's wait_for can drop the cancellation (elector/tasks.py), and the listener, which loops
        until cancelled, would then listen on while the run waited for it for ever."""
        # A second cancellation of the run itself ends this wait, not the run's cleanup after it.
        # Sent again only after a request timeout: sooner, it could cut short the listener's
        # close of its subscription (its `finally`), which a loaded loop can take a while to run.
        with contextlib.suppress(asyncio.CancelledError):
            left = await cancel_until_done(
                [listener], within_s=LISTENER_STOP_S, resend_s=self._request_timeout_s
            )
            for task in left:
                logger.error(
                    "announcement listener did not end within %.1fs of its cancellation (left "
                    "behind); it waits at %s", LISTENER_STOP_S, "; ".join(await_chain(task)),
                    extra={"lock": lock},
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
                async with asyncio.timeout(2 * self._request_timeout_s):
                    subscription = await self._backend.subscribe(keepalive_s=self._keepalive_s)
            except (LeaseBackendError, TimeoutError) as exc:
                failures += 1
                self._subscribe_tried.set()
                logger.debug("cannot subscribe to announcements: %s", describe_error(exc))
                await asyncio.sleep(self._resubscribe_delay_s(failures))
                continue
            if failures or self._subscribed.is_set():
                self._resubscribed = True
                self._wake()
            self._subscribed.set()
            self._subscribe_tried.set()
            subscribed_at = self._clock()
            try:
                while True:
                    event = await subscription.next_event(timeout_s=self._keepalive_s)
                    if event is not None:
                        self._events.append(event)
                        self._wake()
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

    def _resubscribe_delay_s(self, failures: int) -> float:
        return backoff_delay_s(
            failures,
            base_s=RESUBSCRIBE_FIRST_S,
            cap_s=RESUBSCRIBE_MAX_S,
            jitter=FAILURE_BACKOFF_JITTER,
            rng=self._rng,
        )
