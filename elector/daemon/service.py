"""The `elector run` daemon: wires settings, Redis, the election, HTTP, metrics, logs and signals.

One daemon may hold many locks (one `Election` each, sharing one Redis client); in exec mode it
holds one and runs the leader's command (see exec_mode.py).

Exit codes: 0 after a clean shutdown (the lease released); 1 on a fatal error (the HTTP port is
taken, a task crashed) or when a second signal cut the shutdown short; 3 after losing leadership
with `--exit-on-loss`; in exec mode with `--on-child-exit exit`, the command's own exit code.
Invalid settings exit 2 before this module runs (see cli.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client
import structlog
from prometheus_client import CollectorRegistry

from elector.backend import RedisLeaseBackend
from elector.backend.topologies.factory import LeaseConnections
from elector.backend.topologies.sentinel_watch import default_poll_interval_s, watch_master
from elector.daemon.execmode.runner import ExecMode, keeper_margin_s
from elector.daemon.execmode.supervisor import AwaitedChildren, OrphanReaper, become_subreaper
from elector.daemon.http import HttpBindError, HttpServer, make_http_app
from elector.daemon.leader_file import LEADER_FILE_WAIT_S, LeaderFileWriter
from elector.daemon.logs import OutcomeLogger, configure_logging, make_logger
from elector.daemon.settings import Settings
from elector.daemon.testing_hooks import install_loop_block_hook
from elector.election import CycleOutcome, Election, ElectionHooks, ElectionStatus, State, StepDownReason
from elector.election.clock import boottime
from elector.lease import Lease, LeaseBackendError
from elector.metrics import ElectionMetrics, MetricFamilies, register_process_metrics

#: Past a term's validity end, how long a step-down still waits for a leader file it could not
#: update, seconds: the file's valid_until_ms was rounded down, this covers the wall clock being
#: slewed by NTP against CLOCK_BOOTTIME meanwhile.
LEADER_FILE_EXPIRY_SLACK_S = 0.05

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_LOST_LEADERSHIP = 3


class LockElection:
    """One lock of the daemon: its election, metrics, log lines and leader file."""

    def __init__(
        self,
        daemon: Daemon,
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
        backend = daemon.redis.backend_for(lock)
        # Named in the warning about a foreign value at the key (a Redlock lease has one per server).
        lease_key = backend.keys.lease if isinstance(backend, RedisLeaseBackend) else None
        self.log = make_logger("elector", context=self.log_context)
        leader_file = settings.leader_file_for(lock)
        self.leader_file = (
            None
            if leader_file is None
            else LeaderFileWriter(leader_file, lock=lock, identity=settings.identity)
        )
        self.metrics = ElectionMetrics(families, lock=lock, status=self.status)
        self.election = Election(
            backend,
            identity=settings.identity,
            timing=settings.timing,
            hooks=ElectionHooks(
                on_outcome=_fan_out(
                    OutcomeLogger(self.log, lease_key=lease_key),
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
                on_started_leading=self._on_started_leading,
                on_stopped_leading=self._on_stopped_leading,
            ),
            priority=settings.priority,
            # Validity counts suspended time too: Redis expires keys by wall time (see clock.py).
            clock=boottime,
            # Locks started together would renew together forever: one burst of a thousand
            # requests every interval. A little early jitter spreads them out within minutes.
            renew_jitter_share=0.1 if len(settings.locks) > 1 else 0.0,
        )
        if self.leader_file is not None:
            # First thing, before Redis or HTTP: the file a killed predecessor left may still say
            # "leader" (its validity end already tells readers not to trust it, but say so plainly).
            self._write_leader_file()

    def status(self) -> ElectionStatus:
        return self.election.status()

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

    async def run(self, *, start_delay_s: float = 0.0) -> None:
        keeper = None
        if self.leader_file is not None:
            await self.flush_leader_file()  # written in __init__ already: a retry if that failed
            keeper = asyncio.create_task(self._keep_leader_file(), name=f"leader-file:{self.election.lock}")
        try:
            await self.election.run(start_delay_s=start_delay_s)
        finally:
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
                await self._flush_or_log(timeout_s=1.0)


class Daemon:
    """One `elector run` process. Build it inside the running event loop, then `await run()`."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        outcome_observer: Callable[[str, CycleOutcome], None] | None = None,
    ) -> None:
        self.settings = settings
        #: Called with (lock, outcome) for every cycle of every lock: for benchmarks and tests.
        self.outcome_observer = outcome_observer
        self.registry = registry if registry is not None else CollectorRegistry()
        self.exit_code = EXIT_OK
        self._signals_seen = 0
        self._linger_cut = asyncio.Event()
        self._lingering = False
        self._tasks: list[asyncio.Task[None]] = []
        #: The next batch of `_stop_elections`, while a shutdown of many locks is under way.
        self._stop_handle: asyncio.TimerHandle | None = None
        self._reaper: OrphanReaper | None = None
        self.locks: list[LockElection] = []
        name = settings.lock if len(settings.locks) == 1 else f"{len(settings.locks)}-locks"
        # Every lock shares one pub/sub connection per server, and requests that fall due together
        # (1,000 locks started at once renew together) go out as one pipeline.
        self.redis = LeaseConnections(
            settings.redis,
            client_name=f"elector:{name}:{settings.identity}",
            keepalive_s=max(60.0, 6 * settings.timing.ttl_s),
            request_timeout_s=settings.timing.request_timeout_s,
        )
        # A redis+sentinel:// URL: move the connections to a new master at once (a planned failover
        # leaves the old one writable for ~10 s; see sentinel_watch.py). None for other URLs.
        self.master_watcher = (
            watch_master(
                self.redis.client,
                poll_interval_s=default_poll_interval_s(settings.timing.renew_interval_s),
                request_timeout_s=settings.timing.request_timeout_s,
            )
            if self.redis.topology == "standalone"
            else None
        )
        self.log = make_logger("elector", context=self._log_context)
        register_process_metrics(self.registry)
        families = MetricFamilies(self.registry, per_lock=settings.per_lock_metrics)
        self.exec_mode: ExecMode | None = None
        # Shared by the command's supervisor and the orphan reaper: neither reaps the other's.
        self._children = AwaitedChildren()
        hooks: dict[str, Any] = {}
        if settings.exec is not None:
            self.exec_mode = ExecMode(
                settings.exec,
                log=self.log,
                request_exit=self._command_exit,
                children=self._children,
                # The command's keeper kills it by the lease's deadline even if this process dies.
                keeper_margin_s=keeper_margin_s(settings.timing.stop_work_s),
                registry=self.registry,
            )
            hooks = {
                "on_started_leading": self.exec_mode.on_started_leading,
                "on_stopped_leading": self.exec_mode.on_stopped_leading,
                "on_outcome": self.exec_mode.observe,  # renewals' validity ends, to the keeper
            }
        self.locks = [LockElection(self, lock=lock, families=families, **hooks) for lock in settings.locks]
        if self.exec_mode is not None:
            self.exec_mode.attach(self.locks[0].election)
        timing = settings.timing
        self.http = HttpServer(
            make_http_app(
                status=[lock.status for lock in self.locks],
                registry=self.registry,
                # A follower may legitimately sleep a whole ttl; wedged means well past its due time.
                # A leader's step-down may wait for its command for up to the kill grace.
                liveness_grace_s=max(timing.ttl_s, 5.0) + timing.stop_work_s,
                # "Within the last ttl", plus one request's time so a healthy follower never flaps.
                readiness_window_s=timing.ttl_s + timing.request_timeout_s,
            ),
            settings=settings.http,
        )

    @property
    def election(self) -> Election:
        """The first lock's election (the only one in exec mode)."""
        return self.locks[0].election

    def _log_context(self) -> dict[str, object]:
        if len(self.locks) == 1:
            return self.locks[0].log_context()
        return {"identity": self.settings.identity, "locks": len(self.settings.locks)}

    def _command_exit(self, code: int) -> None:
        self.request_exit(code, reason="the command exited (--on-child-exit exit)")

    def request_exit(self, code: int, *, reason: str) -> None:
        """Stop every election gracefully (release), then exit with `code`."""
        if self.exit_code == EXIT_OK:
            self.exit_code = code
        self.log.warning("exiting", reason=reason, exit_code=code)
        self._stop_elections()

    def request_stop(self, signame: str = "request") -> None:
        """First call: stop gracefully (release the leases). Second: stop at once."""
        self._signals_seen += 1
        if self._lingering:
            # The leases are released already: any signal now only ends the linger.
            self._linger_cut.set()
        elif self._signals_seen == 1:
            self.log.info("shutting_down", signal=signame)
            self._stop_elections()
        else:
            self.log.warning("exiting_now", signal=signame, detail="second signal: not waiting for release")
            self.exit_code = EXIT_FATAL
            if self._stop_handle is not None:
                self._stop_handle.cancel()
            for task in self._tasks:
                task.cancel()

    def _stop_elections(self, start: int = 0) -> None:
        """Stop the elections (each releases its lease) STOP_BATCH at a time, one batch per
        STOP_BATCH_INTERVAL_S: 10,000 releases and step-down lines at once took the core for
        seconds and most releases timed out (release_failed, leases left to expire)."""
        self._stop_handle = None
        for lock in self.locks[start : start + STOP_BATCH]:
            lock.election.stop()
        if start + STOP_BATCH < len(self.locks):
            self._stop_handle = asyncio.get_running_loop().call_later(
                STOP_BATCH_INTERVAL_S, self._stop_elections, start + STOP_BATCH
            )

    async def run(self, *, install_signal_handlers: bool = True) -> int:
        settings = self.settings
        loop = asyncio.get_running_loop()
        try:
            await self.http.start()
        except HttpBindError as exc:
            self.log.error("http_bind_failed", error=str(exc))
            await self.redis.aclose(within_s=settings.timing.request_timeout_s)
            return EXIT_FATAL
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, sig.name)
            install_loop_block_hook(loop, log=self.log)  # a fault-injection hook: off by default
        if self.exec_mode is not None or os.getpid() == 1:
            # Orphans of the command (a `sh -c` whose shell died) are re-parented to us, not to
            # init, so that they can be found, killed and reaped; as PID 1 we reap every orphan.
            if self.exec_mode is not None:
                become_subreaper()
            self._reaper = OrphanReaper(
                children=self._children, exclude=lambda: self.exec_mode.child_pid if self.exec_mode else None
            )
            await self._reaper.start()
        self.log.info(
            "started",
            redis=self.redis.endpoints[0] if len(self.redis.endpoints) == 1 else self.redis.endpoints,
            topology=self.redis.topology,
            http=f"{settings.http.host}:{self.http.bound_port}",
            locks=len(settings.locks),
            ttl_ms=settings.timing.ttl_ms,
            renew_interval_ms=round(settings.timing.renew_interval_s * 1000),
            renew_deadline_ms=round(settings.timing.renew_deadline_s * 1000),
            request_timeout_ms=round(settings.timing.request_timeout_s * 1000),
            priority=settings.priority,
            command=None if settings.exec is None else list(settings.exec.command),
            kill_grace_ms=None if settings.exec is None else round(settings.exec.kill_grace_s * 1000),
            pid=os.getpid(),
        )
        try:
            await self.redis.start()
        except LeaseBackendError as exc:
            # Not fatal: the elections retry with back-off, and /readyz says Redis is unreachable.
            self.log.warning("redis_unreachable", error=str(exc), detail="at start-up")
        if self.master_watcher is not None:
            self.master_watcher.start()  # its loop never raises; closed in the finally below
        spread_s = start_spacing_s(len(self.locks), ttl_s=settings.timing.ttl_s,
                                   renew_interval_s=settings.timing.renew_interval_s)  # fmt: skip
        gc_thresholds = gc.get_threshold()  # restored below (the library and tests run it in-process)
        if len(self.locks) > 1:
            _freeze_long_lived(until=loop.time() + spread_s * len(self.locks) + settings.timing.ttl_s)
        self._tasks = [
            asyncio.create_task(
                self._guarded(lock, start_delay_s=index * spread_s), name=f"election:{lock.election.lock}"
            )
            for index, lock in enumerate(self.locks)
        ]
        cancelled = False
        try:
            await asyncio.gather(*self._tasks)
        except asyncio.CancelledError:
            cancelled = True
            if self._signals_seen < 2:
                raise
        finally:
            if self.exec_mode is not None:
                # Normally stopped by the election's own hook; this covers a crash or a cancel.
                with contextlib.suppress(Exception):
                    await self.exec_mode.close()
            if self._reaper is not None:
                await self._reaper.stop()
            if not cancelled:
                with contextlib.suppress(asyncio.CancelledError):  # clean-up below must still run
                    await self._linger()
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self.http.stop()
            # After a second signal nothing may wait for a Redis that does not answer.
            close_within_s = 0.05 if self._signals_seen >= 2 else settings.timing.request_timeout_s
            if self.master_watcher is not None:
                with contextlib.suppress(Exception, TimeoutError):
                    async with asyncio.timeout(close_within_s):
                        await self.master_watcher.aclose()
            await self.redis.aclose(within_s=close_within_s)
            gc.set_threshold(*gc_thresholds)
        self.log.info("stopped", exit_code=self.exit_code)
        return self.exit_code

    async def _linger(self) -> None:
        """Keep HTTP up a while after the leases were released, for Prometheus's last scrape.

        The shutdown step-down is counted as the daemon stops; without a scrape after it, rolling
        updates (the most common leader change) never show up in elector_step_downs_total.
        """
        linger_s = self.settings.shutdown_linger_s
        if linger_s <= 0 or self._signals_seen >= 2:
            return
        self.log.info("lingering", seconds=linger_s, detail="serving final metrics; a second signal ends it")
        self._lingering = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._linger_cut.wait(), timeout=linger_s)

    async def _guarded(self, lock: LockElection, *, start_delay_s: float = 0.0) -> None:
        try:
            await lock.run(start_delay_s=start_delay_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug in one election must not leave a pod that looks alive but never leads.
            lock.log.exception("election_crashed")
            self.request_exit(EXIT_FATAL, reason="an election crashed")


#: A daemon of many locks starts one lock at most this often (seconds): each start subscribes,
#: acquires and logs a line, ~0.3 ms of CPU, so that 10,000 locks started within one renew
#: interval would take the whole core and time their own requests out.
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


#: A daemon of many locks stops (releases) this many locks at once, one batch per STOP_BATCH_INTERVAL_S
#: (one release pipeline each): 10,000 locks stop within 4 s, well within a pod's grace period.
STOP_BATCH = 50
STOP_BATCH_INTERVAL_S = 0.02

#: The collector's thresholds in a daemon of many locks (CPython's default: 700, 10, 10). A young
#: collection runs when the tracked objects allocated less those freed pass the first figure; a
#: batch of a few hundred replies transiently holds thousands of objects (futures, handles, reply
#: lists) that die a moment later, so at 700 the collector ran ~40 times a second at 10,000 locks,
#: promoted those transients and, every few seconds, walked every object alive in a full
#: collection (~150-600 ms: the renew p99). At 20,000 only objects that outlive their batch count
#: (the cyclic garbage of errors, new long-lived state): a young collection a minute at 10,000
#: locks, a full one seldom. What that garbage can pile up to is bounded by the same 20,000 objects.
MANY_LOCKS_GC_THRESHOLDS = (20_000, 20, 10)

#: How often `_freeze_long_lived` moves what start-up made out of the collector's sight, seconds.
FREEZE_PERIOD_S = 0.5


def _freeze_long_lived(*, until: float) -> None:
    """Move every object tracked by the garbage collector into its permanent generation (gc.freeze),
    now and every FREEZE_PERIOD_S until loop time `until`.

    The elections, their tasks, subscriptions and metrics live as long as the daemon. Left to the
    collector, every full collection walks them all: at 5,000 locks each took ~0.4 s while the
    locks were starting (a full collection comes every second or two then), which was the whole
    renew p99 of the first minute. Frozen, they are never walked again; what start-up left as
    cyclic garbage at a freeze (little: no exception escapes a healthy cycle) is kept for good.
    """
    gc.freeze()
    loop = asyncio.get_running_loop()
    if loop.time() < until:
        loop.call_later(FREEZE_PERIOD_S, functools.partial(_freeze_long_lived, until=until))
    else:  # start-up is over: steady running from here on (see MANY_LOCKS_GC_THRESHOLDS)
        gc.set_threshold(*MANY_LOCKS_GC_THRESHOLDS)


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


def run_daemon(
    settings: Settings, *, outcome_observer: Callable[[str, CycleOutcome], None] | None = None
) -> int:
    """Run the daemon until it stops; returns the process exit code."""
    configure_logging(settings.logs)
    # The daemon owns its process: drop prometheus_client's `*_created` series (a process-wide
    # switch). No dashboard or alert reads them, and they are a third of a scrape's series: at
    # 1,000 locks 64,000 series took ~0.9 s of CPU to render at every scrape.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

    async def main() -> int:
        return await Daemon(settings, outcome_observer=outcome_observer).run()

    return asyncio.run(main())
