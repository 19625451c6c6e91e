"""The `elector run` daemon: wires settings, Redis, the election, HTTP, metrics, logs and signals.

Exit codes: 0 after a clean shutdown (the lease released); 1 on a fatal error (the HTTP port is
taken, a task crashed) or when a second signal cut the shutdown short; 3 after losing leadership
with `--exit-on-loss`. Invalid settings exit 2 before this module runs (see cli.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

import structlog
from prometheus_client import CollectorRegistry

from elector.backend import RedisLeaseBackend, make_client, redact_url
from elector.config import Settings
from elector.election import CycleOutcome, Election, ElectionHooks, ElectionStatus, StepDownReason
from elector.http import HttpBindError, HttpServer, make_http_app
from elector.logs import OutcomeLogger, configure_logging, make_logger
from elector.metrics import ElectionMetrics, register_process_metrics

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_LOST_LEADERSHIP = 3


class Daemon:
    """One `elector run` process. Build it inside the running event loop, then `await run()`."""

    def __init__(self, settings: Settings, *, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.exit_code = EXIT_OK
        self._signals_seen = 0
        self._election_task: asyncio.Task[None] | None = None
        self._client = make_client(settings.redis, client_name=f"elector:{settings.lock}:{settings.identity}")
        backend = RedisLeaseBackend(self._client, lock=settings.lock, key_prefix=settings.redis.key_prefix)
        self.log = make_logger("elector", context=self._log_context)
        outcome_logger = OutcomeLogger(self.log)
        register_process_metrics(self.registry)
        # The election reports to the metrics, the metrics read the election's status at scrape.
        self.metrics = ElectionMetrics(self.registry, lock=settings.lock, status=self._status)
        self.election = Election(
            backend,
            identity=settings.identity,
            timing=settings.timing,
            hooks=ElectionHooks(
                on_outcome=_fan_out(outcome_logger, self.metrics.observe, log=self.log),
                on_stopped_leading=self._on_stopped_leading,
            ),
        )
        timing = settings.timing
        self.http = HttpServer(
            make_http_app(
                status=self.election.status,
                registry=self.registry,
                # A follower may legitimately sleep a whole ttl; wedged means well past its due time.
                liveness_grace_s=max(timing.ttl_s, 5.0),
                # "Within the last ttl", plus one request's time so a healthy follower never flaps.
                readiness_window_s=timing.ttl_s + timing.request_timeout_s,
            ),
            settings=settings.http,
        )

    def _status(self) -> ElectionStatus:
        return self.election.status()

    def _log_context(self) -> dict[str, object]:
        status = self.election.status()
        return {
            "lock": status.lock,
            "identity": status.identity,
            "state": status.state.value,
            "fencing_token": status.fencing_token,
        }

    async def _on_stopped_leading(self, reason: StepDownReason) -> None:
        if self.settings.exit_on_loss and reason is not StepDownReason.SHUTDOWN:
            self.log.warning("exiting_after_loss", reason=reason.value, exit_code=EXIT_LOST_LEADERSHIP)
            self.exit_code = EXIT_LOST_LEADERSHIP
            self.election.stop()

    def request_stop(self, signame: str = "request") -> None:
        """First call: stop gracefully (release the lease). Second: stop at once."""
        self._signals_seen += 1
        if self._signals_seen == 1:
            self.log.info("shutting_down", signal=signame)
            self.election.stop()
        else:
            self.log.warning("exiting_now", signal=signame, detail="second signal: not waiting for release")
            self.exit_code = EXIT_FATAL
            if self._election_task is not None:
                self._election_task.cancel()

    async def run(self, *, install_signal_handlers: bool = True) -> int:
        settings = self.settings
        loop = asyncio.get_running_loop()
        try:
            await self.http.start()
        except HttpBindError as exc:
            self.log.error("http_bind_failed", error=str(exc))
            await self._client.aclose()
            return EXIT_FATAL
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, sig.name)
        self.log.info(
            "started",
            redis=redact_url(settings.redis.url),
            http=f"{settings.http.host}:{self.http.bound_port}",
            ttl_ms=settings.timing.ttl_ms,
            renew_interval_ms=round(settings.timing.renew_interval_s * 1000),
            renew_deadline_ms=round(settings.timing.renew_deadline_s * 1000),
            request_timeout_ms=round(settings.timing.request_timeout_s * 1000),
        )
        self._election_task = asyncio.create_task(self.election.run(), name=f"election:{settings.lock}")
        try:
            await self._election_task
        except asyncio.CancelledError:
            if self._signals_seen < 2:
                raise
        except Exception:
            # A bug in the election must not leave a pod that looks alive but never leads.
            self.log.exception("election_crashed")
            self.exit_code = EXIT_FATAL
        finally:
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self.http.stop()
            with contextlib.suppress(Exception):
                await self._client.aclose()
        self.log.info("stopped", exit_code=self.exit_code)
        return self.exit_code


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


def run_daemon(settings: Settings) -> int:
    """Run the daemon until it stops; returns the process exit code."""
    configure_logging(settings.logs)

    async def main() -> int:
        return await Daemon(settings).run()

    return asyncio.run(main())
