"""Leadership follows the app: the daemon checks its application's health URL and gates the
election on the answers (`--app-health-url`).

Two parts, on two sides of the isolation rule (docs/design.md, "Isolation"):

- `AppHealthChecker` asks the URL every interval from a thread of its own, with blocking
  sockets bounded by one deadline per check (connect, send, read: all of it within the
  timeout) and by bytes (the answer's head only, at most MAX_HEAD_BYTES; the body is never
  read). A slow, hung or hostile app costs that thread its time, never the election's loop: the
  loop only receives each check's result, handed over with `call_soon_threadsafe`.
- `AppHealthGate`, on the election's loop, turns the results into a verdict and acts on the
  elections: `failures` failures in a row (an answer other than 2xx, a timeout, a refused or
  reset connection) make the app unhealthy, one success healthy again. While the app is not
  healthy (and before its first success) no election contends (`Election.gate_contending`);
  a leader whose app turns unhealthy resigns with `StepDownReason.APP_UNHEALTHY`: its work is
  stopped, then the lease released, and the release's announcement wakes the followers at once.

Hysteresis: a leader hands over for its app's health only once it has led `min_term_s`. Every
leadership change the gate causes ends a term at least that long, so a flapping app (or a fleet
of them) cannot move leadership more often than once per `min_term_s`. In exec mode this is also
the command's start-up grace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence

import h11
import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from elector.election import CycleOutcome, Election, OutcomeKind, State, StepDownReason
from elector.election.clock import boottime

#: The most of an answer the checker reads: its status line and headers; the body is never read.
MAX_HEAD_BYTES = 8 * 1024
#: Bounds of the settings, checked up front (settings.py).
MIN_INTERVAL_S = 0.05
MAX_FAILURES = 100
USER_AGENT = "elector-app-health"
#: Without a single success for this long, the daemon says why it never leads (once).
NEVER_HEALTHY_WARN_S = 60.0


class CheckResult(enum.StrEnum):
    """What one check found; only OK counts as a success."""

    OK = "ok"
    #: An answer other than 2xx (redirects are not followed).
    STATUS = "status"
    TIMEOUT = "timeout"
    #: Connection refused or reset, or the host unreachable.
    REFUSED = "refused"
    #: Not HTTP, a head above MAX_HEAD_BYTES, a TLS failure.
    BAD_ANSWER = "bad_answer"


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    result: CheckResult
    #: A short description for the log: the status code, the error.
    detail: str
    #: How long the check took, seconds.
    duration_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class AppHealthSettings:
    url: str
    interval_s: float = 1.0
    failures: int = 3
    timeout_s: float = 0.5
    #: The hysteresis floor: a leader hands over for its app's health only after leading this long.
    min_term_s: float = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """Where a check goes, from the URL."""

    https: bool
    host: str
    port: int
    #: The request target: path and query.
    target: str
    #: The Host header.
    authority: str


def parse_app_health_url(url: str) -> Target:
    """The URL's parts; ValueError naming what is wrong. http:// or https:// (HTTPS as the
    kubelet's probes do it: the certificate is not verified)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r}: the scheme must be http or https, e.g. http://127.0.0.1:8080/healthz")
    if not parts.hostname:
        raise ValueError(f"{url!r} has no host, e.g. http://127.0.0.1:8080/healthz")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{url!r}: credentials in the URL are not supported")
    if parts.fragment:
        raise ValueError(f"{url!r}: a fragment (#...) is never sent; drop it")
    https = parts.scheme == "https"
    port = port if port is not None else (443 if https else 80)
    if port == 0:
        raise ValueError(f"{url!r}: port 0 cannot be connected to")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(ord(char) < 0x21 or ord(char) == 0x7F for char in target):
        raise ValueError(f"{url!r}: the path must not contain blanks or control characters")
    host = parts.hostname
    authority = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        authority += f":{port}"
    return Target(https=https, host=host, port=port, target=target, authority=authority)


def check_once(target: Target, *, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> Check:
    """One check, blocking, all of it within `timeout_s` (call it off the election's loop)."""
    started = clock()
    deadline = started + timeout_s

    def left() -> float:
        remaining = deadline - clock()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    def done(result: CheckResult, detail: str) -> Check:
        return Check(result, detail, clock() - started)

    sock: socket.socket | None = None
    try:
        sock = socket.create_connection((target.host, target.port), timeout=left())
        if target.https:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            sock.settimeout(left())
            sock = context.wrap_socket(sock, server_hostname=target.host)
        connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        request = h11.Request(
            method="GET",
            target=target.target,
            headers=[
                ("Host", target.authority),
                ("User-Agent", USER_AGENT),
                ("Accept", "*/*"),
                ("Connection", "close"),
            ],
        )
        sock.settimeout(left())
        sock.sendall(connection.send(request) + connection.send(h11.EndOfMessage()))
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                sock.settimeout(left())
                connection.receive_data(sock.recv(MAX_HEAD_BYTES))
                continue
            if isinstance(event, h11.Response):
                if 200 <= event.status_code < 300:
                    return done(CheckResult.OK, str(event.status_code))
                return done(CheckResult.STATUS, f"HTTP {event.status_code}")
            if isinstance(event, h11.ConnectionClosed):
                return done(CheckResult.BAD_ANSWER, "closed without an answer")
            # InformationalResponse (1xx): the final answer follows.
    except TimeoutError:
        return done(CheckResult.TIMEOUT, f"no answer within {timeout_s * 1000:g}ms")
    except h11.RemoteProtocolError as exc:
        return done(CheckResult.BAD_ANSWER, f"not an HTTP answer: {exc}")
    except ssl.SSLError as exc:
        return done(CheckResult.BAD_ANSWER, f"TLS: {exc.reason or exc}")
    except OSError as exc:
        return done(CheckResult.REFUSED, exc.strerror or type(exc).__name__)
    finally:
        if sock is not None:
            sock.close()


class AppHealthChecker:
    """Checks the URL every interval in a thread of its own and hands each `Check` to `deliver`
    on `loop` (the election's), never waiting on it. Checks never overlap: one that takes its
    whole timeout delays the next by at most that much past its interval (timeout <= interval)."""

    def __init__(
        self,
        settings: AppHealthSettings,
        *,
        deliver: Callable[[Check], None],
        check: Callable[[], Check] | None = None,
    ) -> None:
        target = parse_app_health_url(settings.url)
        self._settings = settings
        self._deliver = deliver
        self._check = check or (lambda: check_once(target, timeout_s=settings.timeout_s))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._main, name="elector-app-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it ends within one check's timeout; nothing waits for it)."""
        self._stop.set()

    def _main(self) -> None:
        assert self._loop is not None
        due = time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            began = time.monotonic()
            check = self._check()
            if self._stop.is_set():
                return
            try:
                self._loop.call_soon_threadsafe(self._deliver, check)
            except RuntimeError:
                return  # the loop is closed: the daemon has ended
            due = max(began + self._settings.interval_s, time.monotonic())


class AppHealthGate:
    """The verdict on the app's health, applied to the elections (on the election's loop)."""

    def __init__(
        self,
        settings: AppHealthSettings,
        *,
        log: structlog.stdlib.BoundLogger,
        exec_mode: bool = False,
        clock: Callable[[], float] = boottime,
    ) -> None:
        """`exec_mode`: the URL is the command's health (the warning of a never-healthy app says
        what that means)."""
        self._settings = settings
        self._log = log
        self._exec_mode = exec_mode
        self._clock = clock
        self._started_at = clock()
        self._warned_never_healthy = False
        self._never_healthy = True
        #: None until the first success: an app that never answered healthy never leads.
        self._healthy: bool | None = None
        self._failures = 0
        self._elections: dict[str, Election] = {}
        #: Each leading lock's term start (election clock).
        self._led_since: dict[str, float] = {}
        self._deferred: asyncio.TimerHandle | None = None
        self.checks: dict[CheckResult, int] = dict.fromkeys(CheckResult, 0)

    @property
    def healthy(self) -> bool:
        """Whether the app is healthy now (False before its first success); any thread reads it."""
        return self._healthy is True

    def attach(self, elections: Sequence[Election]) -> None:
        """Gate `elections`: none contends until the app's first success."""
        for election in elections:
            self._elections[election.lock] = election
            election.gate_contending(may_contend=self.healthy)

    def observe_outcome(self, lock: str, outcome: CycleOutcome) -> None:
        """Every cycle's outcome of `lock`: the gate counts a term from its grant."""
        if outcome.kind is OutcomeKind.ACQUIRED:
            # From the grant's answer: the term began for everyone who saw it begin.
            self._led_since[lock] = outcome.at + (outcome.duration_s or 0.0)
            if not self.healthy:
                # Granted by an acquire sent just before the app turned unhealthy.
                self._apply()
        elif outcome.state is not State.LEADER:
            self._led_since.pop(lock, None)

    def observe(self, check: Check) -> None:
        """One check's result (delivered on the election's loop by the checker)."""
        self.checks[check.result] += 1
        if check.result is CheckResult.OK:
            self._failures = 0
            self._never_healthy = False
            if self._healthy is not True:
                self._healthy = True
                self._log.info("app_healthy", url=self._settings.url, detail=check.detail)
                self._apply()
            return
        self._failures += 1
        if not self._warned_never_healthy and self._healthy is not True and self._never_healthy:
            self._warn_if_never_healthy(check)
        if self._failures != self._settings.failures:
            return  # not yet, or already told: the verdict changes once per run of failures
        was, self._healthy = self._healthy, False
        self._log.warning(
            "app_unhealthy",
            url=self._settings.url,
            failures=self._failures,
            result=check.result.value,
            detail=check.detail,
            was="never healthy" if was is None else "healthy",
        )
        self._apply()

    def _warn_if_never_healthy(self, check: Check) -> None:
        """Once, after NEVER_HEALTHY_WARN_S without a success: this replica will not lead until
        its app answers, and in exec mode a URL only the command serves never will."""
        if self._warned_never_healthy or self._clock() - self._started_at < NEVER_HEALTHY_WARN_S:
            return
        self._warned_never_healthy = True
        hint = "this replica does not contend until the app answers 2xx"
        if self._exec_mode:
            hint += (
                "; in exec mode the URL is checked on followers too, so it must be served by something "
                "that runs on every replica, not by the command itself (which runs only on the leader)"
            )
        self._log.warning(
            "app_health_never_healthy",
            url=self._settings.url,
            waited_s=round(self._clock() - self._started_at),
            result=check.result.value,
            detail=check.detail,
            hint=hint,
        )

    def _apply(self) -> None:
        """Open or close the gate; hand over each term the app's health ends (once it is old
        enough: hysteresis), and come back when a younger one will be."""
        healthy = self.healthy
        for election in self._elections.values():
            election.gate_contending(may_contend=healthy)
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        if healthy:
            return
        now = self._clock()
        next_due: float | None = None
        for lock, election in self._elections.items():
            if election.status().state is not State.LEADER:
                continue
            since = self._led_since.get(lock, now)
            due = since + self._settings.min_term_s
            if now >= due:
                self._log.warning(
                    "app_unhealthy_handover",
                    lock=lock,
                    led_ms=round((now - since) * 1000),
                    detail="the app failed its health checks: stopping leader work and releasing",
                )
                election.resign(stand_back_s=0.0, reason=StepDownReason.APP_UNHEALTHY)
            else:
                next_due = due if next_due is None else min(next_due, due)
        if next_due is not None:
            delay_s = next_due - now
            self._log.info(
                "app_unhealthy_handover_deferred",
                wait_ms=round(delay_s * 1000),
                detail="a term hands over for its app's health only after --app-health-min-term",
            )
            self._deferred = asyncio.get_running_loop().call_later(delay_s, self._apply)

    def close(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None


class AppHealthCollector:
    """`elector_app_healthy` and `elector_app_health_checks_total`, read at scrape time."""

    def __init__(self, gate: AppHealthGate, *, locks: Sequence[str] | None) -> None:
        """`locks`: label the gauge with each lock (as every per-lock series is); None: one
        series without the label (aggregate metrics)."""
        self._gate = gate
        self._locks = None if locks is None else tuple(locks)

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        healthy = 1.0 if self._gate.healthy else 0.0
        gauge = GaugeMetricFamily(
            "elector_app_healthy",
            "1 while this replica's app passes its --app-health-url checks, else 0 (also before "
            "its first success): a replica whose app is not healthy does not contend. 0 on every "
            "replica of a lock means no leader, by design.",
            labels=None if self._locks is None else ["lock"],
        )
        if self._locks is None:
            gauge.add_metric([], healthy)
        else:
            for lock in self._locks:
                gauge.add_metric([lock], healthy)
        yield gauge
        checks = CounterMetricFamily(
            "elector_app_health_checks",
            "Checks of --app-health-url by result: ok, status (not 2xx), timeout, refused, bad_answer.",
            labels=["result"],
        )
        for result, count in list(self._gate.checks.items()):
            checks.add_metric([result.value], float(count))
        yield checks
