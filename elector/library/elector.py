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
makes the step-down withhold the release (the lease lapses on Redis by its ttl; logged, counted
in `releases_withheld`), and this Elector does not contend again until that body has exited, nor
before the lease could have lapsed: it never leads beside its own late body (docs/library.md).

Cancellation reaches coroutines only. Threads the body started (`asyncio.to_thread`,
`run_in_executor`, a thread pool) and processes it spawned are NOT stopped by it and may keep
writing after the term ended: stop them from the body's `finally` (the wait above covers that),
and pass `lease.fencing_token` with every write they make, so that the resource rejects a write
of an old term (see `elector.FencedStore` and docs/fencing.md). A cancellation that lands
inside a redis-py asyncio command can be swallowed by redis-py (redis/redis-py#2028, seen with
8.1.0): `lease.check()` before each write catches the end of the term all the same.

Callbacks, plain or async, run one at a time in order in their own task: a slow one never delays
a renewal, and one that raises is logged.

`leadership(timeout=...)` and `wait_for_leadership(timeout=...)` bound the wait to lead
(`LeadershipTimeout`), never the body. Logs go to the `elector.api` logger (see telemetry/outcome_log.py);
`elector.run(main())` makes SIGTERM release the lease; `elector.sync` is the same election for
sync programs, run on a thread of its own.

Time is counted on CLOCK_BOOTTIME (`elector.election.clock`), like the daemon: a suspended host
resumes with its validity seen to have run out.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from elector.backend import RedisSettings
from elector.backend.topologies.factory import LeaseConnections
from elector.backend.topologies.sentinel_watch import (
    SentinelMasterWatcher,
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
    check_identity,
    check_lock_name,
    check_priority,
    default_library_identity,
)
from elector.library._callbacks import CallbackRunner
from elector.library._connections import connect_lease
from elector.library._late_work import LateWork, waiting_for_own_work_gauge
from elector.library._params import (
    ElectorConfigError,
    build_timing,
    checked,
    checked_stand_back,
    checked_timeout,
    lease_source,
)
from elector.library.errors import (
    ForkedElectorError,
    LeadershipLost,
    LeadershipTimeout,
    LeaderWorkNotStopped,
    ProcessBound,
    RedisSetupError,
    WithheldReleaseFilter,
    not_running_message,
    refuse_pickling,
)
from elector.library.term import Leadership, LeadershipScope, TermBody
from elector.telemetry.metrics import ElectionMetrics, MetricFamilies
from elector.telemetry.outcome_log import ElectionLog

__all__ = [
    "Elector",
    "ElectorConfigError",
    "ForkedElectorError",
    "LeaderWorkNotStopped",
    "Leadership",
    "LeadershipLost",
    "LeadershipTimeout",
    "RedisSetupError",
]

# The library's logger keeps the name users filter on (docs/library.md), wherever the module lives.
logger = logging.getLogger("elector.api")
logging.getLogger("elector.election.machine").addFilter(WithheldReleaseFilter())

#: One set of metric families per registry (registering a second one fails), shared by its Electors.
_REGISTRY_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, MetricFamilies] = weakref.WeakKeyDictionary()

OnStartedLeading = Callable[["Leadership"], Awaitable[None] | None]
OnStoppedLeading = Callable[[StepDownReason], Awaitable[None] | None]
OnNewLeader = Callable[[str | None], Awaitable[None] | None]


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

    Timings are checked like the daemon's; `stop_work_s` bounds how long a step-down waits for
    leader work to stop (the module doc). `identity`: $POD_NAME or the host name, the pid and a
    random suffix. `registry`: the daemon's metric families, shared by the Electors given it.
    `fail_fast`: `leadership()` raises `RedisSetupError` while Redis refuses us in a way retrying
    cannot cure (a password, an ACL, a DB index, a topology), instead of waiting.
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
        fail_fast: bool = False,
        _backend: LeaseBackend | None = None,
        _clock: Callable[[], float] | None = None,
    ) -> None:
        self.lock = checked("lock", check_lock_name, lock)
        if not isinstance(fail_fast, bool):
            raise ElectorConfigError("fail_fast", f"must be True or False, got {fail_fast!r}")
        self._fail_fast = fail_fast
        #: Used only in this process: a fork's copy is refused (see errors.ForkedElectorError).
        self._process = ProcessBound(lock=self.lock, what="Elector")
        identity = default_library_identity() if identity is None else identity
        self.identity = checked("identity", check_identity, identity)
        self.timing = build_timing(
            ttl_s=ttl_s,
            renew_interval_s=renew_interval_s,
            renew_deadline_s=renew_deadline_s,
            request_timeout_s=request_timeout_s,
            stop_work_s=stop_work_s,
        )
        self._priority, self._key_prefix = checked("priority", check_priority, priority), key_prefix
        #: Private, for the tests that run the library on an in-memory lease in virtual time: a
        #: backend in place of `redis`, and the clock that backend counts on (default: boottime).
        self._backend, self._clock = _backend, _clock
        self._settings: RedisSettings | None = None
        self._client: aioredis.Redis | None = None
        if _backend is None:
            self._settings, self._client = lease_source(
                redis, cluster=cluster, redlock=redlock, timing=self.timing, key_prefix=self._key_prefix
            )
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
        self._callbacks: CallbackRunner | None = None
        self._term: Leadership | None = None
        self._reported_leader: str | None = None
        self._term_started = asyncio.Event()  # set while a term is active, and once closing
        #: Set (and replaced) at each outcome of the election: something may have changed.
        self._news = asyncio.Event()
        self._closing = False
        self._closed = asyncio.Event()
        self._log = ElectionLog(lock=self.lock, identity=self.identity, ttl_s=self.timing.ttl_s)
        #: Bodies (and the stop callback) of ended terms that outlived stop_work_s, still running.
        self._late_work = LateWork(lock=self.lock, identity=self.identity)
        #: Called first with each cycle's outcome, on the election's task (the sync API's
        #: on_overrun="exit" re-arms its kernel timer there at each renewal).
        self._outcome_listeners: list[Callable[[CycleOutcome], None]] = []

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise refuse_pickling("Elector", self.lock)

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
        self._process.check()
        if self._election is not None:
            raise RuntimeError(f"the Elector of lock {self.lock!r} was already started")
        if self._registry is not None:
            # First, so that nothing is left to close if it raises: ValueError when this lock's
            # metrics are on the registry already (another running Elector of the lock).
            self._metrics = ElectionMetrics(_families_of(self._registry), lock=self.lock, status=self.status)
            waiting_for_own_work_gauge(self._registry).labels(self.lock).set_function(
                lambda: float(self._late_work.running)
            )
        if self._backend is not None:
            backend = self._backend
        else:
            backend, self._connections, self._master_watcher = await connect_lease(
                self._settings, self._client, lock=self.lock, identity=self.identity,
                key_prefix=self._key_prefix, timing=self.timing,
            )  # fmt: skip
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
            clock=boottime if self._clock is None else self._clock,
        )
        self._election = election
        self._callbacks = CallbackRunner(lock=self.lock)
        self._task = asyncio.create_task(election.run(), name=f"elector:{self.lock}")
        self._task.add_done_callback(self._election_ended)

    async def aclose(self) -> None:
        """Stop leader work, release a held lease, run the last callbacks (if cancelled: no release)."""
        self._process.check()  # a fork's copy must never release the parent's lease
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
                assert self._registry is not None
                waiting_for_own_work_gauge(self._registry).remove(self.lock)
            self._closed.set()

    # -- observation and leadership ------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        self._process.check()
        return self._election is not None and self._election.status().is_leader

    def status(self) -> ElectionStatus:
        self._process.check()
        if self._election is None:
            raise RuntimeError(f"the Elector of lock {self.lock!r} is not started")
        return self._election.status()

    # `timeout=`, not asyncio.timeout(): that one would also cancel the body.
    async def wait_for_leadership(self, *, timeout: float | None = None) -> Leadership:  # noqa: ASYNC109
        """Wait until this process leads, and return the term (nothing is cancelled when it ends).

        `timeout`: seconds; `LeadershipTimeout` (a TimeoutError) after that, saying whether Redis
        was reached at all. The Elector keeps contending.

        Only a live term is returned (active, with validity left), and the loop gets a turn
        first: a caller re-entering after a body that blocked the loop past the ttl lets the
        election step down instead of being handed the ended term again and again.
        """
        self._process.check()
        timeout_s = checked_timeout(timeout)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.sleep(0)
                while True:
                    if self._task is None or self._closing or self._task.done():
                        raise RuntimeError(self._not_running())
                    if self._fail_fast and self._log.refusal is not None:
                        raise RedisSetupError(lock=self.lock, error=self._log.refusal)
                    term = self._term
                    if term is None or not term.active:
                        await self._next_term()
                    elif term.remaining() > 0.0:
                        return term
                    else:
                        # Active to the election, over by the clock: it has not had the loop
                        # since. Its next outcome steps down, or renews in time after all.
                        await self._news.wait()
        except TimeoutError:
            assert timeout_s is not None
            holder = self._election.status().holder if self._election is not None else None
            raise LeadershipTimeout(
                lock=self.lock,
                timeout_s=timeout_s,
                holder=None if holder is None else holder.identity,
                redis_reached=self._log.redis_reached,
                last_error=self._log.last_error if self._log.redis_up is not True else None,
            ) from None

    async def _next_term(self) -> None:
        """Until a term starts (or the Elector closes); with `fail_fast`, or the next outcome."""
        if not self._fail_fast:
            await self._term_started.wait()
            return
        waits = [asyncio.ensure_future(self._term_started.wait()), asyncio.ensure_future(self._news.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def leadership(
        self, *, resign_on_exit: bool = True, stand_back_s: float | None = None, timeout: float | None = None
    ) -> LeadershipScope:
        """`async with` this: wait to lead, run the body as leader, cancel it when the term ends.

        Raises `LeadershipLost` if the term ended under the body. When the body ends otherwise, the
        term is resigned (unless `resign_on_exit=False`, or other blocks still run in it): released,
        and no contending for `stand_back_s` (default: one ttl, so every follower gets its turn).
        `timeout` bounds the wait to lead (`LeadershipTimeout`), never the body.
        """
        self._process.check()
        stand_back_s = checked_stand_back(stand_back_s)
        checked_timeout(timeout)
        return LeadershipScope(
            self, resign_on_exit=resign_on_exit, stand_back_s=stand_back_s, timeout_s=timeout
        )

    async def _enter_term(self, body: TermBody, *, timeout_s: float | None) -> Leadership:
        """Wait to lead, then register `body` in the term (no await between: it is still active)."""
        term = await self.wait_for_leadership(timeout=timeout_s)
        term._scopes.add(body)
        return term

    def _not_running(self) -> str:
        crashed = None
        if self._task is not None and self._task.done() and not self._task.cancelled():
            crashed = self._task.exception()
        return not_running_message(
            self.lock, started=self._task is not None, closed=self._closing, crashed=crashed
        )

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
        for listener in self._outcome_listeners:
            listener(outcome)
        news, self._news = self._news, asyncio.Event()
        news.set()
        if outcome.kind is OutcomeKind.RELEASE_WITHHELD:
            self.releases_withheld += 1
            self._late_work.lease_lapses_in((outcome.remaining_ms or 0) / 1000)
        if self._metrics is not None:
            self._metrics.observe(outcome)
        self._log.observe(outcome)
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
        self._term = term = Leadership(lease, status=self._election.status, process=self._process)
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
        scopes = list(term._scopes)
        bodies = term._end(reason)
        waits = list(bodies)
        if self._on_stopped_leading is not None:
            waits.append(self._callbacks.submit("on_stopped_leading", self._on_stopped_leading, reason))
        if not waits:
            return
        # The lease is released only after this returns: give the work its stop_work_s to stop.
        _, pending = await asyncio.wait(waits, timeout=self.timing.stop_work_s)
        if pending:
            # Never lead beside our own late work: no contending until it has exited (and, by
            # the election's own rule, not before the withheld lease could have lapsed).
            assert self._election is not None
            self._late_work.hold(self._election, pending, scopes)
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
