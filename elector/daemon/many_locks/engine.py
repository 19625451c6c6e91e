"""How a daemon of many locks starts them, stops them and keeps the garbage collector out of
their way: one `Election` each on one event loop, up to the daemon's limit of locks (what that
costs: docs/benchmarks.md; the measurements behind each bound here: docs/design.md, "Many locks
in one daemon").

- start: a `StartGate` admits the first tries `start_spacing_s` apart, so that acquisitions, and
  hence renewals, never fall due together, and a few at a time, so that a busy loop slows the
  starts down instead of timing them out;
- stop: `BatchedStop` releases them a batch at a time;
- GC: `freeze_long_lived` moves what start-up built out of the collector's sight, then sets
  thresholds that leave the transient objects of a pipeline's batch alone.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gc
import math
from collections.abc import Callable, Sequence
from typing import Protocol

#: A daemon of many locks starts one lock at most this often (seconds): each start subscribes,
#: acquires and logs a line, so that the most locks a daemon holds, started within one renew
#: interval, would take the whole core and time their own requests out.
MIN_START_SPACING_S = 0.001


def start_spacing_s(locks: int, *, ttl_s: float, renew_interval_s: float) -> float:
    """Seconds between the starts of two locks of a daemon (0 for a single lock, which starts at once).

    The first tries are spread evenly over one renew interval, so that neither the acquisitions
    nor (hence) the renewals of a thousand locks fall due together; beyond a renew interval's
    worth of locks at MIN_START_SPACING_S, over up to one ttl (start-up to all acquired then
    stays within 2 ttl even for brand-new locks, which wait a ttl by design).
    """
    if locks <= 1:
        return 0.0
    return min(ttl_s, max(renew_interval_s, locks * MIN_START_SPACING_S)) / locks


#: A daemon of many locks has at most this many locks between their admission and the end of
#: their first cycle (subscribe, acquire, the first outcome). When the loop is healthy a start
#: takes a few ms and the spacing alone paces them; on a busy or starved loop the answers come
#: late, and new starts then wait for them instead of piling up: starts on a fixed schedule
#: outran a loaded machine, their acquisitions timed out and their retries, warnings and
#: step-downs kept the loop saturated for good.
MAX_STARTS_IN_FLIGHT = 32


class _Turn:
    """One election's place at a `StartGate` (the election's `StartTurn`)."""

    __slots__ = ("_admit", "_gate", "state")

    WAITING, ADMITTED, ENDED = 0, 1, 2

    def __init__(self, gate: StartGate, admit: Callable[[], None]) -> None:
        self._gate = gate
        self._admit: Callable[[], None] | None = admit
        self.state = _Turn.WAITING

    def admit(self) -> None:
        self.state = _Turn.ADMITTED
        admit, self._admit = self._admit, None
        if admit is not None:
            admit()

    def end(self) -> None:
        if self.state == _Turn.ENDED:
            return
        admitted = self.state == _Turn.ADMITTED
        self.state = _Turn.ENDED
        self._admit = None
        if admitted:
            self._gate.turn_ended()


class StartGate:
    """The turns of a daemon's locks to start: in order, at least `spacing_s` apart, and at most
    `max_in_flight` at once between a turn's admission and its first cycle's end (each election
    ends its turn then, see `Election.run`).

    Closed loop rather than a schedule: starts go as fast as the spacing allows while earlier
    ones are answered promptly, and slow down to the pace at which the loop answers them when
    it is busy. One loop timer at a time, not one per lock.
    """

    def __init__(self, *, spacing_s: float, max_in_flight: int = MAX_STARTS_IN_FLIGHT) -> None:
        if spacing_s < 0 or max_in_flight < 1:
            raise ValueError("spacing_s must not be negative and max_in_flight must be positive")
        self._spacing_s = spacing_s
        self._max_in_flight = max_in_flight
        self._waiting: collections.deque[_Turn] = collections.deque()
        self._in_flight = 0
        #: Loop time before which the next turn is not admitted.
        self._next_at = -math.inf
        self._handle: asyncio.TimerHandle | None = None

    @property
    def in_flight(self) -> int:
        """Turns admitted and not ended (for tests)."""
        return self._in_flight

    @property
    def starting(self) -> bool:
        """Whether turns are waiting or under way."""
        return bool(self._waiting) or self._in_flight > 0

    def request(self, admit: Callable[[], None]) -> _Turn:
        """Queue a turn; `admit` is called (on the running loop) when it comes."""
        turn = _Turn(self, admit)
        self._waiting.append(turn)
        self._pump()
        return turn

    def turn_ended(self) -> None:
        self._in_flight -= 1
        self._pump()

    def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and self._in_flight < self._max_in_flight:
            if self._waiting[0].state == _Turn.ENDED:  # stopped while it waited
                self._waiting.popleft()
                continue
            now = loop.time()
            if now < self._next_at:
                if self._handle is None:
                    self._handle = loop.call_at(self._next_at, self._on_timer)
                return
            turn = self._waiting.popleft()
            self._in_flight += 1
            # From now, not from the schedule: a start that came late is not followed by a burst.
            self._next_at = now + self._spacing_s
            turn.admit()

    def _on_timer(self) -> None:
        self._handle = None
        self._pump()


#: A daemon of many locks stops (releases) this many locks at once, one batch per STOP_BATCH_INTERVAL_S
#: (one release pipeline each): the most locks a daemon holds stop well within a pod's grace period.
STOP_BATCH = 50
STOP_BATCH_INTERVAL_S = 0.02


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class BatchedStop:
    """Stops elections (each then releases its lease) STOP_BATCH at a time, one batch per
    STOP_BATCH_INTERVAL_S: thousands of releases and step-down lines at once took the core for
    seconds and most releases timed out (release_failed, leases left to expire).

    With `finished` (whether a stopped election's run has ended), a batch also waits until fewer
    than STOP_BATCH of the elections stopped before are still stopping: on a busy or loaded loop
    the releases then go out as fast as they are answered, not on a schedule that outruns them.
    """

    def __init__(
        self, elections: Sequence[_Stoppable], *, finished: Callable[[_Stoppable], bool] | None = None
    ) -> None:
        self._elections = elections
        self._finished = finished
        self._next = 0
        #: Elections stopped whose run had not ended when last looked at.
        self._stopping: list[_Stoppable] = []
        #: The next batch's timer, while a stop of many locks is under way.
        self.handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Stop the first batch now, the others after it (on the running loop)."""
        if self.handle is None:
            self._stop_batch()

    def cancel(self) -> None:
        """Stop no further batches (a second signal: the run is being cut short)."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _stop_batch(self) -> None:
        self.handle = None
        room = STOP_BATCH
        if self._finished is not None:
            finished = self._finished
            self._stopping = [election for election in self._stopping if not finished(election)]
            room -= len(self._stopping)
        if room > 0:
            batch = self._elections[self._next : self._next + room]
            self._next += len(batch)
            for election in batch:
                election.stop()
            if self._finished is not None:
                self._stopping.extend(batch)
        if self._next < len(self._elections):
            self.handle = asyncio.get_running_loop().call_later(STOP_BATCH_INTERVAL_S, self._stop_batch)


#: The collector's thresholds in a daemon of many locks (CPython's default: 700, 10, 10). A young
#: collection runs when the tracked objects allocated less those freed pass the first figure; a
#: batch of a few hundred replies transiently holds thousands of objects (futures, handles, reply
#: lists) that die a moment later, so at the default the collector ran many times a second,
#: promoted those transients and, every few seconds, walked every object alive in a full
#: collection (the renew p99). At the first figure here only objects that outlive their batch count
#: (the cyclic garbage of errors, new long-lived state): young collections are rare, full ones
#: rarer. What that garbage can pile up to is bounded by the same figure.
MANY_LOCKS_GC_THRESHOLDS = (20_000, 20, 10)

#: How often `freeze_long_lived` moves what start-up made out of the collector's sight, seconds.
FREEZE_PERIOD_S = 0.5


def freeze_long_lived(
    *, until: float, starting: Callable[[], bool] | None = None, settle_s: float = 0.0
) -> None:
    """Move every object tracked by the garbage collector into its permanent generation (gc.freeze),
    now and every FREEZE_PERIOD_S until loop time `until`, and while `starting()` says locks are
    still starting, and for `settle_s` after that (their first terms' renewals).

    The elections, their tasks, subscriptions and metrics live as long as the daemon. Left to the
    collector, every full collection walks them all while the locks are starting (a full
    collection comes every second or two then), which was the whole renew p99 of the first
    minute. Frozen, they are never walked again; what start-up left as
    cyclic garbage at a freeze (little: no exception escapes a healthy cycle) is kept for good.
    A start-up slowed down by a busy machine (the start gate) is followed to its end.
    """
    gc.freeze()
    loop = asyncio.get_running_loop()
    now = loop.time()
    if starting is not None and starting():
        until = max(until, now + settle_s)
    if now < until:
        loop.call_later(
            FREEZE_PERIOD_S,
            functools.partial(freeze_long_lived, until=until, starting=starting, settle_s=settle_s),
        )
    else:  # start-up is over: steady running from here on (see MANY_LOCKS_GC_THRESHOLDS)
        gc.set_threshold(*MANY_LOCKS_GC_THRESHOLDS)
