"""One lock of the daemon: its election, metrics, log lines, leader file and published status.

The election runs on the daemon's event loop; everything it tells the outside goes through hooks
that never wait on the outside: the leader file is written in a worker thread, and the status
the HTTP thread serves is a snapshot published here (`published`, see http_thread.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import structlog

from elector.backend import RedisLeaseBackend
from elector.backend.topologies.factory import LeaseConnections
from elector.daemon.http_thread import PublishedStatus
from elector.daemon.leader_file import LEADER_FILE_WAIT_S, LeaderFileWriter
from elector.daemon.logs import make_logger
from elector.daemon.many_locks import RenewalRounds, SharedTimers, StartGate, renew_grid_s
from elector.daemon.predecessor import PredecessorLeaseBackend
from elector.daemon.settings import Settings
from elector.election import CycleOutcome, Election, ElectionHooks, ElectionStatus, State, StepDownReason
from elector.election.clock import boottime
from elector.lease import Holder, Lease, LeaseBackend
from elector.telemetry.metrics import ElectionMetrics, MetricFamilies
from elector.telemetry.outcome_log import OutcomeLogger

#: Past a term's validity end, how long a step-down still waits for a leader file it could not
#: update, seconds: the file's valid_until_ms was rounded down, this covers the wall clock being
#: slewed by NTP against CLOCK_BOOTTIME meanwhile.
LEADER_FILE_EXPIRY_SLACK_S = 0.05

#: The daemon's exit code after losing leadership with `--exit-on-loss`.
EXIT_LOST_LEADERSHIP = 3


#: The jitter source of the elections of a daemon of many locks (they run on one loop, one thread).
_SHARED_RNG = random.Random()


class LockOwner(Protocol):
    """What a `LockElection` needs of its daemon."""

    settings: Settings
    redis: LeaseConnections
    #: Called with (lock, outcome) for every cycle: for benchmarks and tests.
    outcome_observer: Callable[[str, CycleOutcome], None] | None
    #: The wake-up timers the elections of many locks share (None: each its own).
    shared_timers: SharedTimers | None
    #: The renewal rounds of the elections of many locks (None: each renews in its own cycles).
    renewal_rounds: RenewalRounds | None

    def request_exit(self, code: int, *, reason: str) -> None: ...


class LockElection:
    """One lock of the daemon: its election, metrics, log lines and leader file."""

    def __init__(
        self,
        daemon: LockOwner,
        *,
        lock: str,
        families: MetricFamilies,
        on_started_leading: Callable[[Lease], Awaitable[None]] | None = None,
        on_stopped_leading: Callable[[StepDownReason], Awaitable[None]] | None = None,
        on_outcome: Callable[[CycleOutcome], None] | None = None,
    ) -> None:
        settings = daemon.settings
        self._daemon = daemon
        self._extra_started = on_started_leading
        self._extra_stopped = on_stopped_leading
        self._file_due = asyncio.Event()
        self._file_shown: tuple[object, ...] | None = None
        self._file_lock = asyncio.Lock()
        #: The current term's validity end (election clock) and its wall-clock conversion, epoch ms.
        self._valid_until: float | None = None
        self._valid_until_ms: int | None = None
        backend: LeaseBackend = daemon.redis.backend_for(lock)
        if settings.predecessor_lock is not None:
            # A rename under way: one lease of both locks (predecessor.py); settings allow one lock.
            predecessor = daemon.redis.backend_for(settings.predecessor_lock)
            backend = PredecessorLeaseBackend(backend, predecessor=predecessor)
        # Named in the warning about a foreign value at the key (a Redlock lease has one per server).
        lease_key = backend.keys.lease if isinstance(backend, RedisLeaseBackend) else None
        self.log = make_logger("elector", context=self.log_context)
        leader_file = settings.leader_file_for(lock)
        self.leader_file = (
            None
            if leader_file is None
            else LeaderFileWriter(leader_file, lock=lock, identity=settings.identity)
        )
        # The gauges are read at scrape time, in the HTTP thread: from the published snapshot.
        self.metrics = ElectionMetrics(families, lock=lock, status=self._published_status)
        self.election = Election(
            backend,
            identity=settings.identity,
            timing=settings.timing,
            hooks=ElectionHooks(
                on_outcome=_fan_out(
                    self._publish_outcome,  # first: /leader and the probes learn of it at once
                    OutcomeLogger(
                        self.log,
                        lease_key=lease_key,
                        identity=settings.identity,
                        ttl_s=settings.timing.ttl_s,
                    ),
                    self.metrics.observe,
                    self._on_outcome,
                    *([] if on_outcome is None else [on_outcome]),
                    *(
                        []
                        if daemon.outcome_observer is None
                        else [functools.partial(daemon.outcome_observer, lock)]
                    ),
                    log=self.log,
                ),
                on_new_leader=self._on_new_leader,
                on_started_leading=self._on_started_leading,
                on_stopped_leading=self._on_stopped_leading,
            ),
            priority=settings.priority,
            # Validity counts suspended time too: Redis expires keys by wall time (see clock.py).
            clock=boottime,
            # Locks started together would renew together forever: one burst of a thousand
            # requests every interval. A little early jitter spreads them out within minutes.
            renew_jitter_share=0.1 if len(settings.locks) > 1 else 0.0,
            # ... and then they share the timers of the grid points they renew at, and one
            # random generator (a Mersenne Twister's state is 2.5 KiB: 25 MiB at 10,000 locks).
            shared_timers=daemon.shared_timers,
            rng=None if daemon.shared_timers is None else _SHARED_RNG,
            renew_grid_s=renew_grid_s(len(settings.locks), renew_interval_s=settings.timing.renew_interval_s),
            # ... and are renewed together at those points, without waking each election's task,
            # when the backend can (a batcher, no WAIT for replicas): most of a renewal's CPU.
            renewer=daemon.renewal_rounds if getattr(backend, "renews_in_rounds", False) else None,
        )
        #: What the HTTP thread reads of this election (see http_thread.py): republished by the
        #: election side at every cycle's outcome, at each term's start and end, and at the
        #: run's start and end. Nothing else ever reads the election from outside its loop.
        self.published = PublishedStatus(self.election.status())
        if self.leader_file is not None:
            # First thing, before Redis or HTTP: the file a killed predecessor left may still say
            # "leader" (its validity end already tells readers not to trust it, but say so plainly).
            self._write_leader_file()

    def status(self) -> ElectionStatus:
        """The election's status now (on the election's loop; other threads read `published`)."""
        return self.election.status()

    def publish(self) -> None:
        self.published.publish(self.election.status())

    def _publish_outcome(self, outcome: CycleOutcome) -> None:
        self.publish()

    def _on_new_leader(self, holder: Holder | None) -> None:
        # A follower that learned of a new holder between cycles (from an announcement) tells
        # /leader (and the leader-elector compatibility listener) at once. In a cycle, its
        # outcome is published a moment later anyway; a leader's term publishes in its hooks.
        if self.election.status().state is State.FOLLOWER:
            self.publish()

    def _published_status(self) -> ElectionStatus:
        return self.published()

    def log_context(self) -> dict[str, object]:
        status = self.election.status()
        return {
            "lock": status.lock,
            "identity": status.identity,
            "state": status.state.value,
            "fencing_token": status.fencing_token,
        }

    def _note_validity(self, valid_until: float) -> None:
        """Remember a validity end (election clock) and its wall-clock time, converted now."""
        self._valid_until = valid_until
        wall_s = time.time() + (valid_until - self.election.status().now)
        self._valid_until_ms = math.floor(wall_s * 1000)  # down: never claim a moment too many

    def _on_outcome(self, outcome: CycleOutcome) -> None:
        if self.leader_file is None:
            return
        if outcome.valid_until is not None:
            self._note_validity(outcome.valid_until)
        # Each renewal moves the validity end, so it is news: a thread hop and a write per renewal.
        status = self.election.status()
        shown = (status.is_leader, status.fencing_token, status.holder, status.state, self._valid_until_ms)
        if shown != self._file_shown:
            self._file_shown = shown
            self._file_due.set()

    def _write_leader_file(self) -> bool:
        """Runs in a worker thread: a slow or hung volume must never hold up a renewal."""
        assert self.leader_file is not None
        valid_until_ms = self._valid_until_ms  # read first: a step-down clears it before the state
        status = self.election.status()
        if status.state is State.STOPPED:
            return self.leader_file.mark_stopped()
        holder = status.holder
        # Without a validity end (a term whose start hook has not run yet) the file says follower.
        is_leader = status.is_leader and valid_until_ms is not None
        return self.leader_file.write(
            is_leader=is_leader,
            fencing_token=status.fencing_token if is_leader else None,
            valid_until_ms=valid_until_ms if is_leader else None,
            holder=None if holder is None else holder.identity,
            holder_fencing_token=None if holder is None else holder.fencing_token,
            state=status.state.value,
        )

    async def _keep_leader_file(self) -> None:
        while True:
            await self._file_due.wait()
            self._file_due.clear()
            await self._flush_or_log()

    async def _flush_or_log(self, *, timeout_s: float | None = None) -> None:
        """A write outside a step-down: one that cannot even start is logged, never fatal."""
        try:
            await self.flush_leader_file(timeout_s=timeout_s)
        except Exception as exc:
            self.log.error("leader_file_write_failed", error=f"{type(exc).__name__}: {exc}")

    def _start_write(self) -> asyncio.Task[bool]:
        """Write the current state in a thread, after the writes before it; True once shown."""

        async def write() -> bool:
            async with self._file_lock:
                return await asyncio.to_thread(self._write_leader_file)

        task = asyncio.create_task(write(), name=f"leader-file-write:{self.election.lock}")
        # A write given up on may fail later with nobody awaiting it: that is logged by the writer.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

    async def flush_leader_file(self, *, timeout_s: float | None = None) -> bool:
        """Write the current state now. True once the file shows it; False when the write failed
        or is still under way after `timeout_s` (it then completes in its thread, in order).
        Raises what the write raised (say, no thread could be started)."""
        if self.leader_file is None:
            return True
        write = self._start_write()
        # Not cancelled by a timeout or by our own cancellation: writes land whole and in order.
        done, _ = await asyncio.wait([write], timeout=timeout_s)
        return bool(done) and write.result()

    async def _on_started_leading(self, lease: Lease) -> None:
        self.publish()  # /leader says "leader" from here, before the work starts
        if self.leader_file is not None:
            status = self.election.status()
            if status.is_leader and status.lease_remaining_s is not None:
                self._note_validity(status.now + status.lease_remaining_s)
        # Consumers of the file learn of the term before the command starts.
        await self.flush_leader_file(timeout_s=LEADER_FILE_WAIT_S)
        if self._extra_started is not None:
            await self._extra_started(lease)

    async def _on_stopped_leading(self, reason: StepDownReason) -> None:
        """Stop the work whatever happens; raise if anything here failed, so that the election
        withholds the release (the work, or a file saying "leader", may outlive it)."""
        self.publish()  # /leader stops saying "leader" now, not when the work has stopped
        valid_until, self._valid_until, self._valid_until_ms = self._valid_until, None, None
        write = None
        try:
            if self.leader_file is not None:
                # Consumers learn of the end before the command is stopped: nobody acts on a term
                # being wound down. The command's stop does not wait for a slow volume, though.
                write = self._start_write()
                await asyncio.wait([write], timeout=LEADER_FILE_WAIT_S)
        finally:
            try:
                if self._extra_stopped is not None:
                    await self._extra_stopped(reason)
            finally:
                if self._daemon.settings.exit_on_loss and reason is not StepDownReason.SHUTDOWN:
                    self._daemon.request_exit(
                        EXIT_LOST_LEADERSHIP, reason=f"leadership lost ({reason.value})"
                    )
        if write is not None:
            await self._until_file_says_not_leading(write, valid_until=valid_until)

    async def _until_file_says_not_leading(
        self, write: asyncio.Task[bool], *, valid_until: float | None
    ) -> None:
        """Return once no reader can take the file for a valid leader: it says "not leading", or
        the validity end it shows has passed. Only then may a successor be granted the lease."""
        if valid_until is None:
            return  # the file never showed this term as leading
        deadline = valid_until + LEADER_FILE_EXPIRY_SLACK_S
        done, _ = await asyncio.wait([write], timeout=max(0.0, deadline - self.election.status().now))
        if done and write.result():  # raises what the write raised: the release is then withheld
            return
        self.log.warning(
            "leader_file_not_updated",
            detail="the leader file may still say leader: the release waits for its validity end",
            wait_ms=max(0, round((deadline - self.election.status().now) * 1000)),
        )
        # A write that failed (logged by the writer) leaves the old content: sit out its validity.
        await asyncio.sleep(max(0.0, deadline - self.election.status().now))

    async def run(self, *, start_gate: StartGate | None = None) -> None:
        keeper = None
        if self.leader_file is not None:
            await self.flush_leader_file()  # written in __init__ already: a retry if that failed
            keeper = asyncio.create_task(self._keep_leader_file(), name=f"leader-file:{self.election.lock}")
        # Runs once the election has begun (its first wait): the snapshot then says "started".
        asyncio.get_running_loop().call_soon(self.publish)
        try:
            await self.election.run(start_gate=start_gate)
        finally:
            self.publish()
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
                await self._flush_or_log(timeout_s=1.0)


def _fan_out(
    *hooks: Callable[[CycleOutcome], None], log: structlog.stdlib.BoundLogger
) -> Callable[[CycleOutcome], None]:
    def call_all(outcome: CycleOutcome) -> None:
        for hook in hooks:
            try:
                hook(outcome)
            except Exception:
                log.exception("outcome_hook_failed")

    return call_all


#: How often `republish` wakes, seconds; it republishes every lock at least every
#: REPUBLISH_CYCLE_S (round robin), and at least REPUBLISH_MIN_BATCH locks per wake.
REPUBLISH_PERIOD_S = 0.25
REPUBLISH_CYCLE_S = 5.0
REPUBLISH_MIN_BATCH = 50


def republish_batch(locks: int) -> int:
    """How many locks `republish` republishes per wake: all of them every REPUBLISH_PERIOD_S up
    to REPUBLISH_MIN_BATCH locks, else a share that goes round in REPUBLISH_CYCLE_S."""
    return max(REPUBLISH_MIN_BATCH, math.ceil(locks * REPUBLISH_PERIOD_S / REPUBLISH_CYCLE_S))


async def republish(locks: Sequence[LockElection]) -> None:
    """Republish the locks' status snapshots every REPUBLISH_PERIOD_S, `republish_batch` at a
    time, until cancelled (runs on the election's loop).

    Outcomes and hooks publish every change that ends a cycle, and a follower's new holder
    learned from an announcement as it comes (`on_new_leader`); this catches the rest: a
    request's due time (liveness, whose grace is many seconds). Each publication costs ~3 us
    (a status snapshot): at 500 locks every 0.25 s that was a fifth of a 1,000-lock daemon's
    CPU, so a lock of a big daemon is republished every REPUBLISH_CYCLE_S.
    """
    start = 0
    batch = republish_batch(len(locks))
    while True:
        await asyncio.sleep(REPUBLISH_PERIOD_S)
        for lock in locks[start : start + batch]:
            lock.publish()
        start = start + batch if start + batch < len(locks) else 0
