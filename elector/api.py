"""Leader election as an asyncio library: hold a Redis lease while a block of code runs.

    import elector

    async def main() -> None:
        async with elector.Elector("nightly-report", redis="redis://redis:6379/0", ttl_s=10) as e:
            while True:
                try:
                    async with e.leadership() as lease:  # waits until this process leads
                        # Cancelled when leadership is lost, before the lease can expire.
                        await build_report(fencing_token=lease.fencing_token)
                    # Done: the lease was released and another replica may lead.
                except elector.LeadershipLost as exc:
                    log.warning("lost the lead (%s); waiting to lead again", exc.reason)

`Elector` runs the daemon's `Election` in a task of the program's loop. Like `asyncio.timeout()`,
it cancels the task that entered `leadership()` when the term ends, and the block raises
`LeadershipLost` instead (an outside cancellation still propagates). The release waits for the
body (and the `on_stopped_leading` callback), up to `stop_work_s` (part of the safety margin), so
the lease is ours while it unwinds.

The lease is never released while a body still runs. A body still unwinding after `stop_work_s`
(a `finally` that awaits a slow cleanup, a coroutine that swallows the cancellation) makes the
step-down withhold the release: the lease is left to lapse on Redis by its ttl, an error is
logged, `Elector.releases_withheld` goes up by one (and `elector_release_withheld_total{lock}` on
the `registry` passed in), and this process does not contend again before the lease could have
lapsed. A successor is then granted the lease one ttl after the last renewal instead of at once.
A body that runs on past even that is beyond what a lease can fence off in time: only the
fencing token protects the resource then.

Cancellation reaches coroutines only. Threads the body started (`asyncio.to_thread`,
`run_in_executor`, a thread pool) and processes it spawned are NOT stopped by it and may keep
writing after the term ended: stop them from the body's `finally` (the wait above covers that),
and pass `lease.fencing_token` with every write they make, so that the resource rejects a write
of an old term (see `elector.FencedStore` and docs/fencing.md).

Callbacks, plain or async, run one at a time in order in their own task: a slow one never delays
a renewal, and one that raises is logged.

Time is counted on CLOCK_BOOTTIME (`elector.election.clock`), like the daemon: a suspended host
resumes with its validity seen to have run out.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from elector.api_params import (
    ElectorConfigError,
    build_timing,
    checked,
    is_number,
    redis_source,
    redlock_urls,
    with_topology,
)
from elector.backend import RedisLeaseBackend
from elector.backend.topologies.factory import LeaseConnections
from elector.backend.topologies.sentinel_watch import (
    SentinelMasterWatcher,
    default_poll_interval_s,
    watch_master,
)
from elector.election import (
    CycleOutcome,
    Election,
    ElectionHooks,
    ElectionStatus,
    OutcomeKind,
    State,
    StepDownReason,
)
from elector.election.clock import boottime
from elector.lease import (
    Holder,
    Lease,
    LeaseBackend,
    LeaseBackendError,
    check_identity,
    check_lock_name,
    check_priority,
    default_identity,
)
from elector.metrics import ElectionMetrics, MetricFamilies

__all__ = ["Elector", "ElectorConfigError", "LeaderWorkNotStopped", "Leadership", "LeadershipLost"]

logger = logging.getLogger(__name__)

#: One set of metric families per registry (registering a second one fails), shared by its Electors.
_REGISTRY_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, MetricFamilies] = weakref.WeakKeyDictionary()

OnStartedLeading = Callable[["Leadership"], Awaitable[None] | None]
OnStoppedLeading = Callable[[StepDownReason], Awaitable[None] | None]
OnNewLeader = Callable[[str | None], Awaitable[None] | None]
_Call = tuple[str, Callable[[], object], asyncio.Future[None]]


class LeaderWorkNotStopped(Exception):
    """Leader work outlived `stop_work_s`: raised to the election, which withholds the release."""


class LeadershipLost(Exception):
    """The body of `leadership()` was cancelled because the term ended; `reason` says why."""

    def __init__(self, reason: StepDownReason, *, lock: str, fencing_token: int) -> None:
        super().__init__(f"leadership of lock {lock!r} (fencing token {fencing_token}) ended: {reason}")
        self.reason = reason
        self.lock = lock
        self.fencing_token = fencing_token


class Leadership:
    """One term of leadership, from a grant to its step-down. Never shows the lease's secret."""

    def __init__(self, lease: Lease, *, status: Callable[[], ElectionStatus]) -> None:
        self._lease = lease
        self._status = status
        self._end_reason: StepDownReason | None = None
        self._scopes: set[_LeadershipScope] = set()
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
        """Seconds (monotonic clock) this process may still act as leader; 0.0 once it may not.

        Counted from the send time of the last successful renewal, minus the safety margin.
        """
        status = self._status()
        if not self.active or not status.is_leader or status.fencing_token != self.fencing_token:
            return 0.0
        return status.lease_remaining_s or 0.0

    def __repr__(self) -> str:
        return f"Leadership(lock={self.lock!r}, fencing_token={self.fencing_token}, active={self.active})"

    def _end(self, reason: StepDownReason) -> list[asyncio.Future[None]]:
        """Mark the term over and cancel the bodies running in it; futures of their exits."""
        self._end_reason = reason
        for scope in self._scopes:
            scope.cancel_body(reason)
        return [scope.exited for scope in self._scopes]


class _LeadershipScope:
    """One `async with elector.leadership()` block: the task running a body inside a term."""

    def __init__(self, elector: Elector, *, resign_on_exit: bool, stand_back_s: float | None) -> None:
        self._elector = elector
        self._resign_on_exit = resign_on_exit
        self._stand_back_s = stand_back_s
        # The task running the body, its term, and how many cancellations it had pending then.
        self._entered: tuple[asyncio.Task[Any], Leadership, int] | None = None
        self._lost: StepDownReason | None = None
        #: Done when the body left the block; a step-down waits for it (up to stop_work_s).
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def __aenter__(self) -> Leadership:
        task = asyncio.current_task()
        if task is None or self._entered is not None:
            raise RuntimeError("enter each leadership() block once, from inside an asyncio task")
        term = await self._elector.wait_for_leadership()
        # No await from here on: the term is still active when the body is registered in it.
        self._entered = (task, term, task.cancelling())
        term._scopes.add(self)
        return term

    def cancel_body(self, reason: StepDownReason) -> None:
        assert self._entered is not None
        self._lost = reason
        self._entered[0].cancel(msg=f"leadership of lock {self._elector.lock!r} ended: {reason}")

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
            if task.uncancel() <= cancelling and (exc is None or cancelled):
                raise LeadershipLost(self._lost, lock=term.lock, fencing_token=term.fencing_token) from exc
            if exc is not None and not cancelled:
                exc.add_note(f"(raised while stopping after leadership ended: {self._lost})")
        elif self._resign_on_exit and not term._scopes:
            # An outside cancel must not wait for the release: the task is being torn down.
            await self._elector._resign(term, stand_back_s=self._stand_back_s, wait=not cancelled)


class _CallbackRunner:
    """Runs the user's callbacks one at a time, in submission order, in a task of its own."""

    def __init__(self, *, lock: str) -> None:
        self._lock = lock
        self._queue: asyncio.Queue[_Call | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name=f"elector:{lock}:callbacks")

    def submit(self, name: str, callback: Callable[[Any], object], arg: object) -> asyncio.Future[None]:
        """Queue `callback(arg)`; the future is done once it returned or raised (never fails)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((name, lambda: callback(arg), done))
        return done

    async def _run(self) -> None:
        while (item := await self._queue.get()) is not None:
            name, call, done = item
            try:
                result = call()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("%s callback failed", name, extra={"lock": self._lock})
            finally:
                done.set_result(None)

    async def aclose(self, *, drain: bool) -> None:
        """Stop after the queued calls (`drain`) or at once."""
        self._queue.put_nowait(None)
        if self._task is asyncio.current_task():
            return  # a callback closing its own Elector: the loop ends after it returns
        if not drain:
            self._task.cancel()
        await asyncio.wait([self._task])


class Elector:
    """Contends for one lock on Redis from inside an asyncio program.

    Where the lease lives, checked as the daemon checks its `--redis-url`, `--redis-cluster` and
    `--redlock-url` (docs/topologies.md, docs/library.md):

    * `redis`: a URL of one server (`redis://`, `rediss://`, `unix://`) or of a Sentinel set
      (`redis+sentinel://`, followed to a new master at once), for which we build and close our
      own connections without retries; or the program's own `redis.asyncio.Redis`, never closed:
      turn its retries off (`retry=Retry(NoBackoff(), 0)`; warned about otherwise), keep
      `decode_responses=False`.
    * `cluster=True`: `redis` is the URL of one node of a Redis Cluster.
    * `redlock`: instead of `redis`, the URLs of an odd number (3 or more) of independent servers.

    Timings are checked like the daemon's;
    `stop_work_s` bounds how long a step-down waits for leader work to stop (default: a tenth of
    the ttl, if the renew deadline leaves room); work still running then makes it withhold the
    release (see the module doc). `identity` defaults to $POD_NAME or the host name. `registry`:
    the daemon's metric families (elector_*{lock}, `elector_release_withheld_total` among them),
    shared by every Elector given the same registry; a lock's series go at aclose(). Two running
    Electors of one lock on one registry: start() raises ValueError. `releases_withheld` counts
    withheld releases without Prometheus.
    """

    def __init__(
        self,
        lock: str,
        *,
        redis: aioredis.Redis | str | None = None,
        cluster: bool = False,
        redlock: Sequence[str] | None = None,
        identity: str | None = None,
        ttl_s: float = 10.0,
        renew_interval_s: float | None = None,
        renew_deadline_s: float | None = None,
        request_timeout_s: float | None = None,
        stop_work_s: float | None = None,
        priority: int = 0,
        key_prefix: str = "elector",
        on_started_leading: OnStartedLeading | None = None,
        on_stopped_leading: OnStoppedLeading | None = None,
        on_new_leader: OnNewLeader | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.lock = checked("lock", check_lock_name, lock)
        identity = default_identity() if identity is None else identity
        self.identity = checked("identity", check_identity, identity)
        self.timing = build_timing(
            ttl_s=ttl_s,
            renew_interval_s=renew_interval_s,
            renew_deadline_s=renew_deadline_s,
            request_timeout_s=request_timeout_s,
            stop_work_s=stop_work_s,
        )
        self._priority, self._key_prefix = checked("priority", check_priority, priority), key_prefix
        urls = () if redlock is None else redlock_urls(redlock, redis=redis)
        # Redlock's first server stands in for `redis` where one URL and the key prefix are checked.
        settings, self._client = redis_source(
            urls[0] if urls else redis, timing=self.timing, key_prefix=self._key_prefix
        )
        self._settings = with_topology(settings, cluster=cluster, redlock=urls)
        #: Our own connections (built from a URL at start()): the daemon's, whatever the topology.
        self._connections: LeaseConnections | None = None
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._on_new_leader = on_new_leader
        if registry is not None and not isinstance(registry, CollectorRegistry):
            kind = type(registry).__name__
            raise ElectorConfigError(
                "registry", f"expected a prometheus_client.CollectorRegistry, got {kind}"
            )
        self._registry = registry
        self._metrics: ElectionMetrics | None = None
        #: Step-downs whose release was withheld because leader work had not stopped in time.
        self.releases_withheld = 0
        self._election: Election | None = None
        self._task: asyncio.Task[None] | None = None
        self._master_watcher: SentinelMasterWatcher | None = None
        self._callbacks: _CallbackRunner | None = None
        self._term: Leadership | None = None
        self._reported_leader: str | None = None
        self._term_started = asyncio.Event()  # set while a term is active, and once closing
        self._closing = False
        self._closed = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Elector:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start contending in a task of the running loop."""
        if self._election is not None:
            raise RuntimeError(f"the Elector of lock {self.lock!r} was already started")
        if self._registry is not None:
            # First, so that nothing is left to close if it raises: ValueError when this lock's
            # metrics are on the registry already (another running Elector of the lock).
            self._metrics = ElectionMetrics(_families_of(self._registry), lock=self.lock, status=self.status)
        backend = await self._connect()
        if self._client is not None:
            # A client of a redis+sentinel:// URL built by elector (ours, or the caller's from
            # make_client): follow a new master at once (see sentinel_watch.py); None otherwise.
            self._master_watcher = watch_master(
                self._client,
                poll_interval_s=default_poll_interval_s(self.timing.renew_interval_s),
                request_timeout_s=self.timing.request_timeout_s,
            )
        if self._master_watcher is not None:
            self._master_watcher.start()
        hooks = ElectionHooks(
            on_outcome=self._outcome,
            on_new_leader=self._new_leader,
            on_started_leading=self._started_leading,
            on_stopped_leading=self._stopped_leading,
        )
        election = Election(
            backend,
            identity=self.identity,
            timing=self.timing,
            hooks=hooks,
            priority=self._priority,
            # Validity counts suspended time too: Redis expires keys by wall time (see clock.py).
            clock=boottime,
        )
        self._election = election
        self._callbacks = _CallbackRunner(lock=self.lock)
        self._task = asyncio.create_task(election.run(), name=f"elector:{self.lock}")
        self._task.add_done_callback(self._election_ended)

    async def _connect(self) -> LeaseBackend:
        """The lock's backend: on the caller's client, or on connections of our own."""
        if self._settings is None:
            assert self._client is not None
            return RedisLeaseBackend(self._client, lock=self.lock, key_prefix=self._key_prefix)
        self._connections = connections = LeaseConnections(
            self._settings,
            client_name=f"elector:{self.lock}:{self.identity}",
            keepalive_s=max(60.0, 6 * self.timing.ttl_s),  # the election's own default
            request_timeout_s=self.timing.request_timeout_s,
        )
        try:
            await connections.start()  # a cluster's slot map, before the first request
        except LeaseBackendError as exc:
            logger.warning("lock %r: %s (the election retries)", self.lock, exc)
        except BaseException:
            await connections.aclose(within_s=self.timing.request_timeout_s)  # cancelled: leave nothing open
            raise
        # One server or a Sentinel set has a single client (a Sentinel master is watched).
        self._client = connections.client if connections.topology == "standalone" else None
        return connections.backend_for(self.lock)

    async def aclose(self) -> None:
        """Stop leader work, release a held lease, run the last callbacks (if cancelled: no release)."""
        if self._election is None or self._task is None or self._callbacks is None:
            return
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        self._term_started.set()  # waiters in leadership() see the closing and give up
        self._election.stop()
        drain = True
        try:
            await asyncio.wait([self._task])
        except asyncio.CancelledError:
            drain = False
            self._task.cancel()  # its cleanup still tells a running body to stop
            await asyncio.wait([self._task])
            raise
        finally:
            await self._callbacks.aclose(drain=drain)
            if self._master_watcher is not None:
                await self._master_watcher.aclose()
            if self._connections is not None:
                await self._connections.aclose(within_s=self.timing.request_timeout_s)
            if self._metrics is not None:
                self._metrics.close()
            self._closed.set()

    # -- observation and leadership ------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._election is not None and self._election.status().is_leader

    def status(self) -> ElectionStatus:
        if self._election is None:
            raise RuntimeError(f"the Elector of lock {self.lock!r} is not started")
        return self._election.status()

    async def wait_for_leadership(self) -> Leadership:
        """Wait until this process leads, and return the term (nothing is cancelled when it ends)."""
        while True:
            if self._task is None or self._closing or self._task.done():
                raise RuntimeError(f"the Elector of lock {self.lock!r} is not running: use `async with`")
            if self._term is not None and self._term.active:
                return self._term
            await self._term_started.wait()

    def leadership(
        self, *, resign_on_exit: bool = True, stand_back_s: float | None = None
    ) -> _LeadershipScope:
        """`async with` this: wait to lead, run the body as leader, cancel it when the term ends.

        Raises `LeadershipLost` if the term ended under the body. When the body ends otherwise, the
        term is resigned (unless `resign_on_exit=False`, or other blocks still run in it): released,
        and no contending for `stand_back_s` (default: one ttl, so every follower gets its turn).
        """
        if stand_back_s is not None and (not is_number(stand_back_s) or stand_back_s < 0):
            raise ElectorConfigError("stand_back_s", f"must be a non-negative number, got {stand_back_s!r}")
        return _LeadershipScope(self, resign_on_exit=resign_on_exit, stand_back_s=stand_back_s)

    async def _resign(self, term: Leadership, *, stand_back_s: float | None, wait: bool) -> None:
        """Give `term` up and, with `wait`, return once its lease is released (bounded)."""
        if self._election is None or term is not self._term or not term.active or self._closing:
            return
        self._election.resign(stand_back_s=self.timing.ttl_s if stand_back_s is None else stand_back_s)
        if not wait:
            return
        # Taken up after an in-flight renewal, then leader work stops and the release goes out.
        bound_s = self.timing.stop_work_s + 2 * self.timing.request_timeout_s + 0.1
        try:
            async with asyncio.timeout(bound_s):
                await term._finished.wait()
        except TimeoutError:
            logger.warning("releasing lock %r after resigning took over %.3fs", self.lock, bound_s)

    # -- election hooks (run in the election's task) -------------------------------------------

    def _outcome(self, outcome: CycleOutcome) -> None:
        if outcome.kind is OutcomeKind.RELEASE_WITHHELD:
            self.releases_withheld += 1
        if self._metrics is not None:
            self._metrics.observe(outcome)
        term = self._term
        if term is not None and not term.active and outcome.state not in (State.LEADER, State.STEPPING_DOWN):
            term._finished.set()

    def _new_leader(self, holder: Holder | None) -> None:
        identity = holder.identity if holder is not None else None
        if identity == self._reported_leader:
            return  # a new term of the same holder is not a new leader
        self._reported_leader = identity
        if self._on_new_leader is not None and self._callbacks is not None:
            self._callbacks.submit("on_new_leader", self._on_new_leader, identity)

    async def _started_leading(self, lease: Lease) -> None:
        assert self._election is not None
        assert self._callbacks is not None
        self._term = term = Leadership(lease, status=self._election.status)
        self._term_started.set()
        if self._on_started_leading is not None:
            self._callbacks.submit("on_started_leading", self._on_started_leading, term)

    async def _stopped_leading(self, reason: StepDownReason) -> None:
        term = self._term
        if self._callbacks is None:
            return
        if term is None:
            # The election's run ended without ever leading: it calls this once all the same
            # (client-go's "always"), so the user's cleanup runs; there is no work to wait for.
            if self._on_stopped_leading is not None:
                self._callbacks.submit("on_stopped_leading", self._on_stopped_leading, reason)
            return
        if not term.active:
            return
        if not self._closing:
            self._term_started.clear()
        bodies = term._end(reason)
        waits = list(bodies)
        if self._on_stopped_leading is not None:
            waits.append(self._callbacks.submit("on_stopped_leading", self._on_stopped_leading, reason))
        if not waits:
            return
        # The lease is released only after this returns: give the work its stop_work_s to stop.
        _, pending = await asyncio.wait(waits, timeout=self.timing.stop_work_s)
        if pending:
            late_bodies = sum(1 for body in bodies if body in pending)
            late = (
                f"{late_bodies} leadership() body(ies)" if late_bodies else "the on_stopped_leading callback"
            )
            # Raising makes the election withhold the release (it logs it, and emits an outcome
            # RELEASE_WITHHELD): released now, the lease would let a successor start beside work
            # that is still running.
            raise LeaderWorkNotStopped(
                f"{late} of lock {self.lock!r} still running {self.timing.stop_work_s:.3f}s "
                "(stop_work_s) after the term ended; the lease is left to lapse by its ttl"
            )

    def _election_ended(self, task: asyncio.Task[None]) -> None:
        self._term_started.set()  # wake the waiters: wait_for_leadership() raises from now on
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("the election of lock %r crashed", self.lock, exc_info=exc)


def _families_of(registry: CollectorRegistry) -> MetricFamilies:
    families = _REGISTRY_FAMILIES.get(registry)
    if families is None:
        families = _REGISTRY_FAMILIES[registry] = MetricFamilies(registry)
    return families
