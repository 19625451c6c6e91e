"""The `elector run` daemon: wires settings, Redis, the election, HTTP, metrics, logs and signals.

One daemon may hold many locks (one `Election` each, sharing one Redis client); in exec mode it
holds one and runs the leader's command (see execmode/supervisor.py).

Exit codes: 0 after a clean shutdown (the lease released); 1 on a fatal error (the HTTP port is
taken, a task crashed) or when a second signal cut the shutdown short; 3 after losing leadership
with `--exit-on-loss`; in exec mode with `--on-child-exit exit`, the command's own exit code.
Invalid settings exit 2 before this module runs (see cli/options.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
from collections.abc import Callable
from typing import Any, cast

import prometheus_client
from prometheus_client import CollectorRegistry

from elector._version import __version__
from elector.backend.topologies.factory import LeaseConnections
from elector.backend.topologies.sentinel_watch import default_poll_interval_s, watch_master
from elector.daemon.app_health import AppHealthChecker, AppHealthCollector, AppHealthGate
from elector.daemon.execmode.runner import ExecMode, keeper_margin_s
from elector.daemon.execmode.supervisor import (
    AwaitedChildren,
    OrphanReaper,
    become_subreaper,
    watch_children_with_pidfds,
)
from elector.daemon.http import HttpBindError, HttpStats, HttpStatsCollector, make_http_app
from elector.daemon.http_compat import NaisApi, make_compat_app
from elector.daemon.http_thread import HttpThread, Listener
from elector.daemon.lock_election import EXIT_LOST_LEADERSHIP, LockElection, republish
from elector.daemon.logs import configure_logging, make_logger
from elector.daemon.many_locks import (
    BatchedStop,
    RenewalRounds,
    SharedTimers,
    StartGate,
    freeze_long_lived,
    start_spacing_s,
)
from elector.daemon.settings import Settings
from elector.daemon.testing_hooks import install_loop_block_hook
from elector.election import CycleOutcome, Election, State
from elector.election.clock import boottime
from elector.lease import LeaseBackendError
from elector.telemetry.metrics import MetricFamilies, register_process_metrics

EXIT_OK = 0
EXIT_FATAL = 1

__all__ = ["EXIT_FATAL", "EXIT_LOST_LEADERSHIP", "EXIT_OK", "Daemon", "LockElection", "run_daemon"]


#: How much the daemon's thread lowers its CPU priority (nice) once its elections have ended.
SHUTDOWN_NICE_INCREMENT = 10


def yield_cpu() -> None:
    """Lower the calling thread's CPU priority by `SHUTDOWN_NICE_INCREMENT` (never refused)."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(SHUTDOWN_NICE_INCREMENT)


class Daemon:
    """One `elector run` process. Build it inside the running event loop, then `await run()`."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        outcome_observer: Callable[[str, CycleOutcome], None] | None = None,
        yield_cpu_when_done: bool = False,
    ) -> None:
        """`yield_cpu_when_done`: once the elections have ended (the leases released), lower the
        loop thread's CPU priority (`yield_cpu`) for the rest of the shutdown: none of it is
        urgent, while on a shared host the next leader's acquire and command start are (the
        shutdown's CPU, its exit's included, falls in the handoff window). For a
        daemon that owns its process (`run_daemon`): the priority is the thread's, for good."""
        self.settings = settings
        self._yield_cpu_when_done = yield_cpu_when_done
        #: Called with (lock, outcome) for every cycle of every lock: for benchmarks and tests.
        self.outcome_observer = outcome_observer
        #: Many locks wake at the same grid points (many_locks/grid.py): one loop timer each.
        self.shared_timers = SharedTimers(clock=boottime) if len(settings.locks) > 1 else None
        #: ... and their leases due at one grid point are renewed together (many_locks/rounds.py).
        self.renewal_rounds = RenewalRounds(clock=boottime) if len(settings.locks) > 1 else None
        self.registry = registry if registry is not None else CollectorRegistry()
        self.exit_code = EXIT_OK
        self._signals_seen = 0
        self._linger_cut = asyncio.Event()
        self._lingering = False
        self._tasks: list[asyncio.Task[None]] = []
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
        # leaves the old one writable for seconds; see sentinel_watch.py). None for other URLs.
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
        #: --app-health-url: no lock contends unless the app is healthy (app_health.py).
        self.app_health = (
            None
            if settings.app_health is None
            else AppHealthGate(settings.app_health, log=self.log, exec_mode=settings.exec is not None)
        )
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
        self.locks = [
            LockElection(self, lock=lock, families=families, **self._with_app_health(lock, hooks))
            for lock in settings.locks
        ]
        self._app_health_checker: AppHealthChecker | None = None
        if self.app_health is not None and settings.app_health is not None:
            self.app_health.attach([lock.election for lock in self.locks])
            self._app_health_checker = AppHealthChecker(settings.app_health, deliver=self.app_health.observe)
            locks = list(settings.locks) if settings.per_lock_metrics else None
            self.registry.register(AppHealthCollector(self.app_health, locks=locks))
        if self.exec_mode is not None:
            self.exec_mode.attach(self.locks[0].election)
        self._batched_stop = BatchedStop(
            [lock.election for lock in self.locks],
            finished=lambda election: cast(Election, election).status().state is State.STOPPED,
        )
        #: The HTTP connection budget's figures, exported as elector_http_connections*.
        self.http_stats = HttpStats()
        self.registry.register(HttpStatsCollector(self.http_stats))
        self.http = HttpThread(self._http_listeners())

    def _with_app_health(self, lock: str, hooks: dict[str, Any]) -> dict[str, Any]:
        """`hooks` with the app-health gate's outcome observer of `lock` added."""
        gate = self.app_health
        if gate is None:
            return hooks
        other = hooks.get("on_outcome")

        def on_outcome(outcome: CycleOutcome) -> None:
            gate.observe_outcome(lock, outcome)
            if other is not None:
                other(outcome)

        return {**hooks, "on_outcome": on_outcome}

    def _http_listeners(self) -> list[Listener]:
        """What the HTTP thread serves; it reads each lock's published status, never the election."""
        timing = self.settings.timing
        app = make_http_app(
            status=[lock.published for lock in self.locks],
            registry=self.registry,
            # A follower may legitimately sleep a whole ttl; wedged means well past its due time.
            # A leader's step-down may wait for its command for up to the kill grace.
            liveness_grace_s=max(timing.ttl_s, 5.0) + timing.stop_work_s,
            # "Within the last ttl", plus one request's time so a healthy follower never flaps.
            readiness_window_s=timing.ttl_s + timing.request_timeout_s,
        )
        listeners = [Listener("http", app, self.settings.http, stats=self.http_stats)]
        if self.settings.compat_http is not None:
            # Same thread, same budgets; one lock (settings refuse more).
            compat = make_compat_app(status=self.locks[0].published, api=self.settings.compat_api)
            watch = compat.watch if isinstance(compat, NaisApi) else None
            listener = Listener(
                "compat", compat, self.settings.compat_http, stats=HttpStats(), background=watch
            )
            listeners.append(listener)
        return listeners

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
        self._batched_stop.start()

    def request_stop(self, signame: str = "request") -> None:
        """First call: stop gracefully (release the leases). Second: stop at once."""
        self._signals_seen += 1
        if self._lingering:
            # The leases are released already: any signal now only ends the linger.
            self._linger_cut.set()
        elif self._signals_seen == 1:
            self.log.info("shutting_down", signal=signame)
            self._batched_stop.start()
        else:
            self.log.warning("exiting_now", signal=signame, detail="second signal: not waiting for release")
            self.exit_code = EXIT_FATAL
            self._batched_stop.cancel()
            for task in self._tasks:
                task.cancel()

    async def run(self, *, install_signal_handlers: bool = True) -> int:
        settings = self.settings
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            # Before HTTP: the HTTP thread answers at once, and whoever saw it answer may signal.
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, sig.name)
        try:
            await self.http.start()
        except HttpBindError as exc:
            self.log.error("http_bind_failed", error=str(exc))
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self.redis.aclose(within_s=settings.timing.request_timeout_s)
            return EXIT_FATAL
        if install_signal_handlers:
            install_loop_block_hook(loop, log=self.log)  # a fault-injection hook: off by default
        if self._app_health_checker is not None:
            self._app_health_checker.start(loop)  # its own thread; results come back to this loop
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
            version=__version__,
            redis=self.redis.endpoints[0] if len(self.redis.endpoints) == 1 else self.redis.endpoints,
            topology=self.redis.topology,
            http=f"{settings.http.host}:{self.http.bound_port('http')}",
            compat_http=None
            if settings.compat_http is None
            else f"{settings.compat_http.host}:{self.http.bound_port('compat')}",
            locks=len(settings.locks),
            predecessor_lock=settings.predecessor_lock,
            ttl_ms=settings.timing.ttl_ms,
            renew_interval_ms=round(settings.timing.renew_interval_s * 1000),
            renew_deadline_ms=round(settings.timing.renew_deadline_s * 1000),
            request_timeout_ms=round(settings.timing.request_timeout_s * 1000),
            priority=settings.priority,
            command=None if settings.exec is None else list(settings.exec.command),
            kill_grace_ms=None if settings.exec is None else round(settings.exec.kill_grace_s * 1000),
            app_health_url=None if settings.app_health is None else settings.app_health.url,
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
        freeze: asyncio.TimerHandle | None = None
        gate = StartGate(spacing_s=spread_s) if len(self.locks) > 1 else None
        if gate is not None:
            freeze_long_lived(
                until=loop.time() + spread_s * len(self.locks) + settings.timing.ttl_s,
                starting=lambda: gate.starting,
                settle_s=settings.timing.ttl_s,
            )
        else:
            # What start-up built (modules, the election, HTTP: tens of thousands of objects) lives
            # as long as the daemon; unfrozen, every full collection walks it while holding the
            # GIL, on a loaded machine long enough for a renewal to wait behind it (an HTTP
            # flood's garbage brings full collections on).
            # Now (imports, settings, HTTP) and once more when the first term has settled.
            gc.freeze()
            freeze = loop.call_later(settings.timing.ttl_s, gc.freeze)
        self._tasks = [
            asyncio.create_task(self._guarded(lock, start_gate=gate), name=f"election:{lock.election.lock}")
            for lock in self.locks
        ]
        # What the HTTP thread reads between cycles (see lock_election.republish).
        republisher = asyncio.create_task(republish(self.locks), name="status-republish")
        cancelled = False
        try:
            await asyncio.gather(*self._tasks)
        except asyncio.CancelledError:
            cancelled = True
            if self._signals_seen < 2:
                raise
        finally:
            if self._yield_cpu_when_done:
                yield_cpu()
            republisher.cancel()
            if self._app_health_checker is not None and self.app_health is not None:
                self._app_health_checker.stop()
                self.app_health.close()
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
            if freeze is not None:
                freeze.cancel()
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

    async def _guarded(self, lock: LockElection, *, start_gate: StartGate | None = None) -> None:
        try:
            await lock.run(start_gate=start_gate)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug in one election must not leave a pod that looks alive but never leads.
            lock.log.exception("election_crashed")
            self.request_exit(EXIT_FATAL, reason="an election crashed")


def run_daemon(
    settings: Settings, *, outcome_observer: Callable[[str, CycleOutcome], None] | None = None
) -> int:
    """Run the daemon until it stops; returns the process exit code."""
    configure_logging(settings.logs)
    # The daemon owns its process: drop prometheus_client's `*_created` series (a process-wide
    # switch). No dashboard or alert reads them, and they are a third of a scrape's series, and
    # of its render's CPU.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

    async def main() -> int:
        if settings.exec is not None:
            # Process-wide too: the daemon's children are waited for in its loop (see there).
            watch_children_with_pidfds(asyncio.get_running_loop())
        return await Daemon(settings, outcome_observer=outcome_observer, yield_cpu_when_done=True).run()

    return asyncio.run(main())
