"""The HTTP endpoints: liveness, readiness, leadership and metrics.

Probes read a fresh `ElectionStatus` snapshot on every request; nothing here keeps state of its
own. Liveness only asks whether the election loop is still turning (a Redis outage must not get
the pod restarted); readiness asks whether Redis answered recently; `/leader` tells the role,
for Services that route to the leader only.

The routes and answers are `HttpApp`; the protocol is h11's (python-hyper's HTTP/1.1 state
machine, which does all the parsing) on asyncio streams, in `elector.daemon.http_server`. Four
GET routes need no web framework, and a framework (aiohttp) costs the daemon many times h11's
idle memory.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import time
import zlib
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from elector.daemon.http_server import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    MAX_HEAD_BYTES,
    HttpBindError,
    HttpServer,
    HttpSettings,
    HttpStats,
    Request,
    Response,
    text_response,
)
from elector.election.outcome import ElectionStatus

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "MAX_HEAD_BYTES",
    "HttpApp",
    "HttpBindError",
    "HttpServer",
    "HttpSettings",
    "HttpStats",
    "HttpStatsCollector",
    "Request",
    "Response",
    "json_response",
    "make_http_app",
    "metrics_handler",
    "parse_http_address",
]

StatusProvider = Callable[[], ElectionStatus]

_ADDRESS_EXAMPLE = "expected HOST:PORT, e.g. 0.0.0.0:8080, :8080 or [::]:8080"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#: A DNS name or dotted IPv4 address; anything else cannot be listened on anyway.
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_MAX_PORT = 65535


def parse_http_address(text: str) -> HttpSettings:
    """Parse `HOST:PORT` (`:PORT` listens on all IPv4 interfaces, `[::]:PORT` on IPv6)."""
    value = text.strip()
    if not value:
        raise ValueError(f"empty HTTP address; {_ADDRESS_EXAMPLE}")
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"HTTP address {text!r} has no port; {_ADDRESS_EXAMPLE}")
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"HTTP address {text!r} has a non-numeric port {port_text!r}; {_ADDRESS_EXAMPLE}")
    port = int(port_text)
    if port > _MAX_PORT:
        raise ValueError(f"HTTP address {text!r} has port {port} out of range 0..{_MAX_PORT}")
    return HttpSettings(host=_parse_host(host, text=text), port=port)


def _parse_host(host: str, *, text: str) -> str:
    if not host:
        return "0.0.0.0"
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise ValueError(f"HTTP address {text!r} has an invalid IPv6 host; {_ADDRESS_EXAMPLE}") from None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            pass  # not an address at all (a URL?): reported as an invalid host below
        else:
            raise ValueError(f"HTTP address {text!r}: put an IPv6 host in brackets; {_ADDRESS_EXAMPLE}")
    if len(host) > 253 or not _HOSTNAME.fullmatch(host):
        raise ValueError(f"HTTP address {text!r} has an invalid host {host!r}; {_ADDRESS_EXAMPLE}")
    return host


Handler = Callable[[Request], Awaitable[Response]]
#: Every route answers GET, and HEAD as GET without the body.
_METHODS = ("GET", "HEAD")
_ALLOW = ", ".join(_METHODS)
#: Content codings /metrics offers, by preference: zlib window bits of each (31: gzip framing).
_CODINGS = {"gzip": 31, "deflate": 15}


def json_response(body: Mapping[str, object], *, status: int = 200) -> Response:
    # Probe answers describe this instant; a cache in between must never replay them.
    headers = (("Content-Type", "application/json; charset=utf-8"), ("Cache-Control", "no-store"))
    return Response(status, json.dumps(body).encode(), headers)


def _fail(reason: str) -> Response:
    return json_response({"status": "fail", "reason": reason}, status=503)


class HttpApp:
    """GET (and HEAD) routes by exact path: 404 for other paths, 405 with Allow for other methods,
    and 503 (not 500, which a prober may read as a crash) when a handler fails."""

    def __init__(
        self,
        routes: Mapping[str, Handler],
        *,
        immediate: Collection[str] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        """`immediate`: the paths whose handlers never await anything (they answer from a
        snapshot): `answer_now` answers them, and the server may do so in its accept turn."""
        self._routes = dict(routes)
        if unknown := set(immediate) - self._routes.keys():
            raise ValueError(f"immediate paths without a route: {sorted(unknown)}")
        self._immediate = frozenset(immediate)
        self._log = logging.getLogger("elector.http") if logger is None else logger

    async def __call__(self, request: Request) -> Response:
        handler = self._routes.get(request.path)
        if handler is None:
            return text_response(404, "404: Not Found")
        if request.method not in _METHODS:
            return text_response(405, "405: Method Not Allowed", headers=(("Allow", _ALLOW),))
        try:
            return await handler(request)
        except Exception:
            self._log.exception("http_handler_failed", extra={"path": request.path, "method": request.method})
            return _internal_error()

    def answer_now(self, request: Request) -> Response | None:
        """The answer, when it needs no waiting: an immediate route's (its handler driven to its
        end at once), 404 or 405; None for the other routes (the server awaits `__call__`)."""
        handler = self._routes.get(request.path)
        if handler is not None and request.method in _METHODS and request.path not in self._immediate:
            return None
        pending = self(request)
        try:
            pending.send(None)
        except StopIteration as done:
            answer: Response = done.value
            return answer
        # A handler declared immediate awaited something: it is not, and its answer is lost.
        pending.close()
        self._log.error("http_handler_not_immediate", extra={"path": request.path})
        return _internal_error()


def _internal_error() -> Response:
    return json_response({"status": "error", "reason": "internal error; see the daemon's logs"}, status=503)


def make_http_app(
    *,
    status: StatusProvider | Sequence[StatusProvider],
    registry: CollectorRegistry,
    liveness_grace_s: float,
    readiness_window_s: float,
    logger: logging.Logger | None = None,
) -> HttpApp:
    """The application serving /healthz, /readyz, /leader and /metrics.

    `liveness_grace_s`: how far past `cycle_due_by` the loop may be before liveness fails.
    `readiness_window_s`: how old the last successful Redis exchange may be while ready.
    With several locks (one status provider each), liveness and readiness need every election
    to pass, and `/leader` needs `?lock=NAME`.
    """
    providers = [status] if callable(status) else list(status)
    if not providers:
        raise ValueError("make_http_app needs at least one status provider")

    def named(snapshot: ElectionStatus, reason: str) -> str:
        return reason if len(providers) == 1 else f"lock {snapshot.lock!r}: {reason}"

    async def healthz(request: Request) -> Response:
        for provider in providers:
            snapshot = provider()
            if not snapshot.started:
                return _fail(named(snapshot, "the election loop has not started"))
            due_by = snapshot.cycle_due_by
            if due_by is not None and snapshot.now > due_by + liveness_grace_s:
                overdue = snapshot.now - due_by
                return _fail(
                    named(snapshot, f"the election loop is stuck: its cycle is {overdue:.1f}s overdue")
                )
        return json_response({"status": "ok"})

    async def readyz(request: Request) -> Response:
        for provider in providers:
            snapshot = provider()
            if not snapshot.started:
                return _fail(named(snapshot, "the election loop has not started"))
            last_ok = snapshot.last_backend_ok_at
            if last_ok is None:
                return _fail(named(snapshot, "no successful Redis exchange yet"))
            age_s = snapshot.now - last_ok
            if age_s > readiness_window_s:
                return _fail(named(snapshot, f"no successful Redis exchange for {age_s:.1f}s"))
        return json_response({"status": "ok"})

    by_lock: dict[str, StatusProvider] = {}

    async def leader(request: Request) -> Response:
        if not by_lock:
            by_lock.update((provider().lock, provider) for provider in providers)
        asked = request.query.get("lock", [])
        if not asked:
            if len(providers) > 1:
                reason = f"this daemon holds {len(providers)} locks: ask /leader?lock=NAME"
                return json_response({"status": "error", "reason": reason}, status=400)
            asked = [next(iter(by_lock))]
        unknown = [name for name in asked if name not in by_lock]
        if unknown:
            return json_response({"status": "error", "reason": f"unknown lock {unknown[0]!r}"}, status=404)
        snapshots = [by_lock[name]() for name in dict.fromkeys(asked)]
        leading = all(snapshot.is_leader for snapshot in snapshots)
        if len(snapshots) == 1:
            return json_response(_leader_body(snapshots[0]), status=200 if leading else 503)
        body = {"is_leader": leading, "locks": [_leader_body(snapshot) for snapshot in snapshots]}
        return json_response(body, status=200 if leading else 503)

    routes = {
        "/healthz": healthz,
        "/readyz": readyz,
        "/leader": leader,
        "/metrics": metrics_handler(registry),
    }
    return HttpApp(routes, immediate=("/healthz", "/readyz", "/leader"), logger=logger)


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """/metrics, rendered (and compressed, when the scraper offers gzip) in a worker thread of the
    serving loop, one scrape at a time; scrapes that waited for a render share it.

    With many locks the exposition has tens of series per lock and takes long to render; in the
    serving loop's own thread it would hold up the probes for that long. The daemon
    serves from its HTTP thread (`elector.daemon.http_thread`), whose worker this is: neither
    the election's loop nor its threads ever render. The lock keeps a scanner from starting many
    renders; a scrape that arrived while one ran waits for the next, and those waiting together
    share it (one body in memory, however many clients are slow to take it).
    """
    one_at_a_time = asyncio.Lock()
    #: The last render: its (content type, coding), when it began (monotonic), and its body.
    latest: list[tuple[tuple[str, str | None], float, bytes]] = []

    async def metrics(request: Request) -> Response:
        asked_at = time.monotonic()
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        coding = _content_coding(request.headers.get("accept-encoding", ""))
        key = (content_type, coding)

        def render() -> bytes:
            body = encoder(registry)
            if coding is None:
                return body
            compressor = zlib.compressobj(6, zlib.DEFLATED, _CODINGS[coding])
            return compressor.compress(body) + compressor.flush()

        async with one_at_a_time:
            if latest and latest[0][0] == key and latest[0][1] >= asked_at:
                body = latest[0][2]  # begun after this scrape arrived: as fresh as its own
            else:
                latest.clear()
                began = time.monotonic()
                body = await asyncio.to_thread(render)
                latest.append((key, began, body))
        headers = [("Content-Type", content_type), ("Vary", "Accept-Encoding")]
        if coding is not None:
            headers.append(("Content-Encoding", coding))
        return Response(200, body, tuple(headers))

    return metrics


class HttpStatsCollector:
    """The HTTP connection budget's figures (`HttpStats`) as metrics, read at scrape time."""

    def __init__(self, stats: HttpStats) -> None:
        self._stats = stats

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        yield GaugeMetricFamily(
            "elector_http_connections", "HTTP connections open now (probes, scrapes).", value=stats.open
        )
        yield GaugeMetricFamily(
            "elector_http_connections_peak",
            "The most HTTP connections open at once since the start; never above the connection cap.",
            value=stats.peak,
        )
        yield CounterMetricFamily(
            "elector_http_connections_shed",
            "HTTP connections cut at the connection cap to make room for a new one (the one "
            "waiting longest on its client).",
            value=stats.shed,
        )
        yield CounterMetricFamily(
            "elector_http_connections_deferred",
            "New HTTP connections left waiting for a slot at the connection cap (every "
            "open one was being answered or too fresh to cut).",
            value=stats.deferred,
        )


def _content_coding(accept_encoding: str) -> str | None:
    """gzip or deflate when the client accepts it (q > 0), else None (identity)."""
    accepted = set()
    for item in accept_encoding.lower().split(","):
        coding, _, params = item.partition(";")
        quality = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
        try:
            if float(quality) <= 0:
                continue
        except ValueError:
            continue  # a garbled preference: not an acceptance
        accepted.add(coding.strip())
    return next((coding for coding in _CODINGS if coding in accepted), None)


def _leader_body(snapshot: ElectionStatus) -> dict[str, object]:
    holder = snapshot.holder
    remaining = snapshot.lease_remaining_s
    return {
        "lock": snapshot.lock,
        "identity": snapshot.identity,
        "is_leader": snapshot.is_leader,
        "holder": None if holder is None else holder.identity,
        "holder_fencing_token": None if holder is None else holder.fencing_token,
        "fencing_token": snapshot.fencing_token if snapshot.is_leader else None,
        "lease_remaining_ms": None if remaining is None else max(0, round(remaining * 1000)),
        "state": snapshot.state.value,
    }
